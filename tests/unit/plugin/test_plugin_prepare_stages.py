"""Prepare's last stage: once the token is exchanged, a pod claim's client ID journal
line, its ``config.json``, its ``Client`` record and its CDI spec are written at once.
The files are finished (or failed) before the checkpoint commits the claim, which does
not wait for the record; the kubelet's answer waits for both. A failure or a crash
before the commit rolls the whole attempt back, a ``config.json`` whose client ID never
reached the journal included; a record that fails after the commit undoes it, and one a
crash left unmade is made before the claim's next answer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.plugin.fakes import CrashAt, Crashed, Meeting, until
from tests.unit.plugin.lifecycle_node import Daemon, World
from thunder_dra.api import ClaimReference
from thunder_dra.kube.errors import Unavailable
from thunder_dra.plugin.claims import prepare as prepare_module
from thunder_dra.plugin.files import clientconfig
from thunder_dra.plugin.state.checkpoint import PreparedClaim


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _parts(daemon: Daemon) -> tuple[Any, Any]:
    deps = daemon.preparer.d
    return deps.records, deps.cdi


async def test_a_reenrollment_killed_before_its_client_id_is_journaled_is_enrolled_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed claim whose ``config.json`` is gone is enrolled again; the daemon dies
    once the new client's ``config.json`` is written but before its ID is journaled. The
    start-up rollback revokes the attempt (its token ID is journaled) and removes that
    ``config.json``, though the journal never named its client, so the claim is enrolled
    anew rather than left with a config of a revoked client."""
    daemon = await world.start()
    ref = world.claim("train")
    first = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(first, PreparedClaim), first
    config_json = daemon.config.claim_layout.config_json(ref.uid)
    config_json.unlink()

    journal = daemon.preparer.d.journal
    never = asyncio.Event()

    async def hang(entry_id: str, client_id: str) -> None:
        await never.wait()

    monkeypatch.setattr(journal, "record_client_id", hang)
    again = asyncio.ensure_future(daemon.prepare(ref))
    await until(config_json.is_file, "the re-enrollment's config.json")
    assert not again.done()
    await daemon.kill()
    stale = json.loads(config_json.read_text())["clientId"]
    assert stale != first.client_id

    daemon = await world.start()
    assert stale not in world.live_clients()
    assert world.leaks() == []
    assert world.open_journal_entries() == []
    current = world.checkpoint_claims()[ref.uid]["clientId"]
    assert current not in (first.client_id, stale)
    assert json.loads(config_json.read_text())["clientId"] == current
    assert world.live_clients() == [current]
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def test_the_client_id_the_config_the_record_and_the_cdi_spec_are_written_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    records, cdi = _parts(daemon)
    journal = daemon.preparer.d.journal
    meeting = Meeting(4)
    monkeypatch.setattr(
        journal, "record_client_id", meeting.wrap("journal", journal.record_client_id)
    )
    config = meeting.wrap("config", clientconfig.write_client_config)
    monkeypatch.setattr(prepare_module, "write_client_config", config)
    monkeypatch.setattr(records, "write_client", meeting.wrap("record", records.write_client))
    monkeypatch.setattr(cdi, "write_claim", meeting.wrap("cdi", cdi.write_claim))
    ref = world.claim("train")
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert sorted(meeting.started) == ["cdi", "config", "journal", "record"]
    assert world.open_journal_entries() == []
    assert len(world.client_records()) == 1
    assert (daemon.config.claim_layout.config_json(ref.uid)).is_file()
    assert list(world.checkpoint_claims()) == [ref.uid]
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


@pytest.mark.parametrize(
    "step", ["prepare:client-id-recorded", "prepare:config-written", "prepare:cdi-written"]
)
async def test_a_crash_after_the_stage_rolls_back_all_three_at_start_up(
    world: World, step: str
) -> None:
    ref = world.claim("train")
    daemon = await world.start(crash=CrashAt(step))
    with pytest.raises(Crashed):
        await daemon.prepare(ref)
    await daemon.kill()
    # All three were written before any of the stage's crash points was reached.
    assert len(world.client_records()) == 1
    assert len(world.node_files()) == 2  # the claim's directory and its CDI spec
    assert len(world.live_tokens()) == 1
    daemon = await world.start()
    assert world.client_records() == []
    assert world.node_files() == []
    assert world.live_tokens() == []
    assert world.leaks() == []
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


def _slow_refusal(delay: float) -> Any:
    """A ``write_client`` whose request fails ``delay`` seconds after it is made."""

    async def refuse(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(delay)
        raise Unavailable("POST", "/apis/thundercompute.com/v1alpha1/clients", 503, "unavailable")

    return refuse


async def test_the_checkpoint_commits_while_the_record_is_in_flight(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit does not wait for the record's answer; the kubelet's answer waits for
    both."""
    daemon = await world.start()
    records, _ = _parts(daemon)
    answer = asyncio.Event()
    write_client = records.write_client

    async def held(*args: Any, **kwargs: Any) -> None:
        await answer.wait()
        await write_client(*args, **kwargs)

    monkeypatch.setattr(records, "write_client", held)
    ref = world.claim("train")
    call = asyncio.ensure_future(daemon.prepare(ref))
    await until(lambda: ref.uid in world.checkpoint_claims(), "the commit")
    await asyncio.sleep(0.05)
    assert not call.done()
    answer.set()
    prepared = (await call)[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert len(world.client_records()) == 1
    assert world.open_journal_entries() == []
    await daemon.stop()


@pytest.mark.parametrize("after_the_commit", [False, True], ids=["before", "after"])
async def test_a_failed_record_lets_the_files_finish_then_rolls_everything_back(
    world: World, monkeypatch: pytest.MonkeyPatch, after_the_commit: bool
) -> None:
    """The record's create fails before the files are written (nothing is committed) or
    after the checkpoint committed the claim (the commit is undone): either way the
    attempt is rolled back whole."""
    daemon = await world.start()
    records, cdi = _parts(daemon)
    written: list[str] = []
    committed: list[str] = []
    write_claim = cdi.write_claim
    put = daemon.checkpoint.put

    async def spec_then_note(*args: Any, **kwargs: Any) -> Path:
        await asyncio.sleep(0.05)  # finishes well after a quick refusal
        path: Path = await write_claim(*args, **kwargs)
        written.append(path.name)
        return path

    async def noting_put(claim: PreparedClaim) -> None:
        await put(claim)
        committed.append(claim.uid)

    monkeypatch.setattr(records, "write_client", _slow_refusal(0.2 if after_the_commit else 0))
    monkeypatch.setattr(cdi, "write_claim", spec_then_note)
    monkeypatch.setattr(daemon.checkpoint, "put", noting_put)
    ref = world.claim("train")
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), error
    assert "503 unavailable" in error
    # The spec was written to the end before the rollback, which then removed it.
    assert written == [f"thundercompute.com-gpu_claim-{ref.uid}.json"]
    assert committed == ([ref.uid] if after_the_commit else [])
    assert world.node_files() == []
    assert world.live_tokens() == []
    assert world.leaks() == []
    assert world.client_records() == []
    assert world.open_journal_entries() == []
    assert world.checkpoint_claims() == {}

    monkeypatch.undo()
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def test_a_reenrollment_whose_record_fails_after_the_commit_keeps_the_earlier_entry(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit is undone to what the checkpoint file held: the claim's earlier entry
    (its enrollment revoked by the re-enrollment), so the next prepare enrolls it again."""
    daemon = await world.start()
    records, _ = _parts(daemon)
    ref = world.claim("train")
    first = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(first, PreparedClaim), first
    await daemon.service.drain()
    daemon.config.claim_layout.config_json(ref.uid).unlink()
    monkeypatch.setattr(records, "write_client", _slow_refusal(0.2))
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), error
    assert world.checkpoint_claims()[ref.uid]["enrollmentTokenId"] == first.enrollment_token_id
    assert world.live_tokens() == []
    assert world.open_journal_entries() == []

    monkeypatch.undo()
    again = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(again, PreparedClaim), again
    assert world.live_tokens() == [again.enrollment_token_id]
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def test_when_the_commit_cannot_be_undone_the_next_prepare_records_before_answering(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record failed after the commit and the checkpoint write that undoes it failed
    too: the claim stays prepared (its enrollment is the committed one) and the kubelet's
    retry re-creates the record before it answers, not after."""
    daemon = await world.start()
    records, _ = _parts(daemon)

    async def full_disk(uid: str, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records, "write_client", _slow_refusal(0.2))
    monkeypatch.setattr(daemon.checkpoint, "drop", full_disk)
    ref = world.claim("train")
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), error
    (committed,) = world.checkpoint_claims().values()
    assert world.live_tokens() == [committed["enrollmentTokenId"]]
    assert world.open_journal_entries() == []
    assert world.client_records() == []

    monkeypatch.undo()
    again = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(again, PreparedClaim), again
    assert again.enrollment_token_id == committed["enrollmentTokenId"]
    (record,) = world.client_records()  # before the work after the answer runs
    assert record["spec"]["enrollmentTokenId"] == again.enrollment_token_id
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def _killed_after_the_commit(world: World, ref: ClaimReference) -> dict[str, Any]:
    """Prepare ``ref`` with the API server never answering the record's create, and kill
    the daemon once the checkpoint holds the claim; the committed entry."""
    daemon = await world.start()
    world.kube.fail("POST", r"/clients$", hang=True)
    call = asyncio.ensure_future(daemon.prepare(ref))
    await until(lambda: ref.uid in world.checkpoint_claims(), "the commit")
    await world.kube.hung.wait()
    await daemon.kill()
    assert call.done()
    assert world.client_records() == []
    committed: dict[str, Any] = world.checkpoint_claims()[ref.uid]
    return committed


async def test_a_daemon_killed_after_the_commit_with_its_record_in_flight_recreates_it(
    world: World,
) -> None:
    """The checkpoint is committed and the record's request never answered: the next
    start-up keeps the committed claim and re-creates its record; the kubelet's retry gets
    the same claim."""
    ref = world.claim("train")
    committed = await _killed_after_the_commit(world, ref)
    daemon = await world.start()
    (record,) = world.client_records()
    assert record["spec"]["enrollmentTokenId"] == committed["enrollmentTokenId"]
    assert world.open_journal_entries() == []
    assert world.live_tokens() == [committed["enrollmentTokenId"]]
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert prepared.enrollment_token_id == committed["enrollmentTokenId"]
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def test_a_record_the_start_up_could_not_recreate_is_made_before_the_next_answer(
    world: World,
) -> None:
    """As above, with the API server refusing the create at the restart: the kubelet's
    retry is refused while the record cannot be made, then answered once it is."""
    ref = world.claim("train")
    await _killed_after_the_commit(world, ref)
    world.kube.fail("POST", r"/clients$", status=503, times=None)
    daemon = await world.start()
    assert world.client_records() == []
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), error
    assert "503" in error
    world.kube.faults.clear()
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    (record,) = world.client_records()  # before the work after the answer runs
    assert record["spec"]["enrollmentTokenId"] == prepared.enrollment_token_id
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()
