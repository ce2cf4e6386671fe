"""Crash-safe file operations for state the daemon keeps on the node.

A reader (the container runtime reading a CDI spec, the daemon reading its checkpoint
after a crash) must see either the old file or the new one, never a torn write. So every
write goes to a temporary file in the same directory, is fsync'ed, gets its final mode,
and is renamed over the target; the directory is fsync'ed so the rename itself survives
a power loss. Temporary names start with ``.`` and end in ``.tmp-<random>``: CDI only
reads ``*.json``/``*.yaml`` and the kubelet's plugin watcher skips dot files, so no
consumer ever picks up a half-written file.

The synchronous functions do blocking I/O; async code calls the ``*_async`` wrappers,
which run them in a worker thread. The one exception is an unlink without the directory
fsync (``remove_if_exists(durable=False)``), a single quick system call that an
unprepare makes on the event loop; the directory is fsync'ed later (:func:`fsync_dirs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path

TEMP_MARKER = ".tmp-"


def temp_path_for(path: Path) -> Path:
    """A fresh temporary name next to ``path`` that no CDI or plugin reader will load."""
    return path.with_name(f".{path.name}{TEMP_MARKER}{secrets.token_hex(6)}")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temporary file left by an interrupted :func:`write_atomic`."""
    return name.startswith(".") and TEMP_MARKER in name


def fsync_dir(path: Path) -> None:
    """Make renames, creations and deletions in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably, with permissions ``mode``.

    The parent directory must exist. On any failure the previous content of ``path`` (or
    its absence) is untouched and the temporary file is removed.
    """
    payload = data.encode() if isinstance(data, str) else data
    tmp = temp_path_for(path)
    # 0o600 until the content is complete: nobody may read a partial file.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def remove_if_exists(path: Path, *, durable: bool = True) -> bool:
    """Delete file ``path`` durably; a missing file is not an error. True if it existed.

    ``durable=False`` leaves out the directory fsync: the removal is visible at once but
    may come back after a power loss until the caller makes the directory durable
    (:func:`fsync_dirs`) before it relies on it."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(path.parent)
    return True


def fsync_dirs(*paths: Path) -> None:
    """:func:`fsync_dir` each of ``paths`` that exists."""
    for path in paths:
        try:
            fsync_dir(path)
        except FileNotFoundError:
            continue


def ensure_dir(path: Path, mode: int = 0o700) -> None:
    """Create directory ``path`` (and parents) if needed and set exactly ``mode`` on it.

    The mode is applied explicitly because ``mkdir`` is subject to the umask. A newly
    created directory's parent is fsync'ed so the directory survives a crash.
    """
    created = False
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=mode)
            created = True
        except FileExistsError:
            if not path.is_dir():
                raise
    if (path.stat().st_mode & 0o7777) != mode:
        path.chmod(mode)
    if created:
        fsync_dir(path.parent)


def move_aside(path: Path, reason: str = "corrupt") -> Path:
    """Rename ``path`` to ``<name>.<reason>-<UTC timestamp>`` so it is kept for inspection.

    Used for state files that fail validation: they are preserved, never silently
    dropped, and the new name no longer matches what the daemon (or CDI) loads.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.{reason}-{stamp}")
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


async def write_atomic_async(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """:func:`write_atomic` off the event loop."""
    await asyncio.to_thread(write_atomic, path, data, mode=mode)


async def remove_if_exists_async(path: Path) -> bool:
    """:func:`remove_if_exists` off the event loop."""
    return await asyncio.to_thread(remove_if_exists, path)


async def ensure_dir_async(path: Path, mode: int = 0o700) -> None:
    """:func:`ensure_dir` off the event loop."""
    await asyncio.to_thread(ensure_dir, path, mode)


async def move_aside_async(path: Path, reason: str = "corrupt") -> Path:
    """:func:`move_aside` off the event loop."""
    return await asyncio.to_thread(move_aside, path, reason)


async def read_bytes_async(path: Path) -> bytes:
    """Read a whole file off the event loop."""
    return await asyncio.to_thread(path.read_bytes)
