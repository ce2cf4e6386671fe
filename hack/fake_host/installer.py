"""Fake ``thunder-fake-installer``: what the real installer would do, against the fakes.

The fake artifact host's ``install.sh`` execs this when it is on PATH, with the variables of
thunder-api.md 3.2 (or 3.4) in its environment (from the daemon, or through a ``sudo VAR=value``):

- ``THUNDER_INSTALL_MODE=thunderd``: consume the server enrollment token by registering a
  host with the fake service (``POST <THUNDER_CENTRAL_URL>/_admin/hosts``) in the zone named
  ``THUNDER_ZONE``, with the GPU model and count of the fake ``nvidia-smi`` state, then
  record thunderd as installed, enrolled and healthy in the state directory.
- ``THUNDER_INSTALL_MODE=client``: exchange the client token (thunder-api.md 2.9) and write
  ``client-config.json`` with the keys of thunder-api.md section 4.

Every run is recorded in ``installs.log``: a ``start`` line (``concurrent``: another
install was running on this host at the time; ``tokenInArgv``: the enrollment token
appeared in the argv of this process or of any ancestor, e.g. a ``sudo VAR=value``;
``ancestors``: their argv with token values masked) and an ``end`` line. ``installer.json``
``delaySeconds`` makes an install take that long, so overlaps and process lists can be
observed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from hack.fake_host.state import (
    CLIENT_CONFIG_FILE,
    INSTALLER_LOCK_FILE,
    MASK,
    FakeHost,
    masked_argv,
    write_json_atomic,
)

_THUNDERD_REQUIRED = (
    "THUNDER_CENTRAL_URL",
    "THUNDER_ENROLLMENT_TOKEN",
    "THUNDERD_IP",
    "THUNDER_ZONE",
    "THUNDERD_NODE_NAME",
)
_MODEL = re.compile(r"\b([A-Z]{1,3}\d{1,4}[A-Za-z]?)\b")
_TELEMETRY_URL = "https://telemetry.thundercompute.com:2096"


class InstallError(Exception):
    pass


def gpu_model(config: dict[str, Any]) -> str:
    """The model thunderd registers: ``gpuType`` if set, else parsed from the first name
    (``NVIDIA H100 80GB HBM3`` gives ``H100``, ``NVIDIA RTX A6000`` gives ``A6000``)."""
    if config.get("gpuType"):
        return str(config["gpuType"])
    names = [gpu.get("name", "") for gpu in config.get("gpus") or []]
    if not names:
        raise InstallError("nvidia-smi lists no GPUs; thunderd has nothing to serve")
    found = _MODEL.search(names[0].removeprefix("NVIDIA "))
    return found.group(1) if found else names[0]


def _post(url: str, body: dict[str, Any], bearer: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        detail = error.read()[:300].decode(errors="replace")
        raise InstallError(f"{url} answered {error.code}: {detail}") from None
    except urllib.error.URLError as error:
        raise InstallError(f"cannot reach {url}: {error.reason}") from None
    if not isinstance(answer, dict):
        raise InstallError(f"{url} answered a non-object")
    return answer


def _port_range(value: str | None) -> str | None:
    if value is None:
        return None
    start, sep, end = value.partition("-")
    if not (sep and start.isdigit() and end.isdigit() and int(start) <= int(end)):
        raise InstallError(f"THUNDERD_PORT_RANGE must be START-END, got {value!r}")
    return value


def install_thunderd(host: FakeHost, env: dict[str, str]) -> None:
    missing = [name for name in _THUNDERD_REQUIRED if not env.get(name)]
    if missing:
        raise InstallError(f"missing variables: {', '.join(missing)}")
    nvidia = host.nvidia()
    if nvidia.get("mode", "ok") != "ok":
        raise InstallError("no working NVIDIA driver (nvidia-smi fails)")
    central = env["THUNDER_CENTRAL_URL"].rstrip("/")
    port_range = _port_range(env.get("THUNDERD_PORT_RANGE"))
    registered = _post(
        f"{central}/_admin/hosts",
        {
            "enrollmentToken": env["THUNDER_ENROLLMENT_TOKEN"],
            "zoneName": env["THUNDER_ZONE"],
            "hostname": env["THUNDERD_NODE_NAME"],
            "displayName": env["THUNDERD_NODE_NAME"],
            "gpuType": gpu_model(nvidia),
            "gpuCount": len(nvidia.get("gpus") or []),
            "ip": env["THUNDERD_IP"],
        },
    )
    enrollment = {
        "hostId": registered.get("hostId"),
        "zoneId": registered.get("zoneId"),
        "enrollmentTokenId": registered.get("enrollmentTokenId"),
        "zoneName": env["THUNDER_ZONE"],
        "ip": env["THUNDERD_IP"],
        "nodeName": env["THUNDERD_NODE_NAME"],
        "portRange": port_range,
        "centralUrl": central,
    }
    host.update_thunder(
        {
            "installed": True,
            "status": "healthy",
            "transient": env.get("THUNDERD_TRANSIENT") == "1",
            "enrollment": enrollment,
        }
    )
    print(f"thunderd installed and enrolled as host {enrollment['hostId']}")


def install_client(host: FakeHost, env: dict[str, str]) -> None:
    missing = [n for n in ("THUNDER_CENTRAL_URL", "THUNDER_ENROLLMENT_TOKEN") if not env.get(n)]
    if missing:
        raise InstallError(f"missing variables: {', '.join(missing)}")
    central = env["THUNDER_CENTRAL_URL"].rstrip("/")
    answer = _post(
        f"{central}/api/v1/enrollment-tokens/enroll",
        {"hostname": os.uname().nodename},
        bearer=env["THUNDER_ENROLLMENT_TOKEN"].strip(),
    )
    payload_part = str(answer.get("jwt", "")).split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload_part + "=" * (-len(payload_part) % 4)))
    config = {
        "deviceId": claims["clientId"],
        "clientId": claims["clientId"],
        "orgId": claims["orgId"],
        "gpuType": claims["gpuType"],
        "gpuCount": claims["gpuCount"],
        "centralApiUrl": central,
        "authToken": answer["authToken"],
        "claims": answer["jwt"],
        "enableGrpcTls": False,
        "thunderdDiscoveryEnabled": True,
        "telemetryCollector": _TELEMETRY_URL,
    }
    write_json_atomic(host.root / CLIENT_CONFIG_FILE, config)
    print(f"thunder client installed as {claims['clientId']}")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def ancestry() -> list[list[str]]:
    """The argv of this process and of each ancestor up to (not including) PID 1."""
    chain: list[list[str]] = []
    pid = os.getpid()
    while pid > 1 and len(chain) < 64:
        chain.append(_cmdline(pid))
        pid = _parent(pid)
    return chain


def _hide(argv: list[str], token: str) -> list[str]:
    return [word.replace(token, MASK) if token else word for word in argv]


@contextlib.contextmanager
def _install_slot(host: FakeHost) -> Iterator[bool]:
    """Holds the host's install lock; yields whether another install held it already."""
    fd = os.open(host.root / INSTALLER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            concurrent = False
        except BlockingIOError:
            concurrent = True  # carry on regardless: a real installer has no such lock
        yield concurrent
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    host = FakeHost.from_env()
    env = dict(os.environ)
    host.log_call("thunder-fake-installer", argv, env)
    mode = env.get("THUNDER_INSTALL_MODE", "")
    token = env.get("THUNDER_ENROLLMENT_TOKEN", "").strip()
    with _install_slot(host) as concurrent:
        chain = ancestry()
        host.log_install(
            {
                "event": "start",
                "pid": os.getpid(),
                "mode": mode,
                "concurrent": concurrent,
                "tokenInArgv": bool(token) and any(token in word for a in chain for word in a),
                "ancestors": [_hide(masked_argv(a), token) for a in chain],
            }
        )
        settings = host.installer_settings()
        delay = float(settings.get("delaySeconds") or 0)
        if delay > 0:
            time.sleep(delay)
        if settings.get("fail"):
            print("thunder installer: failed (installer.json fail)", file=sys.stderr)
            code = 1
        else:
            code = _install(host, env, mode)
        host.log_install({"event": "end", "pid": os.getpid(), "mode": mode, "exitCode": code})
    return code


def _install(host: FakeHost, env: dict[str, str], mode: str) -> int:
    try:
        if mode == "thunderd":
            install_thunderd(host, env)
        elif mode == "client":
            install_client(host, env)
        else:
            raise InstallError(f"THUNDER_INSTALL_MODE must be thunderd or client, got {mode!r}")
    except InstallError as error:
        print(f"thunder installer: {error}", file=sys.stderr)
        return 1
    return 0
