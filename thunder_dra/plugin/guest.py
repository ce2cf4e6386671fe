"""Thunder install commands: the host (GPU server) install and the KubeVirt guest script.

Both pipe the Thunder installer into ``sudo ... sh`` with settings as environment
assignments, values single-quoted (an inner ``'`` written ``'"'"'``), as the Thunder
contract shows them (thunder-api.md 3.2, 3.4).

Neither text ever holds an enrollment token. The guest script reads it from the file the
VM's Secret provides. The host command refers to ``$THUNDER_ENROLLMENT_TOKEN``, which the
caller passes in the runner's ``env`` (:func:`host_install_env`): the token then stays
out of the daemon's logs and out of the command line ``ps`` shows for the shell. These
functions only build text; :mod:`thunder_dra.plugin.hostrunner` runs it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

TOKEN_ENV = "THUNDER_ENROLLMENT_TOKEN"
GUEST_TOKEN_FILE_ENV = "THUNDER_ENROLLMENT_TOKEN_FILE"
GUEST_SETUP_MOUNT = "/mnt/thunder-setup"
GUEST_TOKEN_KEY = "enrollment-token"
GUEST_SCRIPT_KEY = "install-thunder-client.sh"
GUEST_SECRET_SUFFIX = "-thunder-setup"
_MAX_SECRET_NAME = 253


class InstallCommandError(ValueError):
    """An install command cannot be built from the given settings."""


def shell_quote(value: str) -> str:
    """``value`` as one single-quoted POSIX shell word; ``'`` becomes ``'"'"'``."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _assign(name: str, value: str) -> str:
    return f"{name}={shell_quote(value)}"


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


def guest_install_script(*, api_url: str, install_url: str) -> str:
    """The bash script cloud-init runs in the VM to install the Thunder client.

    It reads the token from ``${THUNDER_ENROLLMENT_TOKEN_FILE:-/mnt/thunder-setup/
    enrollment-token}``, fails if it is missing or empty, exports it and runs the
    client-mode install.
    """
    install = shell_quote(_require("the installer URL", install_url))
    central = shell_quote(_central_url(api_url))
    default_file = f"{GUEST_SETUP_MOUNT}/{GUEST_TOKEN_KEY}"
    return f"""#!/usr/bin/env bash
# Installs the Thunder client in this VM; run by cloud-init from the claim's
# {GUEST_SECRET_SUFFIX[1:]} Secret. The enrollment token comes from a file, never from this script.
set -euo pipefail

token_file="${{{GUEST_TOKEN_FILE_ENV}:-{default_file}}}"
{TOKEN_ENV}="$(tr -d '[:space:]' 2>/dev/null < "$token_file" || true)"
if [ -z "${TOKEN_ENV}" ]; then
  echo "install-thunder-client: no enrollment token in $token_file" >&2
  exit 1
fi
export {TOKEN_ENV}

curl -fsSL {install} | sudo THUNDER_INSTALL_MODE=client THUNDER_NOWARN=1 \\
  THUNDER_CENTRAL_URL={central} {TOKEN_ENV}="${{{TOKEN_ENV}}}" sh
"""


def host_install_command(
    *,
    install_url: str,
    api_url: str,
    advertised_ip: str,
    zone_name: str,
    node_name: str,
    port_range: tuple[int, int] | None = None,
) -> str:
    """The ``/bin/sh -c`` text that enrolls this node as a Thunder GPU server.

    Run it with ``env=host_install_env(server_token)``; the text fails before installing
    if the variable is missing. ``zone_name`` is the zone's display name, not its ID.
    """
    try:
        ipaddress.ip_address(advertised_ip)
    except ValueError as err:
        raise InstallCommandError(f"advertised IP {advertised_ip!r} is not an IP address") from err
    assignments = [
        "THUNDERD_TRANSIENT=1",  # first after sudo: the contract keys transient mode on it
        "THUNDER_INSTALL_MODE=thunderd",
        _assign("THUNDER_CENTRAL_URL", _central_url(api_url)),
        f'{TOKEN_ENV}="${{{TOKEN_ENV}:?the server enrollment token is not set}}"',
        _assign("THUNDERD_IP", advertised_ip),
        _assign("THUNDER_ZONE", _require("the zone name", zone_name)),
        _assign("THUNDERD_NODE_NAME", _require("the node name", node_name)),
    ]
    if port_range is not None:
        start, end = port_range
        if not 1 <= start <= end <= 65535:
            raise InstallCommandError(f"port range {start}-{end} is not within 1-65535")
        assignments.append(_assign("THUNDERD_PORT_RANGE", f"{start}-{end}"))
    install = shell_quote(_require("the installer URL", install_url))
    return f"curl -fsSL {install} | sudo {' '.join(assignments)} sh"


def host_install_env(server_token: str) -> Mapping[str, str]:
    """The runner ``env`` that hands the server token to :func:`host_install_command`."""
    return {TOKEN_ENV: _require("the server enrollment token", server_token)}


def host_restart_command(*, advertised_ip: str, zone_name: str, node_name: str) -> str:
    """Restarts thunderd on an already enrolled node, without a new token (3.3)."""
    return (
        "THUNDERD_TRANSIENT=1 thunder up"
        f" --ip {shell_quote(_require('the advertised IP', advertised_ip))}"
        f" --zone {shell_quote(_require('the zone name', zone_name))}"
        f" --node-name {shell_quote(_require('the node name', node_name))}"
    )
