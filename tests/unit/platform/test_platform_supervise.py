"""hack.supervise against real child processes: one that exits on SIGTERM, one that
ignores it, one that only its child can hear (as behind ``nsenter``), and the logs."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hack import supervise
from hack.testbed.kube import wait_for

# Each child says "ready" once its SIGTERM disposition is set, so no signal races it.
EXITS_ON_TERM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""
IGNORES_TERM = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""
# Ignores SIGTERM itself and runs EXITS_ON_TERM, exiting with its status: a process
# whose real work is a child it forwards no signal to.
WRAPPER = f"""
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(subprocess.call([sys.executable, "-c", {EXITS_ON_TERM!r}]))
"""


class Child:
    def __init__(self, code: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
        )
        assert self.popen.stdout is not None
        word, pid = self.popen.stdout.readline().split()
        assert word == "ready"
        self.pid = int(pid)  # the process that printed: the wrapper's child for WRAPPER


@pytest.fixture
def start() -> Iterator[Callable[[str], Child]]:
    started: list[Child] = []

    def _start(code: str) -> Child:
        started.append(Child(code))
        return started[-1]

    yield _start
    for child in started:  # what a failed test left running
        if child.popen.poll() is None:
            supervise.stop(child.popen, 0, child.pid if child.pid != child.popen.pid else None)
        assert child.popen.stdout is not None
        child.popen.stdout.close()


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie: the wrapper's child,
    once the wrapper is killed, waits for whatever reaps orphans here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_process_that_exits_on_sigterm_is_not_killed(start: Callable[[str], Child]) -> None:
    child = start(EXITS_ON_TERM)
    assert supervise.stop(child.popen, 60) is True
    assert child.popen.returncode == 3


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    start: Callable[[str], Child],
) -> None:
    child = start(IGNORES_TERM)
    assert supervise.stop(child.popen, 0.2) is False
    assert child.popen.returncode == -signal.SIGKILL


def test_a_process_that_has_exited_keeps_its_status(start: Callable[[str], Child]) -> None:
    child = start(EXITS_ON_TERM)
    child.popen.send_signal(signal.SIGTERM)
    child.popen.wait()
    assert supervise.stop(child.popen, 0.2) is True
    assert child.popen.returncode == 3


def test_the_signal_goes_to_the_process_named_when_one_is(start: Callable[[str], Child]) -> None:
    wrapper = start(WRAPPER)
    assert wrapper.pid != wrapper.popen.pid
    assert supervise.stop(wrapper.popen, 60, pid=wrapper.pid) is True
    assert wrapper.popen.returncode == 3  # the child's status: it heard SIGTERM


def test_both_the_process_and_the_one_named_are_killed(start: Callable[[str], Child]) -> None:
    wrapper = start(WRAPPER.replace("sys.exit(3)", "None"))  # its child ignores SIGTERM too
    assert supervise.stop(wrapper.popen, 0.2, pid=wrapper.pid) is False
    assert wrapper.popen.returncode == -signal.SIGKILL
    # The named process was killed too.
    assert wait_for(lambda: _gone(wrapper.pid), "the wrapper's child to die", timeout=30)


def test_terminate_then_reap_stops_several_together(start: Callable[[str], Child]) -> None:
    polite, stubborn = start(EXITS_ON_TERM), start(IGNORES_TERM)
    for child in (polite, stubborn):
        supervise.terminate(child.popen)
    assert supervise.reap(polite.popen, 60) is True
    assert supervise.reap(stubborn.popen, 0.2) is False
    assert (polite.popen.returncode, stubborn.popen.returncode) == (3, -signal.SIGKILL)


def _reaped(child: Child) -> threading.Thread:
    # stop_pids is for processes this one did not start and cannot wait on; here a
    # thread waits, as their real parent would, so an exited child is gone, not a zombie.
    thread = threading.Thread(target=child.popen.wait, daemon=True)
    thread.start()
    return thread


def test_stop_pids_lets_a_process_exit_on_sigterm(start: Callable[[str], Child]) -> None:
    child = start(EXITS_ON_TERM)
    waiter = _reaped(child)
    supervise.stop_pids([child.pid], 60)
    waiter.join()
    assert child.popen.returncode == 3


def test_stop_pids_kills_a_process_that_ignores_sigterm(start: Callable[[str], Child]) -> None:
    child = start(IGNORES_TERM)
    waiter = _reaped(child)
    supervise.stop_pids([child.pid], 0.2)
    waiter.join()
    assert child.popen.returncode == -signal.SIGKILL


def test_logs_read_as_text_and_their_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "proc.log"
    assert supervise.read_log(log) == ""
    assert supervise.log_tail(log, 5) == ""
    log.write_bytes(b"one\ntwo\nthree \xff\n")
    assert supervise.read_log(log) == "one\ntwo\nthree \ufffd\n"
    assert supervise.log_tail(log, 2) == "two\nthree \ufffd"
    assert supervise.log_tail(log, 10) == "one\ntwo\nthree \ufffd"
