"""The node's libthunder cache: ``<root>/sha256/<digest>/libthunder.so``, read-only.

Containers bind-mount the library from here, so a file is only ever staged after its
SHA-256 matched the digest the Thunder installer pins; a download that does not match is
rejected and leaves nothing behind. The library is downloaded at most once per node and
digest: concurrent claims wait for the same download. At start-up :meth:`verify_all`
re-hashes every cached file and removes a corrupted one, which the next
:meth:`LibthunderCache.ensure` fetches again.

The download itself is injected (:class:`Fetch`): the Thunder artifacts module provides
the production one; tests pass a local HTTP server's or a fake. :class:`PinnedDigest`
caches the installer's pinned digest for a while, so it is not fetched for every claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

from thunder_dra import fsutil

LIBRARY_FILE_NAME = "libthunder.so"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20

log = logging.getLogger(__name__)


class Fetch(Protocol):
    """Download ``url`` into the new file ``dest_path`` (whose directory exists).

    ``expected_sha256`` is passed so an implementation can reject a mismatch early; the
    cache verifies the file itself either way and ignores the return value. The Thunder
    client's downloader fits as
    ``lambda url, dest, sha: fetcher.download_library(url, sha, dest)``.
    """

    def __call__(self, url: str, dest_path: Path, expected_sha256: str) -> Awaitable[object]: ...


class LibraryCacheError(Exception):
    """The library could not be cached."""


class DigestMismatchError(LibraryCacheError):
    def __init__(self, url: str, expected: str, actual: str) -> None:
        super().__init__(
            f"{LIBRARY_FILE_NAME} from {url} has SHA-256 {actual}, but the installer pins "
            f"{expected}; the download was rejected and nothing was cached"
        )
        self.url = url
        self.expected = expected
        self.actual = actual


def check_digest(digest: str) -> str:
    """``digest`` if it is 64 lower-case hex characters (it becomes a directory name)."""
    if not _DIGEST.match(digest):
        raise LibraryCacheError(f"invalid SHA-256 digest {digest!r}: want 64 lower-case hex")
    return digest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class LibthunderCache:
    def __init__(self, root: Path, fetch: Fetch) -> None:
        self.root = root
        self._fetch = fetch
        self._verified: set[str] = set()
        self._inflight: dict[str, asyncio.Future[Path]] = {}

    @property
    def _store(self) -> Path:
        return self.root / "sha256"

    @property
    def _tmp(self) -> Path:
        return self.root / "tmp"

    def path_for(self, digest: str) -> Path:
        return self._store / check_digest(digest) / LIBRARY_FILE_NAME

    async def ensure(self, digest: str, url: str) -> Path:
        """The cached library with SHA-256 ``digest``, downloading it from ``url`` if needed.

        Concurrent calls for one digest share one download and its outcome; a failed
        download is retried by the next call, not by the ones already waiting.
        """
        path = self.path_for(digest)
        # One stat of a local file, on the loop: a thread hand-off would cost more.
        if digest in self._verified and path.is_file():
            return path
        shared = self._inflight.get(digest)
        if shared is None:
            task = asyncio.ensure_future(self._materialize(digest, url))
            self._inflight[digest] = task
            task.add_done_callback(lambda done: self._forget(digest, done))
            shared = task
        # shield: one caller giving up must not cancel the download the others wait for.
        return await asyncio.shield(shared)

    def _forget(self, digest: str, done: asyncio.Future[Path]) -> None:
        if self._inflight.get(digest) is done:
            del self._inflight[digest]
        if not done.cancelled():
            done.exception()  # retrieved here, so an unawaited failure is not reported twice

    async def _materialize(self, digest: str, url: str) -> Path:
        path = self.path_for(digest)
        if await asyncio.to_thread(self._verify_one, digest):
            return path
        await asyncio.to_thread(fsutil.ensure_dir, self._tmp, 0o700)
        download = self._tmp / f"{digest}.{secrets.token_hex(6)}.part"
        try:
            log.info("downloading libthunder", extra={"digest": digest, "url": url})
            await self._fetch(url, download, digest)
            await asyncio.to_thread(self._stage, download, digest, url)
        finally:
            await asyncio.to_thread(_unlink_quietly, download)
        self._verified.add(digest)
        return path

    def _stage(self, download: Path, digest: str, url: str) -> None:
        actual = sha256_file(download)
        if actual != digest:
            raise DigestMismatchError(url, digest, actual)
        fd = os.open(download, os.O_RDONLY)
        try:
            os.fchmod(fd, 0o444)
            os.fsync(fd)
        finally:
            os.close(fd)
        target = self.path_for(digest)
        fsutil.ensure_dir(self._store, 0o755)
        fsutil.ensure_dir(target.parent, 0o755)
        os.replace(download, target)
        fsutil.fsync_dir(target.parent)

    def _verify_one(self, digest: str) -> bool:
        """Whether the cached file for ``digest`` is present and intact; removes it if not."""
        path = self.path_for(digest)
        try:
            actual = sha256_file(path)
        except FileNotFoundError:
            return False
        if actual == digest:
            self._verified.add(digest)
            return True
        log.warning(
            "cached libthunder is corrupted; removing it",
            extra={"digest": digest, "actual_sha256": actual},
        )
        self._verified.discard(digest)
        shutil.rmtree(path.parent, ignore_errors=True)
        fsutil.fsync_dir(self._store)
        return False

    async def verify_all(self) -> list[str]:
        """Start-up check: re-hash every cached file; returns the digests removed as corrupt.

        Also deletes partial downloads left by a crash.
        """
        return await asyncio.to_thread(self._verify_all_sync)

    def _verify_all_sync(self) -> list[str]:
        shutil.rmtree(self._tmp, ignore_errors=True)
        removed = []
        for digest in self._cached_digests_sync():
            if not self._verify_one(digest):
                removed.append(digest)
        return removed

    async def cached_digests(self) -> list[str]:
        return await asyncio.to_thread(self._cached_digests_sync)

    def _cached_digests_sync(self) -> list[str]:
        try:
            names = [entry.name for entry in self._store.iterdir() if entry.is_dir()]
        except FileNotFoundError:
            return []
        return sorted(name for name in names if _DIGEST.match(name))

    async def prune(self, keep: Iterable[str]) -> list[str]:
        """Remove cached digests not in ``keep`` (those still referenced by prepared claims'
        CDI specs must be kept); returns the removed digests."""
        keep_set = set(keep)
        return await asyncio.to_thread(self._prune_sync, keep_set)

    def _prune_sync(self, keep: set[str]) -> list[str]:
        removed = [
            d for d in self._cached_digests_sync() if d not in keep and d not in self._inflight
        ]
        for digest in removed:
            self._verified.discard(digest)
            shutil.rmtree(self._store / digest, ignore_errors=True)
        if removed:
            fsutil.fsync_dir(self._store)
        return removed


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class PinnedDigest:
    """The installer's pinned libthunder digest, re-resolved at most once per ``ttl``.

    Concurrent callers share one resolution. If re-resolving fails while an earlier
    value is known, the earlier value is served (and the failure logged) and the next
    attempt waits ``retry_after`` seconds: the library it names was verified, and a flaky
    artifact host should neither fail claims nor slow every one of them down.
    """

    def __init__(
        self,
        resolve: Callable[[], Awaitable[str]],
        *,
        ttl: float = 300.0,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self._ttl = ttl
        self._retry_after = min(retry_after, ttl)
        self._clock = clock
        self._value: str | None = None
        self._resolved_at = 0.0
        self._inflight: asyncio.Future[str] | None = None

    def invalidate(self) -> None:
        """Forget the value, so the next :meth:`get` resolves again."""
        self._value = None

    async def get(self) -> str:
        if self._value is not None and self._clock() - self._resolved_at < self._ttl:
            return self._value
        if self._inflight is None:
            task = asyncio.ensure_future(self._refresh())
            self._inflight = task
            task.add_done_callback(self._forget)
        return await asyncio.shield(self._inflight)

    def _forget(self, done: asyncio.Future[str]) -> None:
        if self._inflight is done:
            self._inflight = None
        if not done.cancelled():
            done.exception()

    async def _refresh(self) -> str:
        try:
            value = check_digest(await self._resolve())
        except Exception as err:
            if self._value is None:
                raise
            log.warning(
                "could not re-read the pinned libthunder digest; keeping the last one",
                extra={"digest": self._value, "error": str(err)},
            )
            self._resolved_at = self._clock() - self._ttl + self._retry_after
            return self._value
        self._value = value
        self._resolved_at = self._clock()
        return value
