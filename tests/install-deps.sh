#!/usr/bin/env bash
# Installs what the whole test suite (`cargo nextest run --workspace`) needs on a Debian 12
# machine, as root; .ci/run calls it first. Each part is checked before it is installed, so on
# a machine that has everything this only looks (a second or two) and changes nothing:
# - Debian packages: nftables, iptables, iproute2, conntrack, ipset and procps (sysctl) for the
#   network-namespace tests; prometheus for the agent's scrape test; qemu-system-x86,
#   busybox-static and kmod to boot the IPVS guest; python3 and python3-pip for the Helm
#   library; gcc and libc6-dev when there is no C compiler to link with; for the one-node
#   e2e cluster (tests/e2e): containerd, runc, containernetworking-plugins, and the tools its
#   test image carries (netcat-openbsd, bind9-dnsutils for nslookup, dash, wget, busybox-static);
# - Debian's 6.1 kernel for the IPVS guest (tests/guest/prepare-kernel.sh, into
#   target/guest-kernel);
# - cargo-nextest (cargo install);
# - the Helm library, helm-python-sdk (Helm v4's Go SDK behind a C ABI), for the chart tests;
# - the real Kubernetes v1.37.2 components (kube-proxy, the control plane, etcd; for the e2e
#   suite also kubelet, kube-scheduler, agnhost, CoreDNS and the e2e.test binary), built from
#   their Go modules by tests/cluster/build.sh into target/k8s/ (socat, openssl and curl for
#   the control plane it starts), and the e2e cluster's images (tests/e2e/images.sh), when a
#   Go toolchain is on PATH.
# The Rust toolchain itself (1.89 or newer, https://rustup.rs) must already be there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "tests/install-deps.sh: no cargo on PATH; install Rust 1.89 or newer first (https://rustup.rs)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
need=()
# package:command, the package installed when the command is missing.
for pkg_cmd in nftables:nft iptables:iptables iproute2:ip conntrack:conntrack ipset:ipset \
  procps:sysctl prometheus:prometheus qemu-system-x86:qemu-system-x86_64 kmod:depmod \
  python3:python3 socat:socat openssl:openssl curl:curl containerd:containerd runc:runc \
  netcat-openbsd:nc.openbsd bind9-dnsutils:nslookup dash:dash wget:wget make:make; do
  command -v "${pkg_cmd#*:}" >/dev/null 2>&1 || need+=("${pkg_cmd%%:*}")
done
# The guest's initramfs needs a statically linked /bin/busybox.
(ldd /bin/busybox 2>&1 || true) | grep -q 'not a dynamic' || need+=(busybox-static)
# The CNI plugins kubelet's Pods are wired with.
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
# cargo links through cc; rustup does not bring one; the pause image is C, and so is
# jemalloc, the agent's allocator (built with make).
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
# pip for the Helm library below (not needed once the library is importable).
if ! python3 -c 'import helm_python' 2>/dev/null && ! python3 -m pip --version >/dev/null 2>&1; then
  need+=(python3-pip)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

tests/guest/prepare-kernel.sh

command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest

# The real Helm library for the chart tests. Debian's own python3 marks its site-packages as
# externally managed; this machine is a test machine, so install into it anyway.
if ! python3 -c 'import helm_python' 2>/dev/null; then
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
    helm-python-sdk==0.2.2
fi

# The real Kubernetes components, cached in target/k8s/ (about 22 minutes on 2 cores the
# first time, nothing once built). Without Go the tests that need them are skipped, which
# SWITCHYARD_REQUIRE_CLUSTER=1 (set by .ci/run) turns into a failure.
[ -x /usr/local/go/bin/go ] && ! command -v go >/dev/null 2>&1 && export PATH="$PATH:/usr/local/go/bin"
if command -v go >/dev/null 2>&1; then
  tests/cluster/build.sh
  tests/cluster/build.sh kubelet kube-scheduler agnhost coredns e2e.test
  tests/e2e/images.sh >/dev/null
else
  echo "tests/install-deps.sh: no Go toolchain; the real Kubernetes components are not built" >&2
fi
