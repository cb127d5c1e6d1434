#!/usr/bin/env bash
# Builds the pinned Kubernetes components from their Go modules into
# target/k8s/<version>/bin/: etcd, kube-apiserver, kube-controller-manager, kube-proxy, kubectl.
#
#   tests/cluster/build.sh [name...]     (default: all five)
#
# A binary already there is kept. The bin folder carries a stamp (a hash of go.mod, go.sum,
# the Go version and the build flags); when it differs, every binary there is rebuilt.
# Builds run one at a time (a lock in the bin folder) under `nice -n ${NICE:-19}` with
# GOFLAGS=-p=2 unless GOFLAGS already sets -p.
# The flags are those of kubernetes' hack/lib/golang.sh for a release build: static
# (CGO_ENABLED=0), -trimpath, -s -w, tags selinux,notest,grpcnotrace, and the version
# variables of hack/lib/version.sh, so `kube-proxy --version` prints the pinned release.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

K8S_VERSION=v1.37.2
# The release's publication time on the Go module proxy (go list -m -json k8s.io/kubernetes),
# used as buildDate so the same go.sum gives the same binaries.
K8S_BUILD_DATE=2026-10-27T12:01:04Z
# The commit of the tag is not in the module, so gitCommit keeps its "$Format:%H$"
# placeholder and gitTreeState stays empty, as hack/lib/version.sh does without a commit.
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}

bin=$root/target/k8s/$K8S_VERSION/bin

declare -A pkg=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
)
all=(etcd kube-apiserver kube-controller-manager kube-proxy kubectl)

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ -n ${pkg[$n]:-} ]] || { echo "build.sh: unknown component '$n' (known: ${all[*]})" >&2; exit 2; }
done

command -v go >/dev/null || { echo "build.sh: no Go toolchain on PATH" >&2; exit 1; }
grep -q "^require k8s.io/kubernetes $K8S_VERSION\b" "$here/go.mod" ||
  { echo "build.sh: $here/go.mod does not require k8s.io/kubernetes $K8S_VERSION" >&2; exit 1; }

ldflags="all=-s -w"
for v in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor"
  ldflags+=" -X $v.buildDate=$K8S_BUILD_DATE"
done
tags=selinux,notest,grpcnotrace
goflags=${GOFLAGS:-}
[[ $goflags == *-p=* ]] || goflags+=" -p=2"

mkdir -p "$bin"
exec 9>"$bin/.lock"
if ! flock -n 9; then
  echo "build.sh: another build holds $bin/.lock; waiting" >&2
  flock 9
fi

# go.mod as parsed (`go mod edit -json`), so an edited comment does not rebuild.
stamp=$( (cd "$here" && go mod edit -json && cat go.sum && go env GOVERSION
          printf '%s\n' "$ldflags" "$tags" "CGO_ENABLED=0 -trimpath") | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$bin/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  for n in "${all[@]}"; do rm -f "$bin/$n"; done
  echo "$stamp" >"$bin/.stamp"
fi

cd "$here"
for n in "${names[@]}"; do
  if [[ -x $bin/$n ]]; then
    echo "$n: cached in $bin"
    continue
  fi
  echo "$n: building ${pkg[$n]} ..."
  start=$(date +%s)
  CGO_ENABLED=0 GOFLAGS="$goflags" nice -n "${NICE:-19}" \
    go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$bin/.$n.tmp" "${pkg[$n]}"
  mv "$bin/.$n.tmp" "$bin/$n"
  echo "$n: built in $(( $(date +%s) - start )) s, $(( $(stat -c %s "$bin/$n") / 1048576 )) MiB"
done
