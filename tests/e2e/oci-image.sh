#!/usr/bin/env bash
# Packs a root file system folder into a one-layer OCI image archive that `ctr images import`
# takes, under the given name: what `docker build` would give, without a Docker engine (none
# runs here, and nothing can be pulled).
#
#   [OCI_USER=uid:gid] tests/e2e/oci-image.sh ROOTFS NAME OUT.tar ENTRYPOINT_JSON [CMD_JSON]
#   e.g. OCI_USER=65535:65535 tests/e2e/oci-image.sh rootfs registry.k8s.io/pause:3.10.2 \
#          pause.tar '["/pause"]'
#
# The layer is an uncompressed tar with numeric owner root and fixed times, so the same folder
# gives the same image digest.
set -euo pipefail

rootfs=${1:?usage: oci-image.sh ROOTFS NAME OUT.tar ENTRYPOINT_JSON [CMD_JSON]}
name=${2:?name}
out=${3:?output archive}
entrypoint=${4:?entrypoint as a JSON array}
cmd=${5:-null}
[[ -d $rootfs ]] || { echo "oci-image.sh: $rootfs is not a folder" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
blobs=$work/blobs/sha256
mkdir -p "$blobs"

# blob FILE MEDIATYPE: moves FILE into the blob store and prints its descriptor.
blob() {
  local file=$1 media=$2 digest size
  digest=$(sha256sum "$file" | cut -d' ' -f1)
  size=$(stat -c %s "$file")
  mv "$file" "$blobs/$digest"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$media" "$digest" "$size"
}

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer" .
diff_id=sha256:$(sha256sum "$work/layer" | cut -d' ' -f1)
layer=$(blob "$work/layer" application/vnd.oci.image.layer.v1.tar)

user=${OCI_USER:-}
printf '{"architecture":"amd64","os":"linux","config":{"User":"%s","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
  "$user" "$entrypoint" "$cmd" "$diff_id" >"$work/config"
config=$(blob "$work/config" application/vnd.oci.image.config.v1+json)

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
  "$config" "$layer" >"$work/manifest"
manifest=$(blob "$work/manifest" application/vnd.oci.image.manifest.v1+json)

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
  "${manifest%\}},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}" \
  >"$work/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" oci-layout index.json blobs
