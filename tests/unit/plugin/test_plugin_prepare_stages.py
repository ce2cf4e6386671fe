"""Prepare's last stage before the checkpoint: once the token is exchanged, a pod claim's
client ID journal line, its ``config.json``, its ``Client`` record and its CDI spec are
written at once; each is finished (or failed) before the checkpoint commits the claim,
and a failure or a crash among them rolls the whole attempt back, a ``config.json``
whose client ID never reached the journal included."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.plugin.fakes import CrashAt, Crashed, Meeting, until
from tests.unit.plugin.lifecycle_node import Daemon, World
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


async def test_a_failed_record_lets_the_files_finish_then_rolls_everything_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    records, cdi = _parts(daemon)
    written: list[str] = []
    write_claim = cdi.write_claim

    async def refuse(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        raise Unavailable("POST", "/apis/thundercompute.com/v1alpha1/clients", 503, "unavailable")

    async def spec_then_note(*args: Any, **kwargs: Any) -> Path:
        await asyncio.sleep(0.05)  # finishes well after the record has failed
        path: Path = await write_claim(*args, **kwargs)
        written.append(path.name)
        return path

    monkeypatch.setattr(records, "write_client", refuse)
    monkeypatch.setattr(cdi, "write_claim", spec_then_note)
    ref = world.claim("train")
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), error
    assert "503 unavailable" in error
    # The spec was written to the end before the rollback, which then removed it.
    assert written == [f"thundercompute.com-gpu_claim-{ref.uid}.json"]
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


@pytest.mark.parametrize(
    "step", ["prepare:config-written", "prepare:client-recorded", "prepare:cdi-written"]
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
