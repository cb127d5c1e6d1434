#!/usr/bin/env bash
# Checks a control plane started by up.sh end to end: a Node, a Service and a Pod created
# through the API, the Pod made Ready through its status subresource, and the EndpointSlice
# that the real EndpointSlice controller writes for it. Leaves nothing behind.
#
#   tests/cluster/smoke.sh <admin kubeconfig>
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
kubectl=$root/target/k8s/v1.37.2/bin/kubectl
export KUBECONFIG=${1:?usage: smoke.sh <admin kubeconfig>}
ns=smoke-$$
node=smoke-node-$$

cleanup() {
  # No kubelet confirms a graceful Pod deletion here: a Pod bound to a Node stays Terminating
  # (and so does its namespace) unless deleted with no grace period.
  "$kubectl" -n "$ns" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
  "$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  "$kubectl" delete node "$node" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$kubectl" version
"$kubectl" api-resources --api-group=networking.k8s.io -o name | grep -qx servicecidrs.networking.k8s.io
echo "ServiceCIDRs (networking.k8s.io/v1):"
"$kubectl" get servicecidrs.v1.networking.k8s.io

# The EndpointSlice controller skips Pods whose Node it cannot find.
"$kubectl" create namespace "$ns"
# The ServiceAccount admission plugin refuses Pods until the namespace's default
# ServiceAccount exists; the serviceaccount controller makes it.
for _ in $(seq 1 100); do
  "$kubectl" -n "$ns" get serviceaccount default >/dev/null 2>&1 && break
  sleep 0.1
done
"$kubectl" apply -f - <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $node
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: $ns}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: $ns, labels: {app: web}}
spec:
  nodeName: $node
  containers: [{name: web, image: none.invalid/web, ports: [{containerPort: 8080}]}]
EOF
"$kubectl" -n "$ns" patch pod web-1 --subresource=status --type=merge -p '{"status": {
  "phase": "Running", "hostIP": "192.0.2.1", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}],
  "conditions": [{"type": "Ready", "status": "True"}]}}'

for _ in $(seq 1 100); do
  got=$("$kubectl" -n "$ns" get endpointslices -l kubernetes.io/service-name=web \
    -o jsonpath='{range .items[*]}{.addressType} {range .endpoints[*]}{.addresses[0]}/{.conditions.ready}/{.nodeName} {end}{range .ports[*]}{.name}:{.port}{end}{"\n"}{end}')
  if grep -q "10.244.0.5/true/$node" <<<"$got"; then
    echo "EndpointSlices for $ns/web:"
    "$kubectl" -n "$ns" get endpointslices -l kubernetes.io/service-name=web -o wide
    echo "smoke: OK"
    exit 0
  fi
  sleep 0.1
done
echo "smoke: no ready endpoint 10.244.0.5 in the EndpointSlices of $ns/web after 10 s; saw: $got" >&2
exit 1
