"""Unprepare's stages: once the checkpoint entry is marked, the two revocations and the
removal of the files and a VM's Secret are made at once, and the ``Client`` record (the
claim's last trace outside the checkpoint) is removed only after all of them, once the
kubelet has its answer; a failed step does not stop the rest of its stage, and the
kubelet still gets its error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.fakekube import parse_path
from tests.unit.plugin.fakes import CrashAt, Crashed, Meeting, until
from tests.unit.plugin.lifecycle_node import NAMESPACE, Daemon, World
from thunder_dra import fsutil
from thunder_dra.api import ClaimReference
from thunder_dra.kube.resources import CLIENTS
from thunder_dra.plugin.kubelet import handler
from thunder_dra.plugin.state.checkpoint import ClaimState, PreparedClaim
from thunder_dra.thunder import ThunderClient


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_the_two_revocations_and_the_file_removal_run_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    meeting = Meeting(3)
    thunder: ThunderClient = daemon.thunder
    cdi = daemon.preparer.d.cdi
    monkeypatch.setattr(thunder, "unenroll", meeting.wrap("unenroll", thunder.unenroll))
    monkeypatch.setattr(thunder, "revoke_client", meeting.wrap("revoke", thunder.revoke_client))
    monkeypatch.setattr(cdi, "remove", meeting.wrap("cdi", cdi.remove))
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert sorted(meeting.started) == ["cdi", "revoke", "unenroll"]
    world.assert_clean()
    await daemon.stop()


async def test_the_removals_are_made_durable_after_the_answer_before_the_entry_goes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    cdi_dir = daemon.preparer.d.cdi.cdi_dir
    claims_dir = daemon.preparer.d.config.claim_layout.claims_dir
    checkpoint = daemon.preparer.d.checkpoint.path
    synced: list[Path] = []
    real_fsync_dir = fsutil.fsync_dir

    def recording(path: Path) -> None:
        real_fsync_dir(path)
        synced.append(path)

    monkeypatch.setattr(fsutil, "fsync_dir", recording)
    # The kubelet's call alone, not the work its answer leaves running.
    assert await daemon.service.unprepare([ref]) == {ref.uid: ""}
    # In the kubelet's wait: the files are gone, and the only directory made durable is
    # the checkpoint's (the entry marked).
    assert not (claims_dir / ref.uid).exists()
    assert not daemon.preparer.d.cdi.path_for(ref.uid).exists()
    assert synced == [checkpoint.parent]
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    await daemon.service.drain()
    # After the answer: both directories, by the write that drops the entry, before it.
    assert synced[0] == checkpoint.parent
    assert sorted(synced[1:3]) == sorted([cdi_dir, claims_dir])
    assert synced[3:] == [checkpoint.parent]
    world.assert_clean()
    await daemon.stop()


async def test_a_crash_after_revocation_leaves_the_record_and_the_marked_entry_for_start_up(
    world: World,
) -> None:
    ref = world.claim("train", vm=True)
    daemon = await world.start(crash=CrashAt("unprepare:token-revoked"))
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    with pytest.raises(Crashed):
        await daemon.unprepare(ref)
    await daemon.kill()
    assert world.live_tokens() == []
    assert len(world.client_records()) == 1  # the record's stage never started
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    daemon = await world.start()
    world.assert_clean()
    await daemon.stop()


@pytest.mark.parametrize("step", ["unprepare:cdi-removed", "unprepare:claim-dir-removed"])
async def test_the_client_record_outlives_the_files(world: World, step: str) -> None:
    ref = world.claim("train")
    daemon = await world.start(crash=CrashAt(step))
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    with pytest.raises(Crashed):
        await daemon.unprepare(ref)
    await daemon.kill()
    assert len(world.client_records()) == 1
    daemon = await world.start()
    world.assert_clean()
    await daemon.stop()


async def test_a_file_that_cannot_be_removed_still_lets_the_rest_of_its_stage_run(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    spec = daemon.config.cdi_dir / f"thundercompute.com-gpu_claim-{ref.uid}.json"
    spec.unlink()
    spec.mkdir()  # something the daemon cannot unlink as a file
    error = (await daemon.unprepare(ref))[ref.uid]
    assert error.startswith(f"claim {NAMESPACE}/train: file system: ")
    assert world.live_tokens() == []
    assert not daemon.config.claim_layout.directory(ref.uid).exists()
    assert len(world.client_records()) == 1  # its stage comes after the files
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    spec.rmdir()
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


RECORD_DELETE = r"/clients/claim-[^/]+$"


async def test_the_answer_waits_for_revocation_and_files_but_not_for_the_record(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    world.kube.fail("DELETE", RECORD_DELETE, hang=True, times=None)
    # The kubelet's call alone, not the work after its answer.
    assert await daemon.service.unprepare([ref]) == {ref.uid: ""}
    assert world.live_tokens() == []
    assert world.live_clients() == []
    assert world.node_files() == []
    assert len(world.client_records()) == 1
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    await daemon.kill()  # while the record's deletion hangs
    world.kube.faults.clear()
    daemon = await world.start()
    world.assert_clean()  # start-up finished the marked entry
    await daemon.stop()


async def _answered_while_the_record_delete_fails(
    world: World, monkeypatch: pytest.MonkeyPatch, *, retry_seconds: float, times: int | None
) -> tuple[Daemon, ClaimReference, PreparedClaim]:
    """A prepared claim unprepared (the kubelet's call alone) while its record's DELETE
    fails ``times`` times (None: every time)."""
    monkeypatch.setattr(handler, "RECORD_RETRY_SECONDS", retry_seconds)
    daemon = await world.start()
    ref = world.claim("train")
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim)
    world.kube.fail("DELETE", RECORD_DELETE, status=500, times=times)
    assert await daemon.service.unprepare([ref]) == {ref.uid: ""}
    return daemon, ref, prepared


async def test_a_record_that_cannot_be_removed_after_the_answer_is_left_to_the_sweep(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, ref, _ = await _answered_while_the_record_delete_fails(
        world, monkeypatch, retry_seconds=0.0, times=None
    )
    await daemon.service.drain()
    deletes = [r for r in world.kube.calls("DELETE") if re.search(RECORD_DELETE, r.path)]
    assert len(deletes) == handler.RECORD_ATTEMPTS
    assert world.live_tokens() == []
    assert len(world.client_records()) == 1
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    assert len(await daemon.recovery.sweep()) == 1  # still failing: retried by the next pass
    world.kube.faults.clear()
    assert await daemon.recovery.sweep() == []
    world.assert_clean()
    assert daemon.metrics.registry.get_sample_value("thunder_dra_daemon_prepared_claims") == 0
    await daemon.stop()


async def test_a_prepare_right_after_the_answer_finishes_the_unprepare_first(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, ref, first = await _answered_while_the_record_delete_fails(
        world, monkeypatch, retry_seconds=0.01, times=1
    )
    await until(
        lambda: any(re.search(RECORD_DELETE, r.path) for r in world.kube.calls("DELETE")),
        "the removal's first try, once the calls have paused",
    )
    # The claim is prepared again (a new pod on this node) while its old record's
    # removal is still failing and waiting for its retry.
    await _prepared_again_over_an_unfinished_unprepare(world, daemon, ref, first)


async def _prepared_again_over_an_unfinished_unprepare(
    world: World, daemon: Daemon, ref: ClaimReference, first: PreparedClaim
) -> None:
    """The claim is prepared again: the old enrollment's record is gone, the new one is
    the claim's only record and live client, and a last unprepare leaves nothing."""
    second = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(second, PreparedClaim)
    await daemon.service.drain()
    assert second.client_id != first.client_id
    (record,) = world.client_records()
    assert record["spec"]["clientId"] == second.client_id
    assert world.live_clients() == [second.client_id]
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.PREPARED.value
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


async def test_a_prepare_before_the_deferred_removal_finishes_the_unprepare_itself(
    world: World,
) -> None:
    """The claim is prepared again the moment its unprepare answered, while the record's
    removal still waits for the calls to pause: the prepare finishes the unprepare (the
    old record goes) and enrolls afresh; the deferred removal then finds nothing to do."""
    daemon = await world.start()
    ref = world.claim("train")
    first = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(first, PreparedClaim)
    assert await daemon.service.unprepare([ref]) == {ref.uid: ""}
    assert len(world.client_records()) == 1  # the removal has not run yet
    await _prepared_again_over_an_unfinished_unprepare(world, daemon, ref, first)


async def test_the_prepared_claims_gauge_drops_once_the_entry_is_dropped(world: World) -> None:
    daemon = await world.start()
    refs = [world.claim("train"), world.claim("serve")]
    for ref in refs:
        assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)

    def gauge() -> float | None:
        return daemon.metrics.registry.get_sample_value("thunder_dra_daemon_prepared_claims")

    assert gauge() == 2
    assert await daemon.unprepare(refs[0]) == {refs[0].uid: ""}  # and the work after it
    assert gauge() == 1
    assert await daemon.unprepare(refs[1]) == {refs[1].uid: ""}
    assert gauge() == 0
    await daemon.stop()


async def _recorded(world: World) -> tuple[Daemon, ClaimReference]:
    """A daemon with a prepared claim whose record's work after the answer is done."""
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    await daemon.service.drain()
    return daemon, ref


async def test_the_record_loses_its_finalizer_first_and_is_then_deleted_at_once(
    world: World,
) -> None:
    daemon, ref = await _recorded(world)
    before = len(world.kube.requests)
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    writes = [r.method for r in world.kube.requests[before:] if re.search(RECORD_DELETE, r.path)]
    # A patch that drops the finalizer, then a delete that removes the record at once: it
    # is never Terminating.
    assert writes == ["PATCH", "DELETE"]
    world.assert_clean()
    await daemon.stop()


async def test_a_finalizer_of_someone_else_stays_and_keeps_the_record_terminating(
    world: World,
) -> None:
    daemon, ref = await _recorded(world)
    [record] = world.client_records()
    path = CLIENTS.item(record["metadata"]["name"], NAMESPACE)
    stored = world.kube.objects[parse_path(path).key]
    stored["metadata"]["finalizers"].insert(0, "example.com/audit")
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert world.live_tokens() == []
    [left] = world.client_records()
    assert left["metadata"]["finalizers"] == ["example.com/audit"]
    assert left["metadata"].get("deletionTimestamp")
    assert world.checkpoint_claims() == {}
    await daemon.stop()
