"""Stopping the processes the test platform starts, and reading what they logged.

Every process the platform, the harness and the benchmarks start (the control plane, a
node's containerd and kubelet, the fake Thunder service, the operator, the daemons) stops
the same way: SIGTERM, a grace period to exit on it, then SIGKILL, and the exit status
collected so no zombie is left. ``stop`` does that for one process; ``terminate`` and
``reap`` are its two halves, for a caller that signals several processes before it waits
on any. ``stop_pids`` does it for processes this one did not start and cannot wait on (a
control plane an earlier ``python -m hack.cluster up`` left running). Starting them is
``hack.tied``. ``read_log`` and ``log_tail`` read the log file a process writes to.

    from hack import supervise
    supervise.stop(popen, 20)          # True: it exited on SIGTERM; False: it was killed
    popen.returncode                   # its exit status either way
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
import time
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def terminate(process: subprocess.Popen[Any], pid: int | None = None) -> None:
    """SIGTERM to ``process`` if it is still running: to ``pid`` when given (what the
    process started inside a namespace, as ``nsenter`` forwards no signal), else to it."""
    if process.poll() is not None:
        return
    if pid is None:
        process.send_signal(signal.SIGTERM)
    else:
        _send(pid, signal.SIGTERM)


def reap(process: subprocess.Popen[Any], timeout: float, pid: int | None = None) -> bool:
    """Wait up to ``timeout`` seconds for ``process`` to exit; if it has not, SIGKILL it
    (and ``pid``, when given) and wait for that. True when it exited by itself."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        if pid is not None:
            _send(pid, signal.SIGKILL)
        process.kill()
        process.wait()
        return False
    return True


def stop(process: subprocess.Popen[Any], grace: float, pid: int | None = None) -> bool:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; see ``terminate`` for
    ``pid``. True when it exited within the grace period (or had already exited), False
    when it had to be killed. ``process.returncode`` holds its exit status either way."""
    terminate(process, pid)
    return reap(process, grace, pid)


class Served(abc.ABC):
    """A server process of the platform (the registry, Prometheus): ``start`` (or
    ``with``) runs it and returns once it answers, ``stop`` ends it as ``stop`` does,
    within ``grace`` seconds."""

    grace: float = 10
    _popen: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def start(self) -> Self:
        """Run the process; return once it answers."""

    def stop(self) -> None:
        if self._popen is not None:
            stop(self._popen, self.grace)
            self._popen = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_pids(pids: Iterable[int], grace: float) -> None:
    """``stop`` for processes this one did not start: SIGTERM to each that is alive, up to
    ``grace`` seconds in all for them to go, then SIGKILL to those still there."""
    pids = list(pids)
    for pid in pids:
        if alive(pid):
            _send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            _send(pid, signal.SIGKILL)


def read_log(path: Path) -> str:
    """The text of a process's log file, "" when there is none yet (bytes that are not
    UTF-8 replaced)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a process's log file ("" when there is none yet)."""
    return "\n".join(read_log(path).splitlines()[-lines:])
