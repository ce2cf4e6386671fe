#!/usr/bin/env bash
# Builds and pushes the operator and daemon images from containers/ with docker.
# Needs a working docker engine (`docker info` must succeed); stops with a message
# and exit code 2 otherwise.
#
#   release/images.sh build     # both images, for the local platform (make image-docker)
#   release/images.sh push      # push both (make push)
#   release/images.sh buildx    # multi-platform build and push with buildx (make image-buildx)
#
# Settings (environment): REGISTRY (ghcr.io/thunder-compute), IMAGE_TAG (default:
# <pyproject version>-<commit time of HEAD in UTC>), BUILD_VERSION (the package version
# stamped into the images), PLATFORMS (linux/amd64,linux/arm64, for buildx).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

action=${1:-}
case "$action" in build|push|buildx) ;; *) echo "usage: $0 build|push|buildx" >&2; exit 64 ;; esac

if ! command -v docker >/dev/null 2>&1; then
  echo "make image/push/image-buildx need docker, and there is no docker command here." >&2
  echo "Install docker (or run on a machine with a docker engine) and try again." >&2
  exit 2
fi
if ! docker info >/dev/null 2>&1; then
  echo "make image/push/image-buildx need a running docker engine, and 'docker info' failed." >&2
  echo "Start the docker daemon (or set DOCKER_HOST) and try again." >&2
  exit 2
fi

project_version=$(sed -n -E 's/^version = "(.*)"/\1/p' pyproject.toml | head -n1)
VERSION=${BUILD_VERSION:-$project_version}
if [ -z "${IMAGE_TAG:-}" ]; then
  stamp=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%dT%H%M%SZ 2>/dev/null \
          || date -u +%Y%m%dT%H%M%SZ)
  IMAGE_TAG="$VERSION-$stamp"
fi
REGISTRY=${REGISTRY:-ghcr.io/thunder-compute}
PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}
operator="$REGISTRY/thunder-device-plugin-operator:$IMAGE_TAG"
daemon="$REGISTRY/thunder-device-plugin:$IMAGE_TAG"

case "$action" in
  build)
    DOCKER_BUILDKIT=1 docker build -f containers/operator.Dockerfile --build-arg "VERSION=$VERSION" -t "$operator" .
    DOCKER_BUILDKIT=1 docker build -f containers/daemon.Dockerfile --build-arg "VERSION=$VERSION" -t "$daemon" .
    ;;
  push)
    docker push "$operator"
    docker push "$daemon"
    ;;
  buildx)
    docker buildx build --platform "$PLATFORMS" -f containers/operator.Dockerfile \
      --build-arg "VERSION=$VERSION" -t "$operator" --push .
    docker buildx build --platform "$PLATFORMS" -f containers/daemon.Dockerfile \
      --build-arg "VERSION=$VERSION" -t "$daemon" --push .
    ;;
esac
echo "operator: $operator"
echo "daemon:   $daemon"
