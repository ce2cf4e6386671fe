"""Failed checkpoint writes (EIO, ENOSPC) through the store's substitutable writer: the
file keeps its previous content and memory is put back to it, so nothing decides from a
change that never reached the disk."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from thunder_dra.plugin.state import checkpoint as ck


def _claim(uid: str, token: str = "etok-1", **overrides: object) -> ck.PreparedClaim:
    values: dict[str, object] = {
        "uid": uid,
        "namespace": "team-a",
        "name": f"claim-{uid}",
        "consumer": ck.Consumer(kind="pod", name="trainer-0"),
        "zone_name": "us-east",
        "zone_id": "zone-123",
        "gpu_type": "A6000",
        "gpu_count": 1,
        "enrollment_token_id": token,
        "client_id": f"client-{token}",
        "state": ck.ClaimState.PREPARED,
    }
    values.update(overrides)
    return ck.PreparedClaim(**values)


class FlakyWriter:
    """Writes through to the real atomic writer unless told to fail with ``code``."""

    def __init__(self) -> None:
        self.failing: int | None = None
        self.calls = 0

    def __call__(self, path: Path, content: bytes, mode: int) -> None:
        self.calls += 1
        if self.failing is not None:
            raise OSError(self.failing, os.strerror(self.failing), str(path))
        ck.write_file(path, content, mode)


@pytest.fixture
def writer() -> FlakyWriter:
    return FlakyWriter()


async def _on_disk(directory: Path) -> dict[str, ck.PreparedClaim]:
    return dict((await ck.CheckpointStore(directory).load()).claims)


async def test_an_eio_on_put_leaves_memory_as_the_file(tmp_path: Path, writer: FlakyWriter) -> None:
    store = ck.CheckpointStore(tmp_path, writer=writer)
    await store.put(_claim("uid-1"))
    writer.failing = errno.EIO
    with pytest.raises(OSError, match="Input/output error") as raised:
        await store.put(_claim("uid-2"))
    assert raised.value.errno == errno.EIO
    assert sorted(store.current.claims) == ["uid-1"]
    assert store.current == store.durable
    assert sorted(await _on_disk(tmp_path)) == ["uid-1"]

    writer.failing = None
    await store.put(_claim("uid-3"))
    assert sorted(await _on_disk(tmp_path)) == ["uid-1", "uid-3"]


async def test_a_failed_replace_puts_back_the_durable_version(
    tmp_path: Path, writer: FlakyWriter
) -> None:
    store = ck.CheckpointStore(tmp_path, writer=writer)
    await store.put(_claim("uid-1", token="old"))
    writer.failing = errno.ENOSPC
    with pytest.raises(OSError, match="No space left"):
        await store.put(_claim("uid-1", token="new"))
    assert store.current.claims["uid-1"].enrollment_token_id == "old"
    assert store.durable.claims["uid-1"].enrollment_token_id == "old"


async def test_a_failed_drop_keeps_the_claim(tmp_path: Path, writer: FlakyWriter) -> None:
    store = ck.CheckpointStore(tmp_path, writer=writer)
    marked = _claim("uid-1", state=ck.ClaimState.UNPREPARING)
    await store.put(marked)
    writer.failing = errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        await store.drop("uid-1")
    assert store.current.claims["uid-1"] == marked
    writer.failing = None
    await store.drop("uid-1")
    assert await _on_disk(tmp_path) == {}


async def test_a_failed_group_write_undoes_every_change_it_carried(
    tmp_path: Path, writer: FlakyWriter
) -> None:
    store = ck.CheckpointStore(tmp_path, writer=writer)
    writer.failing = errno.EIO
    results = await asyncio.gather(
        *(store.put(_claim(f"uid-{n}")) for n in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, OSError) for r in results)
    assert store.current.claims == {}
    assert not store.path.exists()


async def test_a_change_made_after_a_failed_write_is_kept(
    tmp_path: Path, writer: FlakyWriter
) -> None:
    store = ck.CheckpointStore(tmp_path, writer=writer)
    writer.failing = errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        await store.put(_claim("uid-1", token="first"))
    writer.failing = None
    # The claim's later change is not undone by the earlier failure of the same claim.
    await store.put(_claim("uid-1", token="second"))
    assert (await _on_disk(tmp_path))["uid-1"].enrollment_token_id == "second"


async def test_setting_aside_a_corrupt_file_empties_the_durable_view(tmp_path: Path) -> None:
    (tmp_path / ck.CHECKPOINT_FILE_NAME).write_text("{not json")
    store = ck.CheckpointStore(tmp_path)
    checkpoint, moved = await store.load_or_set_aside()
    assert moved is not None
    assert moved.exists()
    assert checkpoint.claims == {}
    assert store.durable.claims == {}
