#!/usr/bin/env bash
# Builds the cdi-check tool (hack/tools/cdi-check: the reference CDI implementation as a
# spec checker) into a cache keyed by its sources and the Go version, and prints the
# binary's path. Builds only when that binary is missing.
#
#   hack/build-cdi-check.sh      # prints e.g. ~/.cache/thunder-dra/cdi-check/<key>/cdi-check
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/tools/cdi-check"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra/cdi-check"

go_version=$(go env GOVERSION)
key=$( { cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go"; echo "$go_version"; } \
       | sha256sum | cut -c1-16)
bin="$cache_root/$key/cdi-check"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root"
tmp=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "building cdi-check into $bin" >&2
(
  cd "$mod"
  # Low priority: this shares the machine with much larger builds.
  CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" \
    nice -n 10 go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/cdi-check" .
)
mkdir -p "$(dirname "$bin")"
mv "$tmp/cdi-check" "$bin"
echo "$bin"
