#!/usr/bin/env bash
# The README's demo: runs the agent on the bundled example cluster (examples/cluster.yaml, with
# examples/kube-proxy-config.yaml) in a throwaway network namespace, sy-demo, so that this
# machine's own rules are untouched. Run as root on Debian. It installs what it needs when it is
# missing (nftables and iproute2; gcc and libc6-dev if there is no C compiler to link with),
# builds (debug), creates sy-demo unless it exists, and runs `switchyard run` there until
# Ctrl-C. The agent's rules stay in the namespace; `ip netns del sy-demo` removes everything.
# The Rust toolchain (1.89 or newer, https://rustup.rs) must already be there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "examples/demo.sh: no cargo on PATH; install Rust 1.89 or newer first (https://rustup.rs)" >&2
  exit 1
fi

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cargo build -q
[ -e /run/netns/sy-demo ] || ip netns add sy-demo
ip -n sy-demo link set lo up
exec ip netns exec sy-demo "${CARGO_TARGET_DIR:-target}/debug/switchyard" run \
  --config examples/kube-proxy-config.yaml --manifests examples/cluster.yaml
