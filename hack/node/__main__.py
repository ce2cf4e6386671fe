"""Start the local control plane and a real node, and keep them until Ctrl-C.

    python -m hack.node run [--image ARCHIVE ...]   # foreground; prints KUBECONFIG
    python -m hack.node cleanup                     # remove what a dead node left
    python -m hack.node check                       # can a real node run here? (exit 0/1)

Needs root and the node components (hack/build-node-tools.sh, make node-tools).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from hack.cluster.launcher import Cluster
from hack.node.launcher import (
    Node,
    NodeConfig,
    NodeError,
    cleanup_leftovers,
    leftovers,
    node_cluster_config,
    node_tools,
    node_unavailable,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.node", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="control plane + node in the foreground")
    run.add_argument(
        "--image", action="append", default=[], type=Path, help="OCI archive to import"
    )
    run.add_argument("--workdir", type=Path, default=None)
    sub.add_parser("cleanup", help="remove what a node whose launcher died left behind")
    sub.add_parser("check", help="say whether a real node can run here")
    args = parser.parse_args(argv)

    if args.action == "cleanup":
        cleaned = cleanup_leftovers()
        print(f"cleaned {len(cleaned)} node(s): {' '.join(cleaned) or '-'}")
        rest = leftovers()
        for item in rest:
            print(f"still present: {item}")
        return 1 if rest else 0
    if args.action == "check":
        try:
            why = node_unavailable(node_tools())
        except NodeError as err:
            why = str(err)
        print(why or "a real node can run here")
        return 1 if why else 0

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with (
            tempfile.TemporaryDirectory(prefix="thunder-dra-cp-") as cp_dir,
            Cluster(workdir=Path(cp_dir), config=node_cluster_config()) as cluster,
        ):
            node = Node(cluster, NodeConfig(images=tuple(args.image)), workdir=args.workdir)
            with node:
                print(f"node {node.config.name} Ready after {node.ready_after:.1f}s", flush=True)
                print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
                print(f"node state: {node.workdir}  (Ctrl-C stops and cleans up)", flush=True)
                while not stop.is_set():
                    time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except NodeError as err:
        print(f"hack.node: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
