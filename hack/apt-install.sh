# Sourced by the hack/ensure-*.sh scripts: installs Debian packages, as root.
#
#   . hack/apt-install.sh; apt_install LOG [APT_ARGS...] PACKAGE...
#
# Runs `apt-get install -y -q` with the arguments, and once more after an `apt-get
# update` when the first try fails (a machine whose package lists are missing or old),
# appending apt-get's output to LOG. While it runs, a policy-rc.d (unless the machine has
# one) keeps the packages' services from starting: the tests start only the processes
# they run themselves. Returns apt-get's status.
apt_install() {
  local log=$1 policy=/usr/sbin/policy-rc.d own_policy=0 status
  shift
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
  fi
  apt-get install -y -q "$@" >>"$log" 2>&1 \
    || { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q "$@" >>"$log" 2>&1; }
  status=$?
  if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi
  return "$status"
}
