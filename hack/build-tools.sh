#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl) and helm from pinned upstream sources through the
# Go module proxy, into a per-version cache. Builds only what is missing.
#
#   hack/build-tools.sh            # build if needed, print the bin directory
#   hack/build-tools.sh --print    # only print the bin directory (may not exist yet)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra"
k8s_mod="$here/tools/k8s"
helm_mod="$here/tools/helm"

k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2} $2=="k8s.io/kubernetes"{print $3}' "$k8s_mod/go.mod" | head -n1)
go_version=$(go env GOVERSION)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

key=$( { cat "$k8s_mod/go.mod" "$k8s_mod/go.sum" "$k8s_mod/etcd/main.go" \
         "$helm_mod/go.mod" "$helm_mod/go.sum"; echo "$go_version $ldflags"; } \
       | sha256sum | cut -c1-16)
bin="$cache_root/bin/$k8s_version-$key"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

want=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl helm)
missing=0
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ "$missing" = 0 ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root/bin"
tmp=$(mktemp -d "$cache_root/bin/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building Kubernetes $k8s_version control plane and helm into $bin (first time only; ~20-30 min on 2 cores)" >&2
(
  cd "$k8s_mod"
  CGO_ENABLED=0 go build -buildvcs=false -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl ./etcd
)
helm_version=$(awk '$1=="helm.sh/helm/v3"{print $2} $2=="helm.sh/helm/v3"{print $3}' "$helm_mod/go.mod" | head -n1)
(
  cd "$helm_mod"
  hl="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  hl+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
  hl+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
  CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "$hl" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
)
rm -rf "$bin"
chmod 755 "$tmp"
mv "$tmp" "$bin"
trap - EXIT
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
