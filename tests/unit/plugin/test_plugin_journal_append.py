"""The mint journal's changes are appended: one fsync each, old files still read."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from thunder_dra import fsutil
from thunder_dra.plugin.state import journal as jn


class SyncCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fsyncs = 0
        self.dir_fsyncs = 0
        self.replaces = 0
        real_fsync, real_dir, real_replace = os.fsync, fsutil.fsync_dir, os.replace

        def fsync(fd: int) -> None:
            self.fsyncs += 1
            real_fsync(fd)

        def fsync_dir(path: Path) -> None:
            self.dir_fsyncs += 1
            real_dir(path)

        def replace(src: str | Path, dst: str | Path) -> None:
            self.replaces += 1
            real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(fsutil, "fsync_dir", fsync_dir)
        monkeypatch.setattr(os, "replace", replace)

    def reset(self) -> None:
        self.fsyncs = self.dir_fsyncs = self.replaces = 0


async def begin(journal: jn.MintJournal) -> jn.JournalEntry:
    return await journal.begin(
        role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.POD, claim_uid="uid-1"
    )


async def test_a_change_is_one_fsync_of_the_entry_and_no_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = jn.MintJournal(tmp_path)
    entry = await begin(journal)
    counter = SyncCounter(monkeypatch)
    await journal.record_token_id(entry.entry_id, "etok-1")
    assert (counter.fsyncs, counter.dir_fsyncs, counter.replaces) == (1, 0, 0)
    counter.reset()
    await journal.record_client_id(entry.entry_id, "client-1")
    assert (counter.fsyncs, counter.dir_fsyncs, counter.replaces) == (1, 0, 0)
    after_restart = await jn.MintJournal(tmp_path).get(entry.entry_id)
    assert after_restart.enrollment_token_id == "etok-1"
    assert after_restart.client_id == "client-1"
    assert after_restart.claim_uid == "uid-1"
    assert after_restart.created_at == entry.created_at


async def test_an_entry_the_previous_format_wrote_is_read_and_updated(tmp_path: Path) -> None:
    # The whole-rewrite format: the entry pretty-printed, token ID in place.
    old = jn.JournalEntry(
        entry_id="a" * 32,
        role=jn.MintRole.CLIENT,
        purpose=jn.MintPurpose.VM,
        created_at="2026-11-30T10:00:00Z",
        claim_uid="uid-old",
        claim_namespace="team-a",
        claim_name="vm",
        enrollment_token_id="etok-old",
    )
    path = tmp_path / f"{'a' * 32}.json"
    path.write_text(old.model_dump_json(by_alias=True, indent=2) + "\n")
    journal = jn.MintJournal(tmp_path)
    assert await journal.open_entries() == [old]
    updated = await journal.record_client_id(old.entry_id, "client-old")
    assert updated == old.model_copy(update={"client_id": "client-old"})
    assert await jn.MintJournal(tmp_path).open_entries() == [updated]


async def test_a_torn_append_is_ignored_and_cut_by_the_next_change(tmp_path: Path) -> None:
    journal = jn.MintJournal(tmp_path)
    entry = await begin(journal)
    path = tmp_path / f"{entry.entry_id}.json"
    with path.open("ab") as f:
        f.write(b'{"enrollmentTok')  # a crash in the middle of an append
    assert (await jn.MintJournal(tmp_path).get(entry.entry_id)).enrollment_token_id is None
    await journal.record_token_id(entry.entry_id, "etok-2")
    assert (await jn.MintJournal(tmp_path).get(entry.entry_id)).enrollment_token_id == "etok-2"
    assert b"enrollmentTok\n" not in path.read_bytes()
    assert b'{"enrollmentTok{' not in path.read_bytes()


async def test_a_failed_append_leaves_the_entry_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = jn.MintJournal(tmp_path)
    entry = await begin(journal)
    path = tmp_path / f"{entry.entry_id}.json"
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        if bytes(data).startswith(b'{"enrollmentTokenId"'):
            real_write(fd, bytes(data)[:5])
            monkeypatch.setattr(os, "write", full)
            return 5
        return real_write(fd, data)

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        await journal.record_token_id(entry.entry_id, "etok-3")
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_bytes() == before
    assert (await journal.get(entry.entry_id)).enrollment_token_id is None


async def test_a_complete_appended_line_that_is_not_a_change_is_corrupt(tmp_path: Path) -> None:
    journal = jn.MintJournal(tmp_path)
    entry = await begin(journal)
    path = tmp_path / f"{entry.entry_id}.json"
    with path.open("ab") as f:
        f.write(b"[1, 2]\n")
    with pytest.raises(jn.JournalCorruptError) as info:
        await journal.open_entries()
    assert info.value.path == path
    path.write_text(json.dumps({"entryId": entry.entry_id}) + '\n{"bogusField": 1}\n')
    with pytest.raises(jn.JournalCorruptError, match="bogusField"):
        await journal.get(entry.entry_id)


async def test_close_syncs_the_directory_only_for_an_entry_without_a_token_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = jn.MintJournal(tmp_path)
    with_token = await begin(journal)
    await journal.record_token_id(with_token.entry_id, "etok-4")
    without_token = await begin(journal)
    counter = SyncCounter(monkeypatch)
    handed: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(call: Callable[..., object], /, *args: object) -> object:
        handed.append(getattr(call, "__name__", repr(call)))
        return await real_to_thread(call, *args)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    # One unlink, no directory fsync: made on the event loop, no thread hand-off.
    assert await journal.close(with_token.entry_id) is True
    assert counter.dir_fsyncs == 0
    assert handed == []
    # The directory fsync of an entry without a token ID is a worker thread's.
    assert await journal.close(without_token.entry_id) is True
    assert counter.dir_fsyncs == 1
    assert handed == ["_close_sync"]
    assert os.listdir(tmp_path) == []
    # An entry read back from disk with its token ID (after a restart) counts too.
    again = await begin(journal)
    await journal.record_token_id(again.entry_id, "etok-5")
    restarted = jn.MintJournal(tmp_path)
    [listed] = await restarted.open_entries()
    counter.reset()
    assert await restarted.close(listed.entry_id) is True
    assert counter.dir_fsyncs == 0
