#!/usr/bin/env bash
# Runs a command in a network namespace, with the API server of up.sh reachable inside it at
# the same address as on the host (https://127.0.0.1:$APISERVER_PORT), so the kubeconfigs
# that up.sh prints work there unchanged. A namespace has a loopback of its own, so the port
# is relayed with socat through a Unix socket (a path on the file system, which every network
# namespace sees). Ctrl-C or SIGTERM stops the command and the relay; a namespace this script
# created is deleted.
#
#   tests/cluster/in-netns.sh NAMESPACE COMMAND [ARG...]
#   e.g. tests/cluster/in-netns.sh kp target/k8s/v1.37.2/bin/kube-proxy \
#          --kubeconfig "$KUBE_PROXY_KUBECONFIG" --proxy-mode nftables --hostname-override node-a \
#          --conntrack-max-per-core 0
set -euo pipefail

ns=${1:?usage: in-netns.sh NAMESPACE COMMAND [ARG...]}; shift
[[ $# -gt 0 ]] || { echo "usage: in-netns.sh NAMESPACE COMMAND [ARG...]" >&2; exit 2; }
APISERVER_PORT=${APISERVER_PORT:-6443}
[[ $(id -u) == 0 ]] || { echo "in-netns.sh: run as root" >&2; exit 1; }
command -v socat >/dev/null || { echo "in-netns.sh: needs socat (apt-get install socat)" >&2; exit 1; }

created=0
pids=()
sock=$(mktemp -u "/tmp/switchyard-apiserver-$ns.XXXXXX.sock")
cleanup() {
  local rc=$? p
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -f "$sock"
  if [[ $created == 1 ]]; then ip netns delete "$ns" 2>/dev/null || true; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ! -e /run/netns/$ns ]]; then
  ip netns add "$ns"
  created=1
fi
ip -n "$ns" link set lo up

socat "UNIX-LISTEN:$sock,fork,mode=600" "TCP:127.0.0.1:$APISERVER_PORT" &
pids+=($!)
ip netns exec "$ns" socat "TCP-LISTEN:$APISERVER_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$sock" &
pids+=($!)
for _ in $(seq 1 50); do
  [[ -S $sock ]] && ip netns exec "$ns" ss -Hltn "sport = :$APISERVER_PORT" | grep -q . && break
  sleep 0.1
done

ip netns exec "$ns" "$@" &
pids+=($!)
set +e
wait "${pids[-1]}"
exit $?
