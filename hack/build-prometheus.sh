#!/usr/bin/env bash
# Builds Prometheus (the server) from the version pinned in hack/tools/prometheus/go.mod,
# through the Go module proxy, into a per-version cache. Only Kubernetes service
# discovery is compiled in (the build tags `remove_all_sd,enable_kubernetes_sd`); the web
# UI's assets are not in the module, so the server answers its HTTP API but not the UI.
# The real-node tests start it against the local apiserver to scrape the chart's pods.
#
#   hack/build-prometheus.sh            # build if needed, print the binary's path
#   hack/build-prometheus.sh --print    # only print the binary's path (may not exist yet)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra"
mod="$here/tools/prometheus"
tags="remove_all_sd,enable_kubernetes_sd"

version=$(awk '$1=="github.com/prometheus/prometheus"{print $2}' "$mod/go.mod" | head -n1)
# Prometheus 3.x is tagged v0.3MM.P in Go; it calls itself 3.MM.P.
minor=${version#v0.}; minor=${minor%%.*}
release="$((minor / 100)).$((minor % 100)).${version##*.}"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
ldflags+=" -X github.com/prometheus/common/version.Branch=release"
key=$( { cat "$mod/go.mod" "$mod/go.sum"; echo "$(go env GOVERSION) $tags $ldflags"; } \
       | sha256sum | cut -c1-16)
dir="$cache_root/prometheus/$version-$key"

if [ "${1:-}" = "--print" ]; then
  echo "$dir/prometheus"
  exit 0
fi
if [ -x "$dir/prometheus" ]; then
  echo "$dir/prometheus"
  exit 0
fi

mkdir -p "$cache_root/prometheus"
tmp=$(mktemp -d "$cache_root/prometheus/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building Prometheus $version into $dir (first time only; ~8 min on 2 cores)" >&2
(
  cd "$mod"
  CGO_ENABLED=0 go build -buildvcs=false -trimpath -tags "$tags" -ldflags "$ldflags" \
    -o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus
)
rm -rf "$dir"
chmod 755 "$tmp"
mv "$tmp" "$dir"
trap - EXIT
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$dir/prometheus"
