#!/usr/bin/env bash
# Installs runc and a static busybox from Debian's packages when they are missing, so
# the end-to-end test can run a real container with the CDI edits the daemon writes.
# Needs root (CI and the development machines run as root); elsewhere it says why and
# exits 0, and the test that needs runc skips with that reason. As root, a failed
# install fails the script (exit 1) with apt-get's output: `make test` stops there
# rather than running with the runc test skipped.
#
#   hack/ensure-runc.sh
set -uo pipefail
have() { command -v runc >/dev/null 2>&1 && [ -x /bin/busybox -o -x /usr/bin/busybox ]; }
have && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-runc: not root or no apt-get; the runc container test will be skipped" >&2
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
. "$(dirname "$0")/apt-install.sh"
apt_install "$log" runc busybox-static
if ! have; then
  tail -n 30 "$log" >&2
  echo "ensure-runc: could not install runc and busybox-static (apt-get's output above);" \
    "the runc container test needs them" >&2
  exit 1
fi
exit 0
