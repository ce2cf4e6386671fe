#!/usr/bin/env bash
# Installs runc and a static busybox from Debian's packages when they are missing, so
# the end-to-end test can run a real container with the CDI edits the daemon writes.
# Needs root (CI and the development machines run as root); elsewhere it says why and
# exits 0, and the test that needs runc skips with that reason.
#
#   hack/ensure-runc.sh
set -uo pipefail
have() { command -v runc >/dev/null 2>&1 && [ -x /bin/busybox -o -x /usr/bin/busybox ]; }
have && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-runc: not root or no apt-get; the runc container test will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q runc busybox-static >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q runc busybox-static >/dev/null 2>&1; } \
  || echo "ensure-runc: could not install runc and busybox-static; the runc test will be skipped" >&2
exit 0
