#!/usr/bin/env bash
# Installs promtool (Debian's `prometheus` package) when it is missing, so the tests can
# check the shipped alert rules (`promtool check rules`, `promtool test rules`) and both
# processes' /metrics output (`promtool check metrics`). The package's Prometheus server
# is not used, and its service is not started (policy-rc.d refuses it while installing).
# Needs root and apt-get; without them it says why and exits 1, as does a failed install
# (with apt-get's output): `make test` stops there rather than failing later in a test.
#
#   hack/ensure-promtool.sh
set -uo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-promtool: promtool is missing and this is not root with apt-get;" \
    "install Debian's or Prometheus's promtool on PATH" >&2
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
. "$(dirname "$0")/apt-install.sh"
apt_install "$log" --no-install-recommends prometheus
if ! command -v promtool >/dev/null 2>&1; then
  tail -n 30 "$log" >&2
  echo "ensure-promtool: could not install Debian's prometheus package (apt-get's output" \
    "above); the alert rule and metrics tests need its promtool" >&2
  exit 1
fi
exit 0
