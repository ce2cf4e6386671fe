#!/usr/bin/env bash
# Builds the bundle-validate tool (hack/tools/bundle-validate: the operator-framework's
# OLM bundle validators) through the Go module proxy into a cache keyed by its sources
# and the Go version, and prints the binary's path. Builds only when it is missing.
#
#   release/build-bundle-validate.sh          # build if needed, print the binary's path
#   release/build-bundle-validate.sh --print  # only print the path (may not exist yet)
set -euo pipefail

# The Go module lives with the other pinned Go builds, under hack/tools.
repo=$(cd "$(dirname "$0")/.." && pwd)
mod="$repo/hack/tools/bundle-validate"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra/bundle-validate"

go_version=$(go env GOVERSION)
key=$( { cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go"; echo "$go_version"; } \
       | sha256sum | cut -c1-16)
bin="$cache_root/$key/bundle-validate"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root"
tmp=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "building bundle-validate into $bin (first time only; a few minutes on 2 cores)" >&2
(
  cd "$mod"
  # Low priority: this shares the machine with much larger builds and test runs.
  CGO_ENABLED=0 nice -n 10 go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/bundle-validate" .
)
mkdir -p "$(dirname "$bin")"
mv "$tmp/bundle-validate" "$bin"
echo "$bin"
