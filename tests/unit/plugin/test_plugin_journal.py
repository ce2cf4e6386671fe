"""The mint journal: durable before the mint, updated, listed after a restart, closed."""

from __future__ import annotations

import inspect
import json
import os
import stat
from pathlib import Path

import pytest

from thunder_dra.plugin.state import journal as jn


async def test_entry_is_on_disk_before_begin_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    journal = jn.MintJournal(tmp_path / "journal")
    entry = await journal.begin(
        role=jn.MintRole.CLIENT,
        purpose=jn.MintPurpose.POD,
        claim_uid="uid-1",
        claim_namespace="team-a",
        claim_name="gpu",
    )
    assert len(synced) >= 2  # the entry file and its directory
    path = tmp_path / "journal" / f"{entry.entry_id}.json"
    on_disk = json.loads(path.read_text())
    assert on_disk["claimUid"] == "uid-1"
    assert on_disk["role"] == "client"
    assert on_disk["purpose"] == "pod"
    assert on_disk["enrollmentTokenId"] is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_entries_survive_a_restart_and_are_listed_oldest_first(tmp_path: Path) -> None:
    journal = jn.MintJournal(tmp_path)
    first = await journal.begin(role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.VM, claim_uid="a")
    second = await journal.begin(role=jn.MintRole.SERVER, purpose=jn.MintPurpose.NODE_ENROLLMENT)
    await journal.record_token_id(first.entry_id, "etok-1")
    await journal.record_client_id(first.entry_id, "client-1")

    after_restart = jn.MintJournal(tmp_path)
    entries = await after_restart.open_entries()
    assert [e.entry_id for e in entries] == [first.entry_id, second.entry_id]
    assert entries[0].enrollment_token_id == "etok-1"
    assert entries[0].client_id == "client-1"
    assert entries[1].claim_uid is None
    assert entries[1].role is jn.MintRole.SERVER


async def test_close_removes_the_entry(tmp_path: Path) -> None:
    journal = jn.MintJournal(tmp_path)
    entry = await journal.begin(role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.POD, claim_uid="a")
    await journal.record_token_id(entry.entry_id, "etok-1")
    assert await journal.close(entry.entry_id) is True
    assert await journal.close(entry.entry_id) is False
    assert await journal.open_entries() == []
    assert os.listdir(tmp_path) == []
    with pytest.raises(jn.JournalEntryNotFound):
        await journal.record_client_id(entry.entry_id, "client-1")


async def test_empty_journal(tmp_path: Path) -> None:
    assert await jn.MintJournal(tmp_path / "never-created").open_entries() == []


async def test_claim_mints_need_the_claim(tmp_path: Path) -> None:
    with pytest.raises(jn.JournalError, match="claim UID"):
        await jn.MintJournal(tmp_path).begin(role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.POD)
    journal = jn.MintJournal(tmp_path)
    entry = await journal.begin(role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.POD, claim_uid="a")
    with pytest.raises(jn.JournalError, match="empty"):
        await journal.record_token_id(entry.entry_id, "")


async def test_corrupt_entry_is_reported_with_its_path(tmp_path: Path) -> None:
    journal = jn.MintJournal(tmp_path)
    await journal.begin(role=jn.MintRole.CLIENT, purpose=jn.MintPurpose.POD, claim_uid="a")
    bad = tmp_path / f"{'0' * 32}.json"
    bad.write_text("{not json")
    with pytest.raises(jn.JournalCorruptError) as info:
        await journal.open_entries()
    assert info.value.path == bad
    assert str(bad) in str(info.value)


def test_the_journal_api_takes_no_token() -> None:
    for name, method in inspect.getmembers(jn.MintJournal, inspect.isfunction):
        for parameter in inspect.signature(method).parameters:
            assert "token" not in parameter or parameter == "enrollment_token_id", (name, parameter)
    fields = set(jn.JournalEntry.model_fields)
    assert {f for f in fields if "token" in f} == {"enrollment_token_id"}
    with pytest.raises(ValueError, match="Extra inputs"):
        jn.JournalEntry.model_validate(
            {
                "entryId": "0" * 32,
                "role": "client",
                "purpose": "pod",
                "createdAt": "2026-01-01T00:00:00Z",
                "enrollmentToken": "tr_secret",
            }
        )
