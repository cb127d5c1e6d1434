#!/usr/bin/env bash
# Runs Kubernetes' own end-to-end specs for Services (test/e2e of the pinned release) against
# the one-node cluster of tests/e2e/node.sh, with Switchyard or the real kube-proxy as its
# proxy, and ends with ginkgo's summary line. Exit status: the suite's.
#
#   tests/e2e/run.sh [--focus REGEX] [--skip REGEX] [--proxy switchyard|kube-proxy]
#                    [--mode nftables|iptables|ipvs]
#
# The default focus is every [Conformance] spec of `[sig-network] Services` (all 15 run on one
# node); `--focus '\[sig-network\] Services '` runs the whole Services suite (the trailing space
# keeps out "Service CIDRs" and "Service endpoints latency"), where specs that need two or
# three nodes skip themselves. The default skip is what a one-node cluster without a cloud
# cannot run: [Disruptive] (restarts the proxy or API server as Pods), [Serial] (SCTP, which
# needs the host's sctp module), [Feature:LoadBalancer].
# Logs of every component and ginkgo's JUnit report go to target/e2e/<proxy>-<mode>/.
# Settings (environment): SWITCHYARD (the binary; default target/debug/switchyard, built here
# when missing), E2E_TIMEOUT (ginkgo's --timeout, default 60m).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
K8S_VERSION=v1.37.2
bin=$root/target/k8s/$K8S_VERSION/bin

focus='\[sig-network\] Services .*\[Conformance\]'
skip='\[Disruptive\]|\[Serial\]|\[Feature:LoadBalancer\]'
proxy=switchyard
mode=nftables
while [[ $# -gt 0 ]]; do
  case $1 in
    --focus) focus=${2:?--focus needs a regular expression}; shift 2 ;;
    --focus=*) focus=${1#*=}; shift ;;
    --skip) skip=${2?--skip needs a regular expression}; shift 2 ;;
    --skip=*) skip=${1#*=}; shift ;;
    --proxy) proxy=${2:?--proxy needs switchyard or kube-proxy}; shift 2 ;;
    --proxy=*) proxy=${1#*=}; shift ;;
    --mode) mode=${2:?--mode needs nftables, iptables or ipvs}; shift 2 ;;
    --mode=*) mode=${1#*=}; shift ;;
    *) echo "run.sh: unknown argument '$1' (--focus, --skip, --proxy, --mode)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "run.sh: run as root" >&2; exit 1; }

export SWITCHYARD=${SWITCHYARD:-$root/target/debug/switchyard}
if [[ $proxy == switchyard && ! -x $SWITCHYARD ]]; then
  (cd "$root" && cargo build --locked --bin switchyard)
fi
"$root/tests/cluster/build.sh" e2e.test kubectl >&2

out=$root/target/e2e/$proxy-$mode
rm -rf "$out"
mkdir -p "$out"
node_log=$out/node.sh.log

node_pid=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $node_pid ]]; then
    kill -TERM "$node_pid" 2>/dev/null || true
    wait "$node_pid" 2>/dev/null || true
  fi
  # ginkgo's summary last, after the node's own shutdown messages.
  [[ -s $out/e2e.log ]] && grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!)' "$out/e2e.log" || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

SAVE_LOGS=$out/logs "$here/node.sh" --proxy "$proxy" --mode "$mode" >"$node_log" 2>&1 &
node_pid=$!
deadline=$((SECONDS + 900))
until grep -qx READY "$node_log"; do
  if ! kill -0 "$node_pid" 2>/dev/null; then
    echo "run.sh: the node did not come up; its output:" >&2
    tail -n 40 "$node_log" >&2
    exit 1
  fi
  ((SECONDS < deadline)) || { echo "run.sh: the node not up after 900 s; see $node_log" >&2; exit 1; }
  sleep 1
done
kubeconfig=$(sed -n 's/^KUBECONFIG=//p' "$node_log")
netns=$(sed -n 's/^NODE_NETNS=//p' "$node_log")
echo "run.sh: node up ($proxy, $mode); running e2e.test, focus '$focus', skip '$skip'" >&2

set +e
nsenter --net="/run/netns/$netns" "$bin/e2e.test" \
  --kubeconfig="$kubeconfig" \
  --provider=skeleton \
  --kubectl-path="$bin/kubectl" \
  --dump-logs-on-failure=false \
  --report-dir="$out" \
  --ginkgo.focus="$focus" \
  --ginkgo.skip="$skip" \
  --ginkgo.timeout="${E2E_TIMEOUT:-60m}" \
  --ginkgo.no-color \
  --ginkgo.v >"$out/e2e.log" 2>&1
rc=$?
set -e
grep -E '^\s*\[(FAIL|PANICKED|TIMEDOUT)\]' "$out/e2e.log" | sort -u >&2 || true
echo "run.sh: e2e.test exited $rc; its log: $out/e2e.log" >&2
exit "$rc"
