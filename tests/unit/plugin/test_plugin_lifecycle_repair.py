"""Repair, rollback and unprepare in-process: what a prepared claim loses on the node is
restored on the next prepare (or at start-up), a failed checkpoint or claim-file write is
rolled back through the journal, and a failed revocation leaves the claim to retry."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakekube import parse_path
from tests.unit.plugin.fakes import OnStep
from tests.unit.plugin.lifecycle_node import NAMESPACE, Daemon, World
from thunder_dra import fsutil
from thunder_dra.api import ClaimReference
from thunder_dra.kube.resources import CLIENTS
from thunder_dra.plugin.state.checkpoint import (
    CHECKPOINT_FILE_NAME,
    ClaimState,
    PreparedClaim,
    write_file,
)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def _prepare(daemon: Daemon, ref: ClaimReference) -> PreparedClaim:
    result = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(result, PreparedClaim), result
    return result


def _cdi_spec(daemon: Daemon, ref: ClaimReference) -> Path:
    return daemon.config.cdi_dir / f"thundercompute.com-gpu_claim-{ref.uid}.json"


async def test_a_missing_cdi_spec_is_rewritten_with_the_same_answer(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    spec = _cdi_spec(daemon, ref)
    content = spec.read_bytes()
    spec.unlink()  # /var/run/cdi emptied by a reboot
    assert await _prepare(daemon, ref) == first
    assert spec.read_bytes() == content
    assert len(world.thunder.state.tokens) == 1


async def test_a_missing_library_is_fetched_again_by_its_digest(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    assert first.library is not None
    first.library.unlink()
    _cdi_spec(daemon, ref).unlink()
    assert await _prepare(daemon, ref) == first
    assert first.library.is_file()


async def test_a_missing_client_record_is_recreated(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    (record,) = world.client_records()
    del world.kube.objects[parse_path(CLIENTS.item(record["metadata"]["name"], NAMESPACE)).key]
    assert await _prepare(daemon, ref) == first
    await daemon.service.drain()  # the record is checked once the kubelet has its answer
    (again,) = world.client_records()
    assert again["spec"] == record["spec"]
    assert again["status"]["clientId"] == first.client_id


async def test_a_repeated_prepare_answers_before_its_record_is_checked(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    records = daemon.preparer.d.records
    release = asyncio.Event()
    checked: list[str] = []
    get_client = records.get_client

    async def slow_get(namespace: str, claim_uid: str) -> Any:
        await release.wait()
        checked.append(claim_uid)
        return await get_client(namespace, claim_uid)

    monkeypatch.setattr(records, "get_client", slow_get)
    # The kubelet's answer does not wait for the record (a claim enrolled before binding
    # is prepared by the kubelet with files only).
    assert await asyncio.wait_for(_prepare(daemon, ref), timeout=5) == first
    assert checked == []
    release.set()
    await daemon.service.drain()
    assert checked == [ref.uid]
    assert len(world.client_records()) == 1


async def test_an_unprepare_right_after_a_repeated_prepare_leaves_no_record_behind(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    await _prepare(daemon, ref)
    (record,) = world.client_records()
    del world.kube.objects[parse_path(CLIENTS.item(record["metadata"]["name"], NAMESPACE)).key]
    await _prepare(daemon, ref)
    # The unprepare takes the claim's lock after the record check, which then finds the
    # claim still prepared and re-creates the record; the unprepare then removes it.
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    await daemon.service.drain()
    world.assert_clean()


async def test_a_missing_config_json_reenrolls_the_claim_and_revokes_the_old(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    shutil.rmtree(daemon.config.claims_dir / ref.uid)  # a node disk cleanup
    second = await _prepare(daemon, ref)
    assert second.devices == first.devices  # the kubelet's answer does not change
    assert second.enrollment_token_id != first.enrollment_token_id
    assert world.live_tokens() == [second.enrollment_token_id]
    assert world.live_clients() == [second.client_id]
    (record,) = world.client_records()
    assert record["spec"]["enrollmentTokenId"] == second.enrollment_token_id
    assert (daemon.config.claims_dir / ref.uid / "config.json").is_file()
    assert world.checkpoint_claims()[ref.uid]["enrollmentTokenId"] == second.enrollment_token_id
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_start_up_repairs_every_prepared_claim(world: World) -> None:
    daemon = await world.start()
    refs = [world.claim(f"c{n}") for n in range(3)]
    await daemon.prepare(*refs)
    await daemon.stop()
    for ref in refs:
        _cdi_spec(daemon, ref).unlink()
    shutil.rmtree(daemon.config.claims_dir / refs[0].uid)
    daemon = await world.start()  # a reboot: repaired before the kubelet calls
    assert all(_cdi_spec(daemon, ref).is_file() for ref in refs)
    assert (daemon.config.claims_dir / refs[0].uid / "config.json").is_file()
    assert len(world.live_tokens()) == 3
    assert world.leaks() == []


async def test_start_up_removes_the_temporary_cdi_files_a_crash_left(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    await _prepare(daemon, ref)
    spec = _cdi_spec(daemon, ref)
    content = spec.read_bytes()
    await daemon.kill()
    # Killed between a spec's temporary write and its rename (a repair rewriting it, a
    # prepare writing another claim's): the temporary files stay behind.
    leftovers = [fsutil.temp_path_for(spec), fsutil.temp_path_for(spec.with_name(spec.name + "x"))]
    for path in leftovers:
        path.write_bytes(content[:10])
    # Another vendor's, in the shared CDI directory, mid-write right now.
    theirs = spec.with_name(".nvidia.com-gpu_claim-x.json.tmp-0123456789ab")
    theirs.write_text("partial")
    daemon = await world.start()
    assert not any(path.exists() for path in leftovers)
    assert theirs.read_text() == "partial"
    assert spec.read_bytes() == content
    assert sorted(p.name for p in daemon.config.cdi_dir.iterdir()) == [theirs.name, spec.name]


class FailingWriter:
    """The checkpoint writer, failing with ``code`` while ``failing``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.failing = False

    def __call__(self, path: Path, content: bytes, mode: int) -> None:
        if self.failing:
            raise OSError(self.code, os.strerror(self.code), str(path))
        write_file(path, content, mode)


async def test_a_failed_checkpoint_commit_is_rolled_back_and_the_retry_enrolls_afresh(
    world: World,
) -> None:
    writer = FailingWriter(errno.ENOSPC)
    daemon = await world.start(checkpoint_writer=writer)
    ref = world.claim("train")
    writer.failing = True
    error = (await daemon.prepare(ref))[ref.uid]
    assert error == (
        f"claim {NAMESPACE}/train: writing claim files failed: [Errno 28] No space left on "
        f"device: '{daemon.config.state_dir / CHECKPOINT_FILE_NAME}'"
    )
    world.assert_clean()
    writer.failing = False
    prepared = await _prepare(daemon, ref)
    assert world.live_tokens() == [prepared.enrollment_token_id]


async def test_a_claim_directory_that_cannot_be_written_is_rolled_back(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    claims = daemon.config.claims_dir
    claims.parent.mkdir(parents=True, exist_ok=True)
    claims.write_text("not a directory")  # every claim directory under it fails
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert error.startswith(f"claim {NAMESPACE}/train: writing claim files failed: ")
    assert world.leaks() == []
    assert world.live_tokens() == []
    assert world.client_records() == []
    assert world.open_journal_entries() == []
    claims.unlink()
    await _prepare(daemon, ref)


async def test_a_failed_unprepare_mark_revokes_nothing(world: World) -> None:
    writer = FailingWriter(errno.EIO)
    daemon = await world.start(checkpoint_writer=writer)
    ref = world.claim("train")
    prepared = await _prepare(daemon, ref)
    writer.failing = True
    error = (await daemon.unprepare(ref))[ref.uid]
    assert "Input/output error" in error
    assert world.live_tokens() == [prepared.enrollment_token_id]
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.PREPARED.value
    writer.failing = False
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_a_failed_revocation_is_a_per_claim_error_and_the_retry_finishes(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    await _prepare(daemon, ref)
    world.thunder.faults.add(
        {"method": "DELETE", "path": "/api/v1/enrollment-tokens/*", "status": 500, "times": 2}
    )
    error = (await daemon.unprepare(ref))[ref.uid]
    assert error.startswith(f"claim {NAMESPACE}/train: Thunder revocation failed: ")
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    assert len(world.client_records()) == 1
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_a_prepare_after_an_interrupted_unprepare_enrolls_from_a_clean_slate(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    world.thunder.faults.add(
        {"method": "DELETE", "path": "/api/v1/enrollment-tokens/*", "status": 500, "times": 2}
    )
    assert (await daemon.unprepare(ref))[ref.uid]
    second = await _prepare(daemon, ref)
    assert second.enrollment_token_id != first.enrollment_token_id
    assert world.live_tokens() == [second.enrollment_token_id]
    assert world.leaks() == []


async def test_a_corrupt_checkpoint_readopts_live_claims_and_revokes_gone_ones(
    world: World,
) -> None:
    daemon = await world.start()
    kept, gone = world.claim("kept"), world.claim("gone")
    first = await _prepare(daemon, kept)
    await _prepare(daemon, gone)
    await daemon.stop()
    path = daemon.config.state_dir / CHECKPOINT_FILE_NAME
    path.write_bytes(path.read_bytes()[:50])  # torn
    world.delete_claim(gone)
    daemon = await world.start()
    assert set(world.checkpoint_claims()) == {kept.uid}
    assert world.live_tokens() == [first.enrollment_token_id]
    assert [r["spec"]["claim"]["name"] for r in world.client_records()] == ["kept"]
    assert list(daemon.config.state_dir.glob(f"{CHECKPOINT_FILE_NAME}.corrupt-*"))
    # The kubelet's next prepare gets the same answer without a new mint.
    assert await _prepare(daemon, kept) == first
    assert await daemon.unprepare(kept, gone) == {kept.uid: "", gone.uid: ""}
    world.assert_clean()


async def test_without_list_rights_a_lost_checkpoint_is_rebuilt_from_the_nodes_traces(
    world: World,
) -> None:
    """A daemon refused ``list`` on Clients looks up the records of the claims its CDI
    specs name: a pod's claim is re-adopted (a VM's leaves no trace, docs/daemon.md)."""
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    await daemon.stop()
    (daemon.config.state_dir / CHECKPOINT_FILE_NAME).unlink()  # a lost state file
    world.kube.fail("GET", r"/clients$", status=403, times=None)
    daemon = await world.start()
    assert set(world.checkpoint_claims()) == {ref.uid}
    assert await _prepare(daemon, ref) == first
    assert len(world.thunder.state.tokens) == 1


async def test_a_journal_that_fails_after_the_mint_still_gets_the_token_revoked(
    world: World,
) -> None:
    """The journal directory goes away between the mint's entry and its token ID (a disk
    failing): the token ID the attempt learned is revoked all the same, and once the
    directory is back the sweep closes the entry that never got its ID."""
    instance_dir = world.root / "state" / "journal" / "instance-1"
    away = instance_dir.with_name("instance-1.away")

    def break_journal() -> None:
        instance_dir.rename(away)
        instance_dir.write_text("not a directory")

    daemon = await world.start(crash=OnStep("prepare:journal-begun", break_journal))
    ref = world.claim("train")
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert error.startswith(f"claim {NAMESPACE}/train: writing claim files failed: ")
    assert len(world.thunder.state.tokens) == 1
    assert world.live_tokens() == []
    assert world.leaks() == []
    assert world.client_records() == []

    instance_dir.unlink()
    away.rename(instance_dir)
    assert await daemon.recovery.sweep() == []
    assert world.open_journal_entries() == []
    assert world.leaks() == []


async def test_a_cdi_spec_that_cannot_be_written_is_rolled_back_with_its_client_record(
    world: World,
) -> None:
    """The CDI directory is unusable: the enrollment is revoked at once; removing what
    the attempt made fails on the same directory, so the sweep finishes the rollback once
    the directory is back (the Client record it wrote goes then)."""
    daemon = await world.start()
    ref = world.claim("train")
    cdi = daemon.config.cdi_dir
    cdi.parent.mkdir(parents=True, exist_ok=True)
    cdi.write_text("not a directory")
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert error.startswith(f"claim {NAMESPACE}/train: writing claim files failed: ")
    assert world.live_tokens() == []
    assert world.live_clients() == []
    assert world.leaks() == []
    assert len(world.open_journal_entries()) == 1
    cdi.unlink()
    assert await daemon.recovery.sweep() == []
    assert world.client_records() == []
    assert world.node_files() == []
    assert world.open_journal_entries() == []
    await _prepare(daemon, ref)


async def test_a_client_record_off_its_schema_is_neither_adopted_nor_revoked(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = await _prepare(daemon, ref)
    await daemon.stop()
    (record,) = world.client_records()
    record["spec"]["gpuCount"] = 0  # below the schema's minimum
    (daemon.config.state_dir / CHECKPOINT_FILE_NAME).unlink()
    daemon = await world.start()
    assert world.checkpoint_claims() == {}
    assert world.live_tokens() == [first.enrollment_token_id]
    assert len(world.client_records()) == 1
    assert "a Client record does not match its schema; left alone" in caplog.messages
