"""Locks: across daemon instances on a node (``flock``) and per claim inside one daemon.

During a rolling update two daemon pods run on one node and share the state directory.
:class:`NodeSerializeLock` makes their kubelet calls (and journal sweeps) never
interleave: it is an exclusive ``flock`` on ``<state>/serialize.lock``. Inside one
process, concurrent calls share the lock (the first takes it, the last releases it),
so twenty claims in flight still run concurrently while the other instance waits.
Whoever takes the lock first reloads shared state (the checkpoint), because the other
instance may have changed it. A free lock is taken at once on the event loop (a
non-blocking ``flock``); only a lock the other instance holds is waited for in a thread.

:class:`InstanceLock` is held for a daemon's whole life on its own journal directory;
another instance that can take it knows the owner is dead (the kernel drops a ``flock``
when its process dies, even on SIGKILL) and may roll back that journal.

:class:`CallLull` puts the calls something waits on (the kubelet's, a scheduler waiting to
bind) before the bookkeeping done after their answers: that work waits for a pause in
the calls, for at most a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

LULL_SECONDS = 0.05
"""How long no call must have been in flight before bookkeeping goes ahead."""
LONGEST_DEFERRAL_SECONDS = 2.0
"""Bookkeeping goes ahead this long after it was handed over, even while calls go on."""


def _open_lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


class NodeSerializeLock:
    def __init__(self, path: Path, on_acquire: Callable[[], Awaitable[None]]) -> None:
        self.path = path
        self._on_acquire = on_acquire
        self._mutex = asyncio.Lock()
        self._holders = 0
        self._fd: int | None = None

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._mutex:
            if self._holders == 0:
                fd = await self._acquire()
                try:
                    await self._on_acquire()
                except BaseException:
                    self._unlock(fd)
                    raise
                self._fd = fd
            self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
                self._unlock(fd)

    async def _acquire(self) -> int:
        # Uncontended (the usual case): taken at once, without a thread hand-off.
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        else:
            return fd
        # Held by another instance: wait for it in a thread.
        waiting = asyncio.ensure_future(asyncio.to_thread(self._lock_blocking))
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The thread cannot be interrupted; when it gets the lock, give it back, or
            # this process would hold the node's lock with nobody to release it.
            waiting.add_done_callback(self._release_abandoned)
            raise

    def _release_abandoned(self, done: asyncio.Future[int]) -> None:
        if not done.cancelled() and done.exception() is None:
            self._unlock(done.result())

    def _lock_blocking(self) -> int:
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _unlock(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class InstanceLock:
    """An exclusive, non-blocking ``flock`` held until :meth:`release` or process death."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            NodeSerializeLock._unlock(fd)


class KeyedLocks:
    """One asyncio lock per key (claim UID), dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class CallLull:
    """Whether the calls something waits on have paused, for the work done after their
    answers (records, claim status) to go ahead without competing with them.

    A call is counted while it runs (:meth:`call`). :meth:`wait` returns once no call has
    been in flight for ``lull`` seconds, or once ``longest`` seconds have passed since the
    work was handed over, whichever comes first: under calls that never pause, deferred
    work still goes ahead, at most that late. After :meth:`open` (shutdown) it returns at
    once. Work that waits is never a request in flight: it waits before each request.
    """

    def __init__(
        self,
        lull: float = LULL_SECONDS,
        longest: float = LONGEST_DEFERRAL_SECONDS,
    ) -> None:
        if lull < 0 or longest < 0:
            raise ValueError(f"lull ({lull}) and longest deferral ({longest}) must be >= 0")
        self._lull = lull
        self.longest = longest
        self._calls = 0
        self._opened = False
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def calls(self) -> int:
        """Calls in flight now."""
        return self._calls

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Count a call in flight for as long as the block runs."""
        self._calls += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._opened:
            self._quiet.clear()
        try:
            yield
        finally:
            self._calls -= 1
            if self._calls == 0 and not self._opened:
                self._timer = asyncio.get_running_loop().call_later(self._lull, self._settle)

    def _settle(self) -> None:
        self._timer = None
        if self._calls == 0:
            self._quiet.set()

    async def wait(self, since: float) -> None:
        """Return once calls have paused, or ``longest`` seconds after ``since`` (a
        :func:`time.monotonic` reading: when the work was handed over)."""
        if self._quiet.is_set():
            return
        left = since + self.longest - time.monotonic()
        if left <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._quiet.wait()

    def open(self) -> None:
        """From now on :meth:`wait` returns at once (a stopping daemon finishes its work)."""
        self._opened = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._quiet.set()
