#!/usr/bin/env bash
# Builds the kubelet-calls benchmark's two Go programs (hack/tools/kubeletbench: drabench,
# the kubelet's own DRA manager as a driver, and floorplugin, a minimal DRA plugin on the
# upstream helper) from the pinned modules through the Go module proxy, into a cache keyed
# by the module's go.mod/go.sum, its sources and the Go version, and prints the directory
# holding both. Builds only when one of them is missing.
#
#   hack/build-kubeletbench.sh            # build if needed, print the bin directory
#   hack/build-kubeletbench.sh --print    # only print the bin directory (may not exist yet)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/tools/kubeletbench"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra/kubeletbench"

k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2} $2=="k8s.io/kubernetes"{print $3}' "$mod/go.mod" | head -n1)
go_version=$(go env GOVERSION)
tags="selinux,notest,grpcnotrace"
key=$( { cat "$mod/go.mod" "$mod/go.sum" "$mod"/drabench/*.go "$mod"/floorplugin/*.go;
         echo "$go_version $tags"; } | sha256sum | cut -c1-16)
bin="$cache_root/$k8s_version-$key"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi
if [ -x "$bin/drabench" ] && [ -x "$bin/floorplugin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root"
tmp=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building drabench and floorplugin (Kubernetes $k8s_version) into $bin" >&2
(
  cd "$mod"
  # Low priority: this shares the machine with much larger builds.
  CGO_ENABLED=0 nice -n 10 go build -buildvcs=false -trimpath -tags="$tags" -ldflags "-s -w" \
    -o "$tmp/" ./drabench ./floorplugin
)
rm -rf "$bin"
chmod 755 "$tmp"
mv "$tmp" "$bin"
trap - EXIT
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
