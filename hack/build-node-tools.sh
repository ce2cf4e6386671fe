#!/usr/bin/env bash
# Builds and installs what a real local node needs, pinned and cached like the control
# plane (hack/build-tools.sh):
#   - kubelet        from hack/tools/kubelet (k8s.io/kubernetes, same version as the
#                    control plane), cache key: that module's go.mod/go.sum + Go + flags
#   - containerd     containerd, containerd-shim-runc-v2 and ctr from hack/tools/containerd
#                    (containerd v2: CDI always on), its own cache key
#   - pause image    build/pause/linux/pause.c from the k8s.io/kubernetes module, static,
#                    packed as an OCI archive with umoci (never pulled)
#   - Debian packages: runc, containernetworking-plugins (bridge, host-local), umoci,
#                    mmdebstrap, socat, busybox-static, gcc and libc6-dev (for pause),
#                    installed with apt-get when missing (root only)
# Nothing is downloaded outside the Go module proxy and Debian's package mirror.
#
#   hack/build-node-tools.sh           # install/build what is missing, print the paths
#   hack/build-node-tools.sh --print   # only print the paths (they may not exist yet)
#   hack/build-node-tools.sh --debs    # only the Debian packages (used by make image)
#
# Output: one `name=path` line each for kubelet, containerd (a bin dir with containerd,
# containerd-shim-runc-v2, ctr), pause (an OCI archive) and pause_ref (its image name).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/thunder-dra"
kubelet_mod="$here/tools/kubelet"
containerd_mod="$here/tools/containerd"
go_version=$(go env GOVERSION)

modver() { awk -v m="$2" '$1==m{print $2} $2==m{print $3}' "$1/go.mod" | head -n1; }
k8s_version=$(modver "$kubelet_mod" k8s.io/kubernetes)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
ctrd_version=$(modver "$containerd_mod" github.com/containerd/containerd/v2)

kubelet_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kubelet_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  kubelet_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
kubelet_tags="selinux,notest,grpcnotrace"
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$ctrd_version"
ctrd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
ctrd_tags="no_btrfs,no_devmapper,no_zfs,no_aufs"

kubelet_key=$( { cat "$kubelet_mod/go.mod" "$kubelet_mod/go.sum";
                 echo "$go_version $kubelet_tags $kubelet_ldflags"; } | sha256sum | cut -c1-16)
ctrd_key=$( { cat "$containerd_mod/go.mod" "$containerd_mod/go.sum";
              echo "$go_version $ctrd_tags $ctrd_ldflags"; } | sha256sum | cut -c1-16)
pause_tag="3.10.2"
pause_cflags="-Os -Wall -Werror -static -DVERSION=v$pause_tag-$k8s_version"
pause_key=$(echo "$k8s_version $pause_tag $pause_cflags" | sha256sum | cut -c1-16)

kubelet_bin="$cache_root/kubelet/$k8s_version-$kubelet_key"
ctrd_bin="$cache_root/containerd/$ctrd_version-$ctrd_key"
pause_dir="$cache_root/pause/$pause_tag-$pause_key"
pause_ref="localhost/thunder-dra/pause:$pause_tag"

print_paths() {
  echo "kubelet=$kubelet_bin/kubelet"
  echo "containerd=$ctrd_bin"
  echo "pause=$pause_dir/pause.oci.tar"
  echo "pause_ref=$pause_ref"
}

debs=(runc containernetworking-plugins umoci mmdebstrap socat busybox-static gcc libc6-dev)
ensure_debs() {
  local missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-node-tools: missing Debian packages ${missing[*]} and not root (or no apt-get)" >&2
    return 3
  fi
  echo "build-node-tools: installing ${missing[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

build_kubelet() {
  [ -x "$kubelet_bin/kubelet" ] && return 0
  mkdir -p "$cache_root/kubelet"
  local tmp start
  tmp=$(mktemp -d "$cache_root/kubelet/.build-XXXXXX")
  start=$(date +%s)
  echo "building kubelet $k8s_version into $kubelet_bin (first time only; ~5-10 min on 2 cores)" >&2
  ( cd "$kubelet_mod" && CGO_ENABLED=0 nice -n 5 go build -buildvcs=false -trimpath \
      -tags="$kubelet_tags" -ldflags "$kubelet_ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet ) \
    || { rm -rf "$tmp"; return 1; }
  rm -rf "$kubelet_bin"; chmod 755 "$tmp"; mv "$tmp" "$kubelet_bin"
  echo "kubelet built in $(( $(date +%s) - start ))s" >&2
}

build_containerd() {
  [ -x "$ctrd_bin/containerd" ] && [ -x "$ctrd_bin/containerd-shim-runc-v2" ] && [ -x "$ctrd_bin/ctr" ] && return 0
  mkdir -p "$cache_root/containerd"
  local tmp start
  tmp=$(mktemp -d "$cache_root/containerd/.build-XXXXXX")
  start=$(date +%s)
  echo "building containerd $ctrd_version into $ctrd_bin (first time only; ~3-6 min on 2 cores)" >&2
  ( cd "$containerd_mod" && CGO_ENABLED=0 nice -n 5 go build -buildvcs=false -trimpath \
      -tags="$ctrd_tags" -ldflags "$ctrd_ldflags" -o "$tmp/" \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr ) \
    || { rm -rf "$tmp"; return 1; }
  rm -rf "$ctrd_bin"; chmod 755 "$tmp"; mv "$tmp" "$ctrd_bin"
  echo "containerd built in $(( $(date +%s) - start ))s" >&2
}

build_pause() {
  [ -f "$pause_dir/pause.oci.tar" ] && return 0
  mkdir -p "$cache_root/pause"
  local tmp src
  tmp=$(mktemp -d "$cache_root/pause/.build-XXXXXX")
  src=$(cd "$kubelet_mod" && go mod download -json k8s.io/kubernetes | sed -n -E 's/^\s*"Dir": "(.*)",?$/\1/p')
  [ -f "$src/build/pause/linux/pause.c" ] || { echo "no pause.c in $src" >&2; rm -rf "$tmp"; return 1; }
  mkdir -p "$tmp/rootfs-add"
  # shellcheck disable=SC2086
  gcc $pause_cflags -o "$tmp/rootfs-add/pause" "$src/build/pause/linux/pause.c"
  (
    cd "$tmp"
    umoci init --layout layout
    umoci new --image "layout:$pause_tag"
    umoci unpack --image "layout:$pause_tag" bundle >/dev/null
    install -m 0755 rootfs-add/pause bundle/rootfs/pause
    umoci repack --image "layout:$pause_tag" bundle
    umoci config --image "layout:$pause_tag" --config.entrypoint /pause --config.user 65535:65535 \
      --author thunder-device-plugin --history.comment "pause from k8s.io/kubernetes $k8s_version"
    umoci gc --layout layout
    tar -C layout --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf pause.oci.tar .
  ) >/dev/null
  mkdir -p "$pause_dir"
  mv "$tmp/pause.oci.tar" "$pause_dir/pause.oci.tar"
  rm -rf "$tmp"
}

case "${1:-}" in
  --print) print_paths; exit 0 ;;
  --debs) ensure_debs; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--print|--debs]" >&2; exit 64 ;;
esac

ensure_debs
build_pause
build_containerd
build_kubelet
print_paths
