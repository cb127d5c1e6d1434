#!/usr/bin/env bash
# Builds the pinned Kubernetes components, and what the e2e suite runs beside them, from their
# Go modules into target/k8s/<version>/bin/:
#   tests/cluster (module):  etcd, kube-apiserver, kube-controller-manager, kube-proxy, kubectl
#   tests/e2e (module):      kubelet, kube-scheduler, agnhost, e2e.test (`go test -c`)
#   tests/e2e/coredns:       coredns
#
#   tests/cluster/build.sh [name...]     (default: the first five)
#
# A binary already there is kept. Each module has a stamp in the bin folder (a hash of its
# go.mod, go.sum, the Go version and the build flags); when it differs, that module's binaries
# are rebuilt. Builds run one at a time (a lock in the bin folder) under `nice -n ${NICE:-19}`
# with GOFLAGS=-p=2 unless GOFLAGS already sets -p.
# The flags are those of kubernetes' hack/lib/golang.sh for a release build: static
# (CGO_ENABLED=0), -trimpath, -s -w, tags selinux,notest,grpcnotrace, and the version
# variables of hack/lib/version.sh, so `kube-proxy --version` prints the pinned release;
# agnhost gets its own version variable as test/images/image-util.sh sets it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

K8S_VERSION=v1.37.2
# The release's publication time on the Go module proxy (go list -m -json k8s.io/kubernetes),
# used as buildDate so the same go.sum gives the same binaries.
K8S_BUILD_DATE=2026-10-27T12:01:04Z
# test/images/agnhost/VERSION of that release: the tag the e2e framework asks for.
AGNHOST_VERSION=2.66.1
# The commit of the tag is not in the module, so gitCommit keeps its "$Format:%H$"
# placeholder and gitTreeState stays empty, as hack/lib/version.sh does without a commit.
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}

bin=$root/target/k8s/$K8S_VERSION/bin

# name -> module folder (under tests/), main package; e2e.test is a test binary.
declare -A module=(
  [etcd]=cluster [kube-apiserver]=cluster [kube-controller-manager]=cluster
  [kube-proxy]=cluster [kubectl]=cluster
  [kubelet]=e2e [kube-scheduler]=e2e [agnhost]=e2e [e2e.test]=e2e
  [coredns]=e2e/coredns
)
declare -A pkg=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [agnhost]=k8s.io/kubernetes/test/images/agnhost
  [e2e.test]=k8s.io/kubernetes/test/e2e
  [coredns]=github.com/coredns/coredns
)
defaults=(etcd kube-apiserver kube-controller-manager kube-proxy kubectl)

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=("${defaults[@]}")
for n in "${names[@]}"; do
  [[ -n ${pkg[$n]:-} ]] || { echo "build.sh: unknown component '$n' (known: ${!pkg[*]})" >&2; exit 2; }
done

command -v go >/dev/null || { echo "build.sh: no Go toolchain on PATH" >&2; exit 1; }
grep -q "^require k8s.io/kubernetes $K8S_VERSION\b" "$here/go.mod" ||
  { echo "build.sh: $here/go.mod does not require k8s.io/kubernetes $K8S_VERSION" >&2; exit 1; }

k8s_ldflags="all=-s -w"
for v in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor"
  k8s_ldflags+=" -X $v.buildDate=$K8S_BUILD_DATE"
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

# Each module's stamp: go.mod as parsed (`go mod edit -json`, so an edited comment does not
# rebuild), go.sum, the Go version and the flags. The first module's stamp file keeps its
# old name and recipe, so binaries built before the e2e modules existed stay valid.
declare -A stamp_file=([cluster]=.stamp [e2e]=.stamp-e2e [e2e/coredns]=.stamp-coredns)
stamped=()
check_stamp() {
  local mod=$1 s n
  [[ " ${stamped[*]} " == *" $mod "* ]] && return
  stamped+=("$mod")
  s=$( (cd "$root/tests/$mod" && go mod edit -json && cat go.sum && go env GOVERSION
        printf '%s\n' "$k8s_ldflags" "$tags" "CGO_ENABLED=0 -trimpath") | sha256sum | cut -d' ' -f1)
  if [[ "$(cat "$bin/${stamp_file[$mod]}" 2>/dev/null)" != "$s" ]]; then
    for n in "${!module[@]}"; do
      [[ ${module[$n]} == "$mod" ]] && rm -f "$bin/$n"
    done
    echo "$s" >"$bin/${stamp_file[$mod]}"
  fi
}

for n in "${names[@]}"; do
  mod=${module[$n]}
  check_stamp "$mod"
  if [[ -x $bin/$n ]]; then
    echo "$n: cached in $bin"
    continue
  fi
  echo "$n: building ${pkg[$n]} ..."
  start=$(date +%s)
  ldflags=$k8s_ldflags
  [[ $n == agnhost ]] && ldflags="all=-s -w -X main.Version=$AGNHOST_VERSION"
  [[ $n == coredns ]] && ldflags="all=-s -w"
  build=(build)
  [[ $n == e2e.test ]] && build=(test -c)
  (cd "$root/tests/$mod" &&
    CGO_ENABLED=0 GOFLAGS="$goflags" nice -n "${NICE:-19}" \
      go "${build[@]}" -trimpath -tags "$tags" -ldflags "$ldflags" -o "$bin/.$n.tmp" "${pkg[$n]}")
  mv "$bin/.$n.tmp" "$bin/$n"
  echo "$n: built in $(( $(date +%s) - start )) s, $(( $(stat -c %s "$bin/$n") / 1048576 )) MiB"
done
