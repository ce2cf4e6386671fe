#!/usr/bin/env bash
# Builds a kube-scheduler of the control plane's version with the allocator patch of
# hack/tools/scheduler-patched/ applied to a copy of k8s.io/dynamic-resource-allocation,
# for the scheduler benchmark only (docs/scheduling-upstream.md): the product, the
# tests and the control-plane cache never use it. hack/tools/k8s is not touched.
#
#   hack/build-scheduler-patched.sh            # build if needed, print the binary's path
#   hack/build-scheduler-patched.sh --print    # only print the path (may not exist yet)
#   hack/build-scheduler-patched.sh --test     # go test the patched allocator (no build)
#
#   python -m bench.scheduler --scheduler-binary "$(hack/build-scheduler-patched.sh)"
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/tools/scheduler-patched"
patch_file="$mod/allocator-cross-node-cache.patch"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra"

k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2} $2=="k8s.io/kubernetes"{print $3}' "$mod/go.mod" | head -n1)
dra_version=v0.${k8s_version#v1.}
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
go_version=$(go env GOVERSION)

# The same link flags as hack/build-tools.sh, so the binary reports the same version.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

key=$( { cat "$mod/go.mod" "$mod/go.sum" "$patch_file"; echo "$go_version $ldflags"; } \
       | sha256sum | cut -c1-16)
out="$cache_root/scheduler-patched/$k8s_version-$key"

src="$(go env GOMODCACHE)/k8s.io/dynamic-resource-allocation@$dra_version"
if [ ! -d "$src" ]; then
  (cd "$(mktemp -d)" && go mod download "k8s.io/dynamic-resource-allocation@$dra_version")
fi

if [ "${1:-}" = "--test" ]; then
  # The patched module with upstream's own allocator tests (allocatortesting, which
  # the incubating package runs) and cross_node_cache_test.go, which compares the
  # patched allocator with the unpatched one, copied in as package "unpatched".
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$src" "$work/dra"
  chmod -R u+w "$work/dra"
  inc="$work/dra/structured/internal/incubating"
  mkdir "$work/dra/structured/internal/unpatched"
  for f in "$inc"/*.go; do
    case "$f" in *_test.go) continue ;; esac
    sed 's/^package incubating$/package unpatched/' "$f" \
      > "$work/dra/structured/internal/unpatched/$(basename "$f")"
  done
  patch -p1 --quiet -d "$work/dra" < "$patch_file"
  cp "$mod"/*_test.go "$inc/"
  (cd "$work/dra" && go vet ./structured/internal/incubating/ \
     && go test -count=1 "${@:2}" ./structured/internal/incubating/)
  exit
fi

if [ "${1:-}" = "--print" ]; then
  echo "$out/kube-scheduler"
  exit 0
fi
if [ -x "$out/kube-scheduler" ]; then
  echo "$out/kube-scheduler"
  exit 0
fi

mkdir -p "$cache_root/scheduler-patched"
work=$(mktemp -d "$cache_root/scheduler-patched/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "building patched kube-scheduler $k8s_version into $out" >&2
cp "$mod/go.mod" "$mod/go.sum" "$work/"
cp -r "$src" "$work/dra"
chmod -R u+w "$work/dra"
patch -p1 --quiet -d "$work/dra" < "$patch_file"
(
  cd "$work"
  CGO_ENABLED=0 go build -buildvcs=false -trimpath -tags=selinux,notest,grpcnotrace \
    -ldflags "$ldflags" -o "$work/bin/" k8s.io/kubernetes/cmd/kube-scheduler
)
rm -rf "$out"
mkdir -p "$out"
mv "$work/bin/kube-scheduler" "$out/kube-scheduler"
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$out/kube-scheduler"
