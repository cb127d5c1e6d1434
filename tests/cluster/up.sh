#!/usr/bin/env bash
# Starts a real Kubernetes control plane on loopback, built by build.sh from the pinned release:
# etcd, kube-apiserver (TLS, RBAC, dual-stack Service CIDRs) and kube-controller-manager
# (the EndpointSlice, EndpointSliceMirroring and service-account controllers and the few it
# needs beside them). Runs in the foreground as root; Ctrl-C (or SIGTERM) stops every process
# it started and removes its state folder.
#
#   sudo tests/cluster/up.sh
#
# When the control plane is ready it prints, one per line:
#   KUBECONFIG=<dir>/admin.kubeconfig            (user admin, group system:masters)
#   KUBE_PROXY_KUBECONFIG=<dir>/kube-proxy.kubeconfig   (user system:kube-proxy, as kubeadm's)
#   CLUSTER_DIR=<dir>
#   READY
# and, on SIGUSR1, restarts kube-apiserver alone (SIGTERM, SIGKILL after 5 s), printing
# RESTARTING and then RESTARTED once it is ready again (tests/real_cluster.rs uses this).
# Settings (environment):
#   CLUSTER_DIR           state folder (default: a new mktemp -d); removed on exit unless KEEP=1
#   ETCD_PORT, ETCD_PEER_PORT, APISERVER_PORT, KCM_PORT   (defaults 2379 2380 6443 10257)
#   SERVICE_CIDRS         --service-cluster-ip-range (default 10.96.0.0/16,fd00:10:96::/112)
#   SKIP_BUILD=1          do not run build.sh first (the binaries must be there)
#   VERBOSITY             -v for the Kubernetes components (default 1)
#   ADVERTISE_ADDRESS     the API server's address for Pods (default 127.0.0.1, with no
#                         endpoints for the kubernetes Service); any other address is served on
#                         every address (so run it in a network namespace of its own: tests/e2e)
#                         and published as the kubernetes Service's endpoint
#   CONTROLLERS           kube-controller-manager's --controllers (default: the few below)
#   WITH_SCHEDULER=1      start kube-scheduler too (KUBE_SCHEDULER_PORT, default 10259)
#   NODE_NAME             also write kubelet.kubeconfig, the credentials of the kubelet of
#                         that node (user system:node:NODE_NAME, group system:nodes)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
K8S_VERSION=v1.37.2
bin=$root/target/k8s/$K8S_VERSION/bin

ETCD_PORT=${ETCD_PORT:-2379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-2380}
APISERVER_PORT=${APISERVER_PORT:-6443}
KCM_PORT=${KCM_PORT:-10257}
KUBE_SCHEDULER_PORT=${KUBE_SCHEDULER_PORT:-10259}
ADVERTISE_ADDRESS=${ADVERTISE_ADDRESS:-127.0.0.1}
WITH_SCHEDULER=${WITH_SCHEDULER:-0}
SERVICE_CIDRS=${SERVICE_CIDRS:-10.96.0.0/16,fd00:10:96::/112}
VERBOSITY=${VERBOSITY:-1}

[[ $(id -u) == 0 ]] || { echo "up.sh: run as root" >&2; exit 1; }
for tool in openssl curl; do
  command -v $tool >/dev/null || { echo "up.sh: needs $tool" >&2; exit 1; }
done
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  wanted=(etcd kube-apiserver kube-controller-manager kube-proxy kubectl)
  [[ $WITH_SCHEDULER == 1 ]] && wanted+=(kube-scheduler)
  "$here/build.sh" "${wanted[@]}" >&2
fi
needed=(etcd kube-apiserver kube-controller-manager)
[[ $WITH_SCHEDULER == 1 ]] && needed+=(kube-scheduler)
for b in "${needed[@]}"; do
  [[ -x $bin/$b ]] || { echo "up.sh: $bin/$b missing (run tests/cluster/build.sh)" >&2; exit 1; }
done
ports=("$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT")
[[ $WITH_SCHEDULER == 1 ]] && ports+=("$KUBE_SCHEDULER_PORT")
for p in "${ports[@]}"; do
  if ss -Hltn "sport = :$p" | grep -q .; then
    echo "up.sh: port $p on this machine is in use (set ETCD_PORT/ETCD_PEER_PORT/APISERVER_PORT/KCM_PORT/KUBE_SCHEDULER_PORT)" >&2
    exit 1
  fi
done

if [[ -n ${CLUSTER_DIR:-} ]]; then
  dir=$CLUSTER_DIR; mkdir -p "$dir"
else
  dir=$(mktemp -d /tmp/switchyard-cluster.XXXXXX)
fi
pki=$dir/pki; logs=$dir/logs
mkdir -p "$pki" "$logs" "$dir/etcd"
chmod 700 "$dir"

pids=()
names=()
cleaning=0
cleanup() {
  local rc=$?
  [[ $cleaning == 1 ]] && return
  cleaning=1
  # A second Ctrl-C or SIGTERM (a parent's death signal comes once per thread of the parent)
  # must not cut the cleanup short and leave components running.
  trap '' INT TERM
  trap - EXIT
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  # kube-apiserver's graceful stop waits up to --request-timeout (60 s) for its open
  # connections (its own loopback clients among them); this cluster is thrown away, so each
  # component gets 5 s.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local n=0
    while kill -0 "${pids[$i]}" 2>/dev/null && ((n < 50)); do sleep 0.1; n=$((n + 1)); done
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "up.sh: ${names[$i]} still stopping after 5 s; killed" >&2
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    wait "${pids[$i]}" 2>/dev/null || true
  done
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "up.sh: stopped; state kept in $dir" >&2
  else
    rm -rf "$dir"
    echo "up.sh: stopped; removed $dir" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
restart=0
trap 'restart=1' USR1

me=up.sh
# start and wait_for.
source "$here/procs.sh"

# ---- keys and certificates (EC P-256, ten years) ----
cd "$pki"
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet ecparam -name prime256v1 -genkey -noout -out ca.key
openssl_quiet req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=switchyard-test-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt

# cert NAME SUBJECT EXTENDED_USAGE [SAN]
cert() {
  local name=$1 subj=$2 eku=$3 san=${4:-}
  openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$name.key"
  openssl_quiet req -new -key "$name.key" -subj "$subj" -out "$name.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -z $san ]] || echo "subjectAltName=$san"
  } >"$name.ext"
  openssl_quiet x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -sha256 -extfile "$name.ext" -out "$name.crt"
  rm -f "$name.csr" "$name.ext"
}
# The first address of the first Service CIDR is the kubernetes Service's ClusterIP.
first_cidr=${SERVICE_CIDRS%%,*}
base=${first_cidr%/*}
kube_svc_ip=${base%.*}.$((${base##*.} + 1))
cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,IP:$ADVERTISE_ADDRESS,IP:$kube_svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=admin" clientAuth
cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
[[ -z ${NODE_NAME:-} ]] || cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
# The API server's client certificate towards kubelets (kubectl exec, logs, port-forward).
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
# The service-account token signing key.
openssl_quiet genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
openssl_quiet pkey -in sa.key -pubout -out sa.pub
chmod 600 ./*.key

# kubeconfig NAME USER: a kubeconfig with the certificates inlined.
kubeconfig() {
  local name=$1 user=$2
  cat >"$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: switchyard-test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$name.crt")
    client-key-data: $(base64 -w0 "$name.key")
contexts:
- name: $user@switchyard-test
  context:
    cluster: switchyard-test
    user: $user
current-context: $user@switchyard-test
EOF
  chmod 600 "$dir/$name.kubeconfig"
}
kubeconfig admin admin
kubeconfig kube-controller-manager system:kube-controller-manager
kubeconfig kube-proxy system:kube-proxy
kubeconfig kube-scheduler system:kube-scheduler
[[ -z ${NODE_NAME:-} ]] || kubeconfig kubelet "system:node:$NODE_NAME"
cd "$dir"

# ---- etcd ----
start etcd "$bin/etcd" \
  --name=switchyard-test \
  --data-dir="$dir/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="switchyard-test=http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster-state=new \
  --log-level=warn
wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# ---- kube-apiserver ----
# --endpoint-reconciler-type=none on loopback: with the default (lease) reconciler a loopback
# advertise address is refused at startup ("cannot use public IP 127.0.0.1 with endpoint
# reconciler: ... may not be in the loopback range"); so the kubernetes Service is there,
# without endpoints.
if [[ $ADVERTISE_ADDRESS == 127.0.0.1 ]]; then
  bind_address=127.0.0.1; reconciler=none
else
  bind_address=0.0.0.0; reconciler=lease
fi
apiserver_args=(
  --etcd-servers="http://127.0.0.1:$ETCD_PORT"
  --bind-address="$bind_address"
  --advertise-address="$ADVERTISE_ADDRESS"
  --secure-port="$APISERVER_PORT"
  --tls-cert-file="$pki/apiserver.crt"
  --tls-private-key-file="$pki/apiserver.key"
  --client-ca-file="$pki/ca.crt"
  --authorization-mode=Node,RBAC
  --allow-privileged=true
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt"
  --kubelet-client-key="$pki/apiserver-kubelet-client.key"
  --kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname
  --service-account-issuer=https://kubernetes.default.svc.cluster.local
  --service-account-key-file="$pki/sa.pub"
  --service-account-signing-key-file="$pki/sa.key"
  --service-cluster-ip-range="$SERVICE_CIDRS"
  --endpoint-reconciler-type="$reconciler"
  --cert-dir="$dir/apiserver-certs"
  --v="$VERBOSITY"
)
start kube-apiserver "$bin/kube-apiserver" "${apiserver_args[@]}"
apiserver_index=$((${#pids[@]} - 1))
admin_curl() {
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT$1"
}
wait_for kube-apiserver 120 admin_curl /readyz

# ---- kube-controller-manager ----
# endpointslice, endpointslice-mirroring, serviceaccount-token: asked for by the tests;
# serviceaccount: the default ServiceAccount per namespace, without which Pods are refused;
# garbage-collector: deletes a deleted Service's EndpointSlices (through their owner references);
# namespace: deletes a deleted namespace's objects; service-cidr: ServiceCIDR status and
# finalizers; root-ca-certificate-publisher: kube-root-ca.crt, which projected tokens mount.
controllers=endpointslice-controller,endpointslice-mirroring-controller
controllers+=,serviceaccount-token-controller,serviceaccount-controller
controllers+=,garbage-collector-controller,namespace-controller,service-cidr-controller
controllers+=,root-ca-certificate-publisher-controller
controllers=${CONTROLLERS:-$controllers}
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig="$dir/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 \
  --secure-port="$KCM_PORT" \
  --cert-dir="$dir/kcm-certs" \
  --controllers="$controllers" \
  --service-account-private-key-file="$pki/sa.key" \
  --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=true \
  --leader-elect=false \
  --v="$VERBOSITY"
# (its serving certificate is self-signed, and /healthz carries nothing secret)
wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz"
if [[ $WITH_SCHEDULER == 1 ]]; then
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$KUBE_SCHEDULER_PORT" \
    --leader-elect=false \
    --v="$VERBOSITY"
  wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$KUBE_SCHEDULER_PORT/healthz"
fi
# The service-account controller has run once it made the default ServiceAccount.
wait_for "the default ServiceAccount" 60 admin_curl /api/v1/namespaces/default/serviceaccounts/default

echo "KUBECONFIG=$dir/admin.kubeconfig"
echo "KUBE_PROXY_KUBECONFIG=$dir/kube-proxy.kubeconfig"
echo "CLUSTER_DIR=$dir"
echo "READY"
echo "up.sh: control plane on https://127.0.0.1:$APISERVER_PORT, logs in $logs; Ctrl-C stops it" >&2
# Stay until a signal, or until a component exits (then stop the others). SIGUSR1 restarts
# kube-apiserver alone (SIGTERM, then SIGKILL after 5 s), as a test of clients that must ride
# out an API server restart: it prints RESTARTING, then RESTARTED once /readyz answers again.
set +e
while true; do
  wait -n "${pids[@]}"
  rc=$?
  if [[ $restart == 1 ]]; then
    restart=0
    api_pid=${pids[$apiserver_index]}
    echo "RESTARTING"
    kill -TERM "$api_pid" 2>/dev/null
    n=0
    while kill -0 "$api_pid" 2>/dev/null && ((n < 50)); do sleep 0.1; n=$((n + 1)); done
    if kill -0 "$api_pid" 2>/dev/null; then
      echo "up.sh: kube-apiserver still stopping after 5 s; killed" >&2
      kill -KILL "$api_pid" 2>/dev/null
    fi
    wait "$api_pid" 2>/dev/null
    echo "up.sh: kube-apiserver stopped; starting it again" >&2
    "$bin/kube-apiserver" "${apiserver_args[@]}" >>"$logs/kube-apiserver.log" 2>&1 &
    pids[$apiserver_index]=$!
    wait_for kube-apiserver 120 admin_curl /readyz
    echo "RESTARTED"
    continue
  fi
  # A signal other than USR1 runs its trap (which exits); anything else is a component's exit.
  break
done
for i in "${!pids[@]}"; do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "up.sh: ${names[$i]} exited (status $rc); last lines of $logs/${names[$i]}.log:" >&2
    tail -n 20 "$logs/${names[$i]}.log" >&2
  fi
done
exit 1
