"""Thunder install commands: the host (GPU server) install and the KubeVirt guest script.

Neither ever puts an enrollment token on a command line, so no token shows in a host's or
guest's process list (``/proc/<pid>/cmdline`` is readable by every user) or in a sudo log,
and neither uses ``sudo`` (thunder-api.md 3.2, 3.4):

- **Host.** The daemon already runs as root in the host's namespaces. It runs ``sh -s``
  with the installer text it fetched and verified itself on standard input, and every
  setting, the server token included, in that process's environment only
  (:func:`host_install_env`; ``/proc/<pid>/environ`` is readable by root alone). No
  second download, no ``curl | sudo``.
- **Guest.** Cloud-init runs the script as root. It reads the token from the file the
  VM's Secret provides, exports it, downloads the installer to a private temporary file,
  checks its SHA-256 when the deployment pins one, and runs it with ``sh``.

These functions only build text, argv and environments;
:mod:`thunder_dra.plugin.node.hostrunner` runs them.
"""

from __future__ import annotations

import ipaddress
import re

TOKEN_ENV = "THUNDER_ENROLLMENT_TOKEN"
GUEST_TOKEN_FILE_ENV = "THUNDER_ENROLLMENT_TOKEN_FILE"
GUEST_SETUP_MOUNT = "/mnt/thunder-setup"
GUEST_TOKEN_KEY = "enrollment-token"
GUEST_SCRIPT_KEY = "install-thunder-client.sh"
GUEST_SECRET_SUFFIX = "-thunder-setup"
HOST_INSTALL_COMMAND = ("sh", "-s")
"""The host install: a POSIX shell reading the installer text from standard input."""
_MAX_SECRET_NAME = 253
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class InstallCommandError(ValueError):
    """An install command cannot be built from the given settings."""


def shell_quote(value: str) -> str:
    """``value`` as one single-quoted POSIX shell word; ``'`` becomes ``'"'"'``."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _require(name: str, value: str) -> str:
    if not value or "\x00" in value:
        raise InstallCommandError(f"{name} must be a non-empty string without NUL bytes")
    return value


def _central_url(api_url: str) -> str:
    return _require("the Thunder API URL", api_url).rstrip("/")


def guest_secret_name(claim_name: str) -> str:
    """The VM's setup Secret: ``<claim-name>-thunder-setup``."""
    name = f"{_require('the claim name', claim_name)}{GUEST_SECRET_SUFFIX}"
    if len(name) > _MAX_SECRET_NAME:
        raise InstallCommandError(
            f"Secret name for claim {claim_name!r} would exceed {_MAX_SECRET_NAME} characters"
        )
    return name


def guest_install_script(
    *, api_url: str, install_url: str, installer_sha256: str | None = None
) -> str:
    """The bash script cloud-init runs (as root) in the VM to install the Thunder client.

    It reads the token from ``${THUNDER_ENROLLMENT_TOKEN_FILE:-/mnt/thunder-setup/
    enrollment-token}``, fails if it is missing or empty, exports it, downloads the
    installer completely to a private temporary file, refuses it if ``installer_sha256``
    is given and differs, and runs it with ``sh`` in client mode.
    """
    install = shell_quote(_require("the installer URL", install_url))
    central = shell_quote(_central_url(api_url))
    default_file = f"{GUEST_SETUP_MOUNT}/{GUEST_TOKEN_KEY}"
    if installer_sha256 is not None and not _SHA256.match(installer_sha256):
        raise InstallCommandError("the installer SHA-256 must be 64 lower-case hex digits")
    check = ""
    if installer_sha256 is not None:
        check = f"""actual="$(sha256sum "$installer" | cut -d ' ' -f 1)"
if [ "$actual" != {shell_quote(installer_sha256)} ]; then
  echo "install-thunder-client: installer "{install}" has SHA-256 $actual, not the pinned \\
{installer_sha256}; refused" >&2
  exit 1
fi
"""
    return f"""#!/usr/bin/env bash
# Installs the Thunder client in this VM; run by cloud-init (as root) from the claim's
# {GUEST_SECRET_SUFFIX[1:]} Secret. The enrollment token comes from a file and is passed in the
# environment only, never on a command line.
set -euo pipefail

token_file="${{{GUEST_TOKEN_FILE_ENV}:-{default_file}}}"
{TOKEN_ENV}="$(tr -d '[:space:]' 2>/dev/null < "$token_file" || true)"
if [ -z "${TOKEN_ENV}" ]; then
  echo "install-thunder-client: no enrollment token in $token_file" >&2
  exit 1
fi
export {TOKEN_ENV}
export THUNDER_INSTALL_MODE=client THUNDER_NOWARN=1 THUNDER_CENTRAL_URL={central}

installer="$(mktemp)"
trap 'rm -f "$installer"' EXIT
curl -fsSL {install} -o "$installer"
{check}sh "$installer"
"""


def host_install_env(
    *,
    server_token: str,
    api_url: str,
    advertised_ip: str,
    zone_name: str,
    node_name: str,
    port_range: tuple[int, int] | None = None,
) -> dict[str, str]:
    """The environment of :data:`HOST_INSTALL_COMMAND`: the variables of thunder-api.md 3.2.

    ``zone_name`` is the zone's display name, not its ID. The token is only ever a value
    here; the caller passes this as the runner's ``env`` and the installer text as input.
    """
    try:
        ipaddress.ip_address(advertised_ip)
    except ValueError as err:
        raise InstallCommandError(f"advertised IP {advertised_ip!r} is not an IP address") from err
    env = {
        "THUNDERD_TRANSIENT": "1",
        "THUNDER_INSTALL_MODE": "thunderd",
        "THUNDER_CENTRAL_URL": _central_url(api_url),
        TOKEN_ENV: _require("the server enrollment token", server_token),
        "THUNDERD_IP": advertised_ip,
        "THUNDER_ZONE": _require("the zone name", zone_name),
        "THUNDERD_NODE_NAME": _require("the node name", node_name),
    }
    if port_range is not None:
        start, end = port_range
        if not 1 <= start <= end <= 65535:
            raise InstallCommandError(f"port range {start}-{end} is not within 1-65535")
        env["THUNDERD_PORT_RANGE"] = f"{start}-{end}"
    return env


def host_restart_command(
    *, advertised_ip: str, zone_name: str, node_name: str
) -> tuple[list[str], dict[str, str]]:
    """Argv and environment that restart thunderd on an enrolled node, no new token.

    thunder-api.md 3.3.
    """
    argv = [
        "thunder",
        "up",
        "--ip",
        _require("the advertised IP", advertised_ip),
        "--zone",
        _require("the zone name", zone_name),
        "--node-name",
        _require("the node name", node_name),
    ]
    return argv, {"THUNDERD_TRANSIENT": "1"}
