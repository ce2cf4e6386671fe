"""Fake host ``thunder`` CLI driven by ``$THUNDER_FAKE_HOST/thunder.json`` (thunder-api.md 3.3).

``thunder status --json`` prints the healthy, unhealthy, activating or unenrolled shape
(non-zero exit with valid JSON for all but healthy) or exits 127 when not installed.
``thunder up --ip .. --zone .. --node-name ..`` makes an enrolled thunderd healthy again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from hack.fake_host.state import FakeHost

_ENV_PATH = "/etc/thunder/thunderd.env"


def _status_document(state: dict[str, Any]) -> dict[str, Any]:
    status = state.get("status", "healthy")
    enrolled = bool(state.get("enrollment")) and status != "unenrolled"
    running = status == "healthy"
    active = {"healthy": "active", "activating": "activating"}.get(status, "failed")
    sub_state = {"healthy": "running", "activating": "start"}.get(status, "failed")
    document: dict[str, Any] = {
        "service": {
            "service": "thunderd.service",
            "active": active,
            "enabled": "transient" if state.get("transient", True) else "enabled",
            "load": "loaded",
            "subState": sub_state,
        },
        "localApi": {
            "healthy": running,
            "error": "" if running else "dial tcp 127.0.0.1:7070: connect: connection refused",
        },
        "config": {
            "envPath": _ENV_PATH,
            "authTokenConfigured": enrolled,
            "error": "" if enrolled else f"no auth token in {_ENV_PATH}",
        },
        "healthy": running and enrolled,
        "warnings": [] if running else [f"thunderd.service is {active}"],
        "diagnostics": [],
        "recentLogs": ["thunderd: serving"] if running else ["thunderd: exited"],
    }
    if not running:
        document["diagnostics"].append(
            {
                "severity": "error",
                "message": f"thunderd.service is {active}",
                "action": "run: thunder up",
            }
        )
    return document


def _status(host: FakeHost, args: argparse.Namespace) -> int:
    document = _status_document(host.thunder())
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print("healthy" if document["healthy"] else "unhealthy")
    return 0 if document["healthy"] else 1


def _up(host: FakeHost, args: argparse.Namespace) -> int:
    state = host.thunder()
    if not state.get("enrollment"):
        print("thunder up: thunderd is not enrolled; run the installer first", file=sys.stderr)
        return 1
    last_up = {"ip": args.ip, "zone": args.zone, "nodeName": args.node_name}
    last_up["transient"] = os.environ.get("THUNDERD_TRANSIENT") == "1"
    host.update_thunder({"status": "healthy", "lastUp": last_up})
    print("thunderd.service started")
    return 0


def main(argv: list[str]) -> int:
    host = FakeHost.from_env()
    host.log_call("thunder", argv, dict(os.environ))
    if not host.thunder().get("installed"):
        print("sh: 1: thunder: not found", file=sys.stderr)
        return 127
    parser = argparse.ArgumentParser(prog="thunder")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status")
    status.add_argument("--json", action="store_true")
    up = commands.add_parser("up")
    up.add_argument("--ip", required=True)
    up.add_argument("--zone", required=True)
    up.add_argument("--node-name", required=True)
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(host, args)
    return _up(host, args)
