"""Unit tests keep their files in memory where the machine has a tmpfs.

The daemon's building blocks write every file the way they must on a node: to a temporary
name, fsync, rename, fsync the folder. On a disk those fsyncs were most of the wall time
of the claim lifecycle tests, and what they protect (a power cut) is not what a unit test
checks: a crash is a raised exception there, and durability on a real disk is the real
node's tests' business. So `tmp_path` is a fresh folder under /dev/shm when that is a
writable tmpfs, and pytest's own folder otherwise. The folders are removed when the run
ends, unless a test failed, in which case the path in the failure report still holds
what the test left.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MEMORY = Path("/dev/shm")


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(
        fields[1] == str(path) and fields[2] == "tmpfs"
        for fields in (line.split() for line in mounts)
        if len(fields) >= 3
    )


@pytest.fixture(scope="session")
def _memory_root(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    if not (_is_tmpfs(MEMORY) and os.access(MEMORY, os.W_OK)):
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="thunder-unit-", dir=MEMORY))
    yield root
    if not request.session.testsfailed:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(
    request: pytest.FixtureRequest,
    _memory_root: Path | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    name = re.sub(r"\W", "_", request.node.name)[:30]
    if _memory_root is None:
        return tmp_path_factory.mktemp(name, numbered=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_memory_root))
