#!/usr/bin/env bash
# Fetches Debian's 6.1 kernel (which has IPVS and the dummy link type, unlike the host's)
# for the QEMU guest tests: the newest linux-image-6.1.*-amd64 the apt sources offer,
# unpacked into DIR (default target/guest-kernel) with its module index built.
# Idempotent: a DIR that already holds a kernel is left as it is.
set -euo pipefail
dir="${1:-$(dirname "$0")/../../target/guest-kernel}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
if compgen -G "$dir/root/boot/vmlinuz-*" >/dev/null; then
  echo "guest kernel already in $dir"
  exit 0
fi
find_pkg() {
  apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1
}
pkg="$(find_pkg)"
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg="$(find_pkg)"
fi
if [ -z "$pkg" ]; then
  echo "no linux-image-6.1.*-amd64 package in the apt sources (run apt-get update?)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq "$pkg" 2>/dev/null)
dpkg-deb -x "$tmp"/*.deb "$tmp/root"
version="$(ls "$tmp/root/lib/modules")"
depmod -b "$tmp/root" "$version"
rm -rf "$dir/root"
mv "$tmp/root" "$dir/root"
echo "guest kernel $version in $dir"
