"""Child processes that die with the test run that started them.

Every process the platform and the harness start (etcd, the control plane, a node's
containerd and kubelet, the operator, the daemons) gets a parent-death signal, so a
run killed outright leaves nothing behind. The signal is set by util-linux's
``setpriv --pdeathsig``, which then execs the command, and not by a ``preexec_fn``:
``preexec_fn`` makes ``subprocess`` fork and run Python code in the child, and fork
runs the parent's fork handlers there. gRPC's child-side handler restarts its poller,
which can abort the child on a closed descriptor before the command ever runs. Without
``preexec_fn``, ``subprocess`` uses ``vfork``, which runs no fork handler.

The signal goes when the thread that started the child ends, as with ``prctl`` itself.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from typing import Any


class TiedError(RuntimeError):
    """The machine lacks what starting a tied process needs."""


@cache
def _setpriv() -> str:
    found = shutil.which("setpriv")
    if found is None:
        raise TiedError(
            "setpriv (util-linux) is not on PATH: it ties the test platform's processes "
            "to the run that starts them"
        )
    return found


def tied(command: Sequence[str], signal: str = "KILL") -> list[str]:
    """``command`` prefixed so that it gets ``signal`` when its parent thread ends."""
    return [_setpriv(), f"--pdeathsig={signal}", "--", *command]


def start_tied(
    command: Sequence[str], *, signal: str = "KILL", **popen: Any
) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(tied(command), **popen)``: the process is the command itself
    (setpriv execs it), so its pid, signals and exit code are the command's."""
    if "preexec_fn" in popen:
        raise TypeError("start_tied sets the parent-death signal itself; no preexec_fn")
    return subprocess.Popen(tied(command, signal), **popen)
