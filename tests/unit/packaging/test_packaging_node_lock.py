"""One real node per machine: a second launcher waits for the first's lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hack.node import launcher

HOLDER = """
import sys, time
from pathlib import Path
from hack.node import launcher
launcher.MACHINE_LOCK = Path(sys.argv[1])
with launcher.one_node_at_a_time():
    print("held", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
print("released", flush=True)
"""


@pytest.fixture(autouse=True)
def own_lock_state(monkeypatch: pytest.MonkeyPatch) -> None:
    # This process may hold the machine's lock already (a real node of the same pytest
    # session): these tests start from a process that holds nothing.
    monkeypatch.setattr(launcher, "_lock_depth", 0)
    monkeypatch.setattr(launcher, "_lock_file", None)


def _holder(lock: Path, release: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(release)],
        cwd=launcher.REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def _waits_for(lock: Path, pid: int) -> bool:
    """Whether the kernel lists process `pid` as blocked on a flock of `lock` (a
    `->` line of /proc/locks: `4: -> FLOCK ADVISORY WRITE <pid> <dev>:<inode> 0 EOF`)."""
    inode = str(lock.stat().st_ino)
    return any(
        len(fields) >= 7
        and fields[1:3] == ["->", "FLOCK"]
        and fields[5] == str(pid)
        and fields[6].rsplit(":", 1)[-1] == inode
        for fields in (line.split() for line in Path("/proc/locks").read_text().splitlines())
    )


def test_a_second_process_waits_until_the_first_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock, release = tmp_path / "node.lock", tmp_path / "release"
    monkeypatch.setattr(launcher, "MACHINE_LOCK", lock)
    first = _holder(lock, release)
    # The handshake: the holder is let go only once the kernel shows this process blocked
    # on the lock. A launcher that did not wait never blocks, so the holder is never let
    # go and `first.wait` below times out.
    done = threading.Event()

    def release_once_waiting() -> None:
        while not done.is_set():
            if _waits_for(lock, os.getpid()):
                release.touch()
                return
            done.wait(0.01)

    releaser = threading.Thread(target=release_once_waiting, daemon=True)
    releaser.start()
    try:
        with launcher.one_node_at_a_time():
            # The first holder has finished by the time this one holds the lock.
            assert first.wait(timeout=10) == 0
    finally:
        done.set()
        releaser.join()
        first.kill()
        first.wait()
    assert release.exists()
    assert first.stdout is not None
    assert first.stdout.read().strip() == "released"
    assert "another real node runs on this machine" in capsys.readouterr().out


def test_the_lock_is_reentrant_within_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, release = tmp_path / "node.lock", tmp_path / "release"
    monkeypatch.setattr(launcher, "MACHINE_LOCK", lock)
    with launcher.one_node_at_a_time(), launcher.one_node_at_a_time():
        pass
    # Released once the outer hold ends: another process takes it at once.
    release.touch()
    proc = _holder(lock, release)
    assert proc.wait(timeout=10) == 0


def test_a_holder_that_dies_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, release = tmp_path / "node.lock", tmp_path / "release"
    monkeypatch.setattr(launcher, "MACHINE_LOCK", lock)
    first = _holder(lock, release)
    first.kill()
    first.wait()
    with open(lock) as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held
