"""PID 1 of a real node's private PID and mount namespaces (``hack.node.launcher``).

    unshare --pid --mount --fork --mount-proc --propagation private \\
        python -m hack.node.nsinit READY_FILE MOUNTS_JSON

Makes the node's mounts (tmpfs over the host paths the kubelet, containerd, CNI and the
daemon write, bind mounts of the node's own directories), marks ``/`` shared inside the
namespace (as systemd does on a host, for the kubelet's mount propagation), writes
``READY_FILE``, then reaps orphans until SIGTERM. When it exits, the kernel kills
every process left in the PID namespace, and the mounts go with the namespace: nothing
of them is ever visible on the machine.

``MOUNTS_JSON``: a list of ``{"target": "/run/cdi", "tmpfs": true}`` or
``{"target": "/var/lib/kubelet", "source": "<dir>"}`` (a bind mount). Every target must
exist already; the launcher creates (and later removes) the missing ones.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

PR_SET_PDEATHSIG = 1


def _mount(argv: list[str]) -> None:
    done = subprocess.run(["mount", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nsinit: mount {' '.join(argv)} failed: {done.stderr.strip()}")


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hack.node.nsinit READY_FILE MOUNTS_JSON", file=sys.stderr)
        return 2
    # The launcher (or the unshare between) going away takes the whole namespace along.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getpid() != 1:
        print("nsinit: not PID 1 of a new PID namespace", file=sys.stderr)
        return 2
    ready, mounts = Path(argv[0]), json.loads(argv[1])
    for item in mounts:
        target = str(item["target"])
        if item.get("tmpfs"):
            _mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", target])
        else:
            _mount(["--bind", str(item["source"]), target])
    _mount(["--make-rshared", "/"])
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    ready.write_text("ready\n")
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
