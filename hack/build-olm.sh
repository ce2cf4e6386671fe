#!/usr/bin/env bash
# Builds OLM (Operator Lifecycle Manager v0: the olm and catalog operators) and
# operator-registry's opm at the versions pinned in hack/tools/olm/go.mod, through the Go
# module proxy, into a per-version cache, with OLM's own CRDs (deploy/chart/crds of the
# same module) beside them. The real-node OLM test runs the two operators against the
# local apiserver and serves a file-based catalog of the project's bundles with opm.
#
#   hack/build-olm.sh            # build if needed, print the directory (bin/, crds/)
#   hack/build-olm.sh --print    # only print the directory (may not exist yet)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra"
mod="$here/tools/olm"
olm_module=github.com/operator-framework/operator-lifecycle-manager
registry_module=github.com/operator-framework/operator-registry
# opm reads images with containers/image; this tag leaves out gpgme (cgo).
tags="containers_image_openpgp"

olm_version=$(awk -v m="$olm_module" '$1==m{print $2}' "$mod/go.mod" | head -n1)
key=$( { cat "$mod/go.mod" "$mod/go.sum"; echo "$(go env GOVERSION) $tags"; } \
       | sha256sum | cut -c1-16)
dir="$cache_root/olm/$olm_version-$key"

if [ "${1:-}" = "--print" ]; then
  echo "$dir"
  exit 0
fi
if [ -x "$dir/bin/olm" ] && [ -x "$dir/bin/catalog" ] && [ -x "$dir/bin/opm" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache_root/olm"
tmp=$(mktemp -d "$cache_root/olm/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building OLM $olm_version (olm, catalog, opm) into $dir (first time only; ~10 min on 2 cores)" >&2
(
  cd "$mod"
  # One build of the three commands: they share most of their packages.
  CGO_ENABLED=0 go build -buildvcs=false -trimpath -tags "$tags" -ldflags "-s -w" \
    -o "$tmp/bin/" "$olm_module/cmd/olm" "$olm_module/cmd/catalog" "$registry_module/cmd/opm"
  src=$(go list -m -f '{{.Dir}}' "$olm_module")
  mkdir -p "$tmp/crds"
  cp "$src"/deploy/chart/crds/*.yaml "$tmp/crds/"
)
rm -rf "$dir"
chmod -R u+w,go+rX "$tmp"
mv "$tmp" "$dir"
trap - EXIT
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$dir"
