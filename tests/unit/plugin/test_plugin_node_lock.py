"""The node's serialize lock against another process holding it: a real ``flock`` held by
a child process, as a second daemon instance on the node holds it in a rolling update."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from thunder_dra.plugin.state.locks import NodeSerializeLock

# Holds an exclusive flock on argv[1] (blocking for it), prints "held", releases on a line
# on stdin. With argv[2] == "try": a non-blocking attempt instead, printing "held" or "busy".
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
flags = fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[2] == "try" else 0)
try:
    fcntl.flock(fd, flags)
except BlockingIOError:
    print("busy", flush=True)
    sys.exit(0)
print("held", flush=True)
sys.stdin.readline()
"""


class Holder:
    """Another process's flock on the lock file."""

    def __init__(self, path: Path, mode: str = "wait") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.answer = self.proc.stdout.readline().strip()

    def release(self) -> None:
        assert self.proc.stdin is not None
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        self.proc.wait(timeout=30)


def _free(path: Path) -> bool:
    """Whether another process can take the lock right now."""
    probe = Holder(path, "try")
    probe.release()
    return probe.answer == "held"


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "serialize.lock"


async def test_uncontended_lock_is_taken_and_given_back(lock_path: Path) -> None:
    reloads: list[int] = []

    async def reload() -> None:
        reloads.append(1)

    lock = NodeSerializeLock(lock_path, reload)
    async with lock.held():
        assert not _free(lock_path)
        async with lock.held():  # shared inside the process: no second reload
            assert not _free(lock_path)
        assert not _free(lock_path)
    assert _free(lock_path)
    assert reloads == [1]


async def test_lock_held_by_another_process_is_waited_for(lock_path: Path) -> None:
    lock_path.parent.mkdir(parents=True)
    holder = Holder(lock_path)
    assert holder.answer == "held"
    order: list[str] = []

    async def reload() -> None:
        order.append("reloaded")

    lock = NodeSerializeLock(lock_path, reload)

    async def take() -> None:
        async with lock.held():
            order.append("inside")

    task = asyncio.create_task(take())
    try:
        for _ in range(20):
            await asyncio.sleep(0.01)
            assert not task.done()
        assert order == []
    finally:
        holder.release()
    await asyncio.wait_for(task, 30)
    assert order == ["reloaded", "inside"]
    assert _free(lock_path)


async def test_a_wait_cancelled_gives_the_lock_back_when_it_comes(lock_path: Path) -> None:
    lock_path.parent.mkdir(parents=True)
    holder = Holder(lock_path)

    async def reload() -> None:
        raise AssertionError("a cancelled wait reloads nothing")

    lock = NodeSerializeLock(lock_path, reload)

    async def take() -> None:
        async with lock.held():
            raise AssertionError("a cancelled wait never enters")

    task = asyncio.create_task(take())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    holder.release()
    # The waiting thread takes the lock once the holder lets go, then gives it back.
    for _ in range(3000):
        if _free(lock_path):
            break
        await asyncio.sleep(0.01)
    assert _free(lock_path)
