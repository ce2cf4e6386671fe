#!/usr/bin/env bash
# Installs what `make push` and the registry tests need from Debian's packages when it
# is missing: docker-registry (the CNCF distribution registry, `hack/registry.py` runs
# it on loopback) and skopeo (copies the OCI archives `make image` builds into a
# registry). Debian's package would also enable a system-wide registry service on port
# 5000: a policy-rc.d keeps apt from starting it, and the service is disabled, so the
# only registries on this machine are the ones the project starts.
# Needs root; elsewhere, or as root when apt-get fails, it says why and exits 1.
#
#   hack/ensure-registry.sh
set -uo pipefail
have() { command -v docker-registry >/dev/null 2>&1 && command -v skopeo >/dev/null 2>&1; }
have && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-registry: docker-registry or skopeo missing, and not root (or no apt-get)" >&2
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
. "$(dirname "$0")/apt-install.sh"
apt_install "$log" --no-install-recommends docker-registry skopeo
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable docker-registry.service >/dev/null 2>&1 || true
fi
if ! have; then
  tail -n 30 "$log" >&2
  echo "ensure-registry: could not install docker-registry and skopeo (apt-get's output above)" >&2
  exit 1
fi
exit 0
