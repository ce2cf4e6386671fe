"""Run the local control plane by hand.

    python -m hack.cluster up [--emulated-version 1.34] [--feature-gates A=true,B=false]
    python -m hack.cluster env      # prints: export KUBECONFIG=...; export PATH=...
    python -m hack.cluster status
    python -m hack.cluster down

``up`` leaves the processes running in the background and records them in
``$THUNDER_DRA_CLUSTER_DIR`` (default ``${XDG_RUNTIME_DIR:-/tmp}/thunder-dra-cluster``);
``down`` stops them and removes that directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from hack import supervise
from hack.cluster.launcher import EMULATED_VERSIONS, Cluster, ClusterConfig, ClusterError


def state_dir() -> Path:
    default = Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp")) / "thunder-dra-cluster"
    return Path(os.environ.get("THUNDER_DRA_CLUSTER_DIR", str(default)))


def parse_gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"feature gate {item!r} is not NAME=true|false")
        gates[name] = value.lower() == "true"
    return gates


def _load_state() -> dict[str, object] | None:
    path = state_dir() / "state.json"
    if not path.exists():
        return None
    state: dict[str, object] = json.loads(path.read_text())
    return state


def cmd_up(args: argparse.Namespace) -> int:
    if (state := _load_state()) is not None:
        pids = state.get("pids", {})
        if isinstance(pids, dict) and all(supervise.alive(int(p)) for p in pids.values()):
            print(f"already running; kubeconfig {state['kubeconfig']}", file=sys.stderr)
            return 0
        cmd_down(args)
    workdir = state_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    config = ClusterConfig(emulated_version=args.emulated_version, feature_gates=args.feature_gates)
    cluster = Cluster(workdir=workdir, config=config, tie_to_parent=False)
    try:
        cluster.start()
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    state = {
        "kubeconfig": str(cluster.kubeconfig),
        "server": cluster.server,
        "binDir": str(cluster.bin_dir),
        "version": config.version,
        "pids": cluster.pids,
    }
    (workdir / "state.json").write_text(json.dumps(state, indent=2))
    print(f"control plane {config.version} up at {cluster.server}", file=sys.stderr)
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    state = _load_state()
    if state is not None:
        pids = state.get("pids", {})
        if isinstance(pids, dict):
            supervise.stop_pids((int(pid) for pid in pids.values()), 15)
    shutil.rmtree(state_dir(), ignore_errors=True)
    return 0


def cmd_env(_: argparse.Namespace) -> int:
    state = _load_state()
    if state is None:
        print("no control plane is running; run: python -m hack.cluster up", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['binDir']}:$PATH")
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    state = _load_state()
    if state is None:
        print("down")
        return 1
    pids = state.get("pids", {})
    ok = True
    if isinstance(pids, dict):
        for name, pid in pids.items():
            alive = supervise.alive(int(pid))
            ok = ok and alive
            print(f"{name:26} pid {pid:<8} {'running' if alive else 'STOPPED'}")
    print(f"version {state['version']}, server {state['server']}, kubeconfig {state['kubeconfig']}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane in the background")
    up.add_argument("--emulated-version", choices=EMULATED_VERSIONS[:-1], default=None)
    up.add_argument("--feature-gates", type=parse_gates, default={})
    sub.add_parser("down", help="stop it and remove its files")
    sub.add_parser("env", help="print the shell exports to use it")
    sub.add_parser("status", help="show its processes")
    args = parser.parse_args(argv)
    handlers = {"up": cmd_up, "down": cmd_down, "env": cmd_env, "status": cmd_status}
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
