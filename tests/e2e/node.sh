#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster of the pinned release in a network namespace of its own,
# with Switchyard (or the real kube-proxy) as the node's proxy: the control plane of
# tests/cluster/up.sh plus kube-scheduler, containerd and runc (Debian's), the standard CNI
# bridge plugin, kubelet, and CoreDNS as a Pod. Runs in the foreground as root; Ctrl-C (or
# SIGTERM) stops every process and Pod it started and removes its namespace and state folder.
#
#   tests/e2e/node.sh [--proxy switchyard|kube-proxy] [--mode nftables|iptables|ipvs]
#
# When every node component is ready and CoreDNS is too (its readiness needs the API server,
# which it reaches through the proxy at the kubernetes Service's ClusterIP), it prints:
#   KUBECONFIG=<dir>/admin.kubeconfig
#   NODE_NETNS=<namespace>        (run clients in it: nsenter --net=/run/netns/<namespace>)
#   CLUSTER_DIR=<dir>
#   READY
# Settings (environment): SWITCHYARD (the binary; default target/debug/switchyard),
# KEEP=1 (keep the state folder), SAVE_LOGS=<folder> (copy every component's log there on
# exit), VERBOSITY (-v of the Kubernetes components, default 1).
#
# Why a network namespace: the node's proxy programs nftables, iptables or IPVS, and the
# cluster's ports (6443, 10250, NodePorts) are the node's own; in a namespace none of it touches
# this machine's network or the tests running beside it. Everything enters it with nsenter
# --net, not `ip netns exec`: the latter also remounts /sys, which hides the cgroup file
# systems kubelet and runc need. This host has cgroup v1 only, which kubelet 1.37 refuses
# unless failCgroupV1 is false (pkg/kubelet/apis/config/validation/validation_linux.go).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
K8S_VERSION=v1.37.2
bin=$root/target/k8s/$K8S_VERSION/bin

proxy=switchyard
mode=nftables
while [[ $# -gt 0 ]]; do
  case $1 in
    --proxy) proxy=${2:?--proxy needs switchyard or kube-proxy}; shift 2 ;;
    --proxy=*) proxy=${1#*=}; shift ;;
    --mode) mode=${2:?--mode needs nftables, iptables or ipvs}; shift 2 ;;
    --mode=*) mode=${1#*=}; shift ;;
    *) echo "node.sh: unknown argument '$1' (--proxy switchyard|kube-proxy, --mode nftables|iptables|ipvs)" >&2; exit 2 ;;
  esac
done
case $proxy in switchyard|kube-proxy) ;; *) echo "node.sh: --proxy must be switchyard or kube-proxy, not '$proxy'" >&2; exit 2 ;; esac
case $mode in nftables|iptables|ipvs) ;; *) echo "node.sh: --mode must be nftables, iptables or ipvs, not '$mode'" >&2; exit 2 ;; esac

SWITCHYARD=${SWITCHYARD:-$root/target/debug/switchyard}
VERBOSITY=${VERBOSITY:-1}
NODE_NAME=e2e-node
# The node's address, on a dummy interface in the namespace, and the Pods' and Services' ranges.
NODE_IP=10.237.0.2
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10

[[ $(id -u) == 0 ]] || { echo "node.sh: run as root" >&2; exit 1; }
for tool in containerd containerd-shim-runc-v2 runc ctr nsenter ip curl; do
  command -v $tool >/dev/null || { echo "node.sh: needs $tool (tests/install-deps.sh installs it)" >&2; exit 1; }
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
  { echo "node.sh: needs the CNI plugins in /usr/lib/cni (containernetworking-plugins)" >&2; exit 1; }
"$root/tests/cluster/build.sh" etcd kube-apiserver kube-controller-manager kube-proxy kubectl \
  kube-scheduler kubelet >&2
mapfile -t images < <("$here/images.sh")
if [[ $proxy == switchyard && ! -x $SWITCHYARD ]]; then
  echo "node.sh: $SWITCHYARD missing (cargo build, or set SWITCHYARD)" >&2; exit 1
fi
if [[ -d /sys/fs/cgroup/memory/kubepods || -d /sys/fs/cgroup/kubepods ]]; then
  echo "node.sh: /sys/fs/cgroup/*/kubepods exists: another kubelet runs on this machine (or one was killed; remove those cgroups)" >&2
  exit 1
fi

dir=$(mktemp -d /tmp/switchyard-e2e.XXXXXX)
chmod 755 "$dir"
ns=switchyard-e2e-$$
logs=$dir/logs
mkdir -p "$logs"
netns_before=$(ls /run/netns 2>/dev/null || true)

pids=()
names=()
cleaning=0
in_ns=(nsenter --net="/run/netns/$ns")
ctr_k8s() { ctr --address "$dir/containerd.sock" --namespace k8s.io "$@"; }
cleanup() {
  local rc=$? i n id
  [[ $cleaning == 1 ]] && return
  cleaning=1
  trap '' INT TERM
  trap - EXIT
  # Best effort from here: one step failing must not leave the rest behind.
  set +e
  # Every component but containerd first (the control plane is the first entry), then every
  # container still running, then containerd.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    [[ ${names[$i]} == containerd ]] && continue
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    [[ ${names[$i]} == containerd ]] && continue
    n=0
    while kill -0 "${pids[$i]}" 2>/dev/null && ((n < 100)); do sleep 0.1; n=$((n + 1)); done
    kill -KILL "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  if [[ -S $dir/containerd.sock ]]; then
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
      ctr_k8s tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks rm -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_k8s containers ls -q 2>/dev/null); do ctr_k8s containers rm "$id" >/dev/null 2>&1 || true; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    [[ ${names[$i]} == containerd ]] || continue
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  # Shims outlive containerd by design; ours are the ones whose address is in our folder.
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $dir/" 2>/dev/null || true
  # Pod sandboxes' network namespaces that appeared while we ran, then the node's own.
  for n in $(ls /run/netns 2>/dev/null); do
    [[ $n == cni-* ]] || continue
    grep -qx "$n" <<<"$netns_before" || ip netns delete "$n" 2>/dev/null || true
  done
  ip netns delete "$ns" 2>/dev/null || true
  # Mounts under the state folder (container root file systems, volumes), deepest first.
  findmnt -rn -o TARGET | grep "^$dir/" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  # kubelet's cgroups (empty now), deepest first.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} \; 2>/dev/null || true
  if [[ -n ${SAVE_LOGS:-} ]]; then
    mkdir -p "$SAVE_LOGS"
    cp -r "$logs/." "$SAVE_LOGS/" 2>/dev/null || true
    cp -r "$dir/cluster/logs/." "$SAVE_LOGS/" 2>/dev/null || true
  fi
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "node.sh: stopped; state kept in $dir" >&2
  else
    rm -rf "$dir"
    echo "node.sh: stopped; removed $dir" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

me=node.sh
# start and wait_for.
source "$root/tests/cluster/procs.sh"

# ---- the node's network namespace: loopback, and the node address on a veth whose peer stays
# in the namespace (this kernel has no dummy interfaces), with the default route (a Service
# address must be routable before the proxy's DNAT applies) ----
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add eth0 type veth peer name eth0-peer
ip -n "$ns" link set eth0-peer up
ip -n "$ns" addr add "$NODE_IP/24" dev eth0
ip -n "$ns" link set eth0 up
ip -n "$ns" route add default dev eth0
"${in_ns[@]}" sysctl -qw net.ipv4.ip_forward=1

# ---- control plane, in the namespace ----
start control-plane "${in_ns[@]}" env CLUSTER_DIR="$dir/cluster" KEEP=1 SKIP_BUILD=1 \
  ADVERTISE_ADDRESS="$NODE_IP" SERVICE_CIDRS="$SERVICE_CIDR" WITH_SCHEDULER=1 \
  NODE_NAME="$NODE_NAME" CONTROLLERS='*' VERBOSITY="$VERBOSITY" "$root/tests/cluster/up.sh"
wait_for "the control plane" 240 grep -qx READY "$logs/control-plane.log"
export KUBECONFIG=$dir/cluster/admin.kubeconfig
kubectl() { "${in_ns[@]}" "$bin/kubectl" "$@"; }

# ---- containerd, with its state in our folder ----
mkdir -p "$dir/cni/net.d"
cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.2"
  enable_selinux = false
  # This sandbox's processes lack CAP_SYS_RESOURCE, so no process here may lower its
  # oom_score_adj below ours (0); kubelet asks -998 for every Pod sandbox and runc's init
  # fails on it ("failed to update /proc/self/oom_score_adj: Permission denied"). containerd
  # raises what it is asked to its own value, as it does for rootless nodes.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "$dir/runc"
EOF
# The bridge's hairpin mode lets a Pod reach itself through a Service (the hairpin spec).
cat >"$dir/cni/net.d/10-e2e.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$dir/cni/ipam"}}]}
EOF
start containerd "${in_ns[@]}" containerd --config "$dir/containerd.toml"
wait_for containerd 30 ctr_k8s version
for image in "${images[@]}"; do ctr_k8s images import "$image" >/dev/null; done

# ---- kubelet ----
echo "nameserver 127.0.0.1" >"$dir/resolv.conf"
cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$dir/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $dir/cluster/pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $dir/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# Images here cannot be pulled again, so they are never collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
EOF
start kubelet "${in_ns[@]}" "$bin/kubelet" --config="$dir/kubelet.yaml" \
  --kubeconfig="$dir/cluster/kubelet.kubeconfig" --hostname-override="$NODE_NAME" \
  --node-ip="$NODE_IP" --root-dir="$dir/kubelet" --cert-dir="$dir/kubelet/pki" --v="$VERBOSITY"
wait_for "node $NODE_NAME Ready" 120 \
  kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s

# ---- the node's proxy ----
proxy_args=(--kubeconfig="$dir/cluster/kube-proxy.kubeconfig" --hostname-override="$NODE_NAME"
  --proxy-mode="$mode" --cluster-cidr="$POD_CIDR" --conntrack-max-per-core=0 --v="$VERBOSITY")
if [[ $proxy == switchyard ]]; then
  start proxy "${in_ns[@]}" "$SWITCHYARD" "${proxy_args[@]}"
else
  start proxy "${in_ns[@]}" "$bin/kube-proxy" "${proxy_args[@]}"
fi
wait_for "the proxy's /healthz" 60 "${in_ns[@]}" curl -fsS http://127.0.0.1:10256/healthz

# ---- cluster DNS, served through the proxy ----
kubectl apply -f "$here/coredns.yaml" >/dev/null
wait_for "CoreDNS" 120 kubectl -n kube-system wait --for=condition=Available deployment/coredns --timeout=2s

echo "KUBECONFIG=$KUBECONFIG"
echo "NODE_NETNS=$ns"
echo "CLUSTER_DIR=$dir"
echo "READY"
echo "node.sh: node $NODE_NAME ($proxy, $mode) up in network namespace $ns; logs in $logs; Ctrl-C stops it" >&2
set +e
wait -n "${pids[@]}"
rc=$?
for i in "${!pids[@]}"; do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "node.sh: ${names[$i]} exited (status $rc); last lines of $logs/${names[$i]}.log:" >&2
    tail -n 30 "$logs/${names[$i]}.log" >&2
  fi
done
exit 1
