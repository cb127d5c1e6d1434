#!/usr/bin/env bash
# Builds the container images the one-node e2e cluster runs, as OCI archives in
# target/k8s/<version>/images/, under the exact names the release asks for (nothing can be
# pulled here):
#   registry.k8s.io/pause:3.10.2                      the Pod sandbox (kubernetes' build/pause/linux/pause.c)
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1    the only image the Services specs run
#                                                     (test/utils/image/manifest.go)
#   registry.k8s.io/coredns/coredns:v1.14.6           cluster DNS, the release's CoreDNS
#                                                     (build/dependencies.yaml)
# agnhost's own image is Alpine with busybox, curl, netcat-openbsd, bind-tools and iproute2
# (test/images/agnhost/Dockerfile); the specs run `sh -c` lines with nc -t/-u, curl, wget,
# nslookup, seq and ss in it. Here the same tools come from this Debian machine: dash as
# /bin/sh (busybox's own sh runs its applets before PATH, which would put busybox's nc in
# place of OpenBSD's), busybox for the small ones, and nc.openbsd, curl, GNU wget, nslookup and
# ss with the shared libraries they load. GNU wget because Debian's static busybox 1.35 wget
# dies of a segmentation fault when given -T (a timeout), which the "up and down services"
# spec passes (`wget -q -O - -T 1`); busybox's output in its place failed that spec.
#
#   tests/e2e/images.sh        prints the archives' paths; an archive newer than its inputs is kept
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
K8S_VERSION=v1.37.2
bin=$root/target/k8s/$K8S_VERSION/bin
out=$root/target/k8s/$K8S_VERSION/images
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.66.1
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.14.6

for tool in gcc busybox dash nc.openbsd curl wget nslookup ss ldd; do
  command -v $tool >/dev/null ||
    { echo "images.sh: needs $tool (tests/install-deps.sh installs it)" >&2; exit 1; }
done
"$root/tests/cluster/build.sh" agnhost coredns >&2
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fresh ARCHIVE INPUT...: true when ARCHIVE exists and is newer than every INPUT.
fresh() {
  local archive=$1 f; shift
  [[ -s $archive ]] || return 1
  for f in "$@"; do [[ $archive -nt $f ]] || return 1; done
}

# with_libraries ROOTFS BINARY...: copies each binary's shared libraries and loader (ldd).
with_libraries() {
  local rootfs=$1 binary lib; shift
  for binary in "$@"; do
    for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
      cp -L --parents "$lib" "$rootfs/"
    done
  done
}

# pause: static, as its Makefile builds it (CFLAGS), user 65535 as its Dockerfile sets.
pause_src=$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
if ! fresh "$out/pause.tar" "$pause_src" "$here/oci-image.sh" "$0"; then
  mkdir -p "$work/pause"
  gcc -Os -Wall -Werror -static -DVERSION=v3.10.2-0 -o "$work/pause/pause" "$pause_src"
  OCI_USER=65535:65535 "$here/oci-image.sh" "$work/pause" "$PAUSE_IMAGE" "$out/pause.tar" '["/pause"]'
fi

if ! fresh "$out/agnhost.tar" "$bin/agnhost" "$here/oci-image.sh" "$0"; then
  r=$work/agnhost
  mkdir -p "$r/bin" "$r/usr/bin" "$r/etc" "$r/tmp" "$r/uploads"
  chmod 1777 "$r/tmp"
  cp "$bin/agnhost" "$r/agnhost"
  ln -s agnhost "$r/agnhost-2"
  cp "$(command -v busybox)" "$r/bin/busybox"
  for applet in $(busybox --list); do
    [[ -e $r/bin/$applet ]] || ln -s busybox "$r/bin/$applet"
  done
  rm -f "$r/bin/sh"
  cp "$(command -v dash)" "$r/bin/sh"
  cp "$(command -v nc.openbsd)" "$r/usr/bin/nc"
  for tool in curl wget nslookup ss; do cp "$(command -v $tool)" "$r/usr/bin/$tool"; done
  with_libraries "$r" "$r/bin/sh" "$r/usr/bin/nc" "$r/usr/bin/curl" "$r/usr/bin/wget" \
    "$r/usr/bin/nslookup" "$r/usr/bin/ss"
  # The users the Dockerfile adds (some specs run as them).
  printf 'root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:50000::/home:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\ngroup-defined-in-image:x:50000:\nnogroup:x:65534:\n' >"$r/etc/group"
  "$here/oci-image.sh" "$r" "$AGNHOST_IMAGE" "$out/agnhost.tar" '["/agnhost"]' '["pause"]'
fi

if ! fresh "$out/coredns.tar" "$bin/coredns" "$here/oci-image.sh" "$0"; then
  mkdir -p "$work/coredns"
  cp "$bin/coredns" "$work/coredns/coredns"
  "$here/oci-image.sh" "$work/coredns" "$COREDNS_IMAGE" "$out/coredns.tar" '["/coredns"]'
fi

echo "$out/pause.tar"
echo "$out/agnhost.tar"
echo "$out/coredns.tar"
