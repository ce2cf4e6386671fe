"""A daemon killed at every crash point of prepare and unprepare, then started again on the
same node state: nothing leaks, the kubelet's retry gets the claim prepared (or
unprepared), and the final unprepare leaves nothing behind.

The kill is :class:`tests.unit.plugin.fakes.CrashAt` (no handler runs, as with SIGKILL);
the restart is a new daemon over the same directories, fake apiserver and fake Thunder:
either the same instance (a container restart) or a new one (a rolling update's new pod,
which rolls back the dead instance's journal once its lock is free).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.plugin.fakes import CrashAt, Crashed
from tests.unit.plugin.lifecycle_node import Daemon, World
from thunder_dra.api import ClaimReference
from thunder_dra.plugin.state.checkpoint import PreparedClaim
from thunder_dra.plugin.state.crashpoints import PREPARE_STEPS, UNPREPARE_STEPS

POD_ONLY = {
    "prepare:exchanged",
    "prepare:client-id-recorded",
    "prepare:config-written",
    "prepare:cdi-written",
}
VM_ONLY = {"prepare:secret-written", "unprepare:secret-removed"}
POD_STEPS = [s for s in (*PREPARE_STEPS, *UNPREPARE_STEPS) if s not in VM_ONLY]
VM_STEPS = [s for s in (*PREPARE_STEPS, *UNPREPARE_STEPS) if s not in POD_ONLY]
CASES = [("pod", s) for s in POD_STEPS] + [("vm", s) for s in VM_STEPS]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def _crash_then_restart(
    world: World, ref: ClaimReference, step: str, *, new_instance: bool
) -> Daemon:
    daemon = await world.start(crash=CrashAt(step))
    if step.startswith("prepare:"):
        with pytest.raises(Crashed):
            await daemon.prepare(ref)
    else:
        assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
        with pytest.raises(Crashed):
            await daemon.unprepare(ref)
    await daemon.kill()
    return await world.start(instance="instance-2" if new_instance else "instance-1")


@pytest.mark.parametrize(("kind", "step"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
async def test_a_restart_after_a_crash_converges_without_a_leak(
    world: World, kind: str, step: str
) -> None:
    ref = world.claim("train", vm=kind == "vm")
    daemon = await _crash_then_restart(world, ref, step, new_instance=False)
    # Start-up recovery has run: no open journal entry is left, whatever the step, and
    # Thunder holds no enrollment but a committed claim's (a VM's token stays unspent
    # until its guest enrolls).
    assert world.open_journal_entries() == []
    committed = {c["enrollmentTokenId"] for c in world.checkpoint_claims().values()}
    assert [leak for leak in world.leaks() if leak["enrollmentTokenId"] not in committed] == []
    assert set(world.live_tokens()) == committed
    if step.startswith("prepare:"):
        # The kubelet retries the prepare: one live enrollment, recorded once.
        prepared = (await daemon.prepare(ref))[ref.uid]
        assert isinstance(prepared, PreparedClaim), prepared
        assert prepared.is_vm is (kind == "vm")
        (record,) = world.client_records()
        assert record["spec"]["enrollmentTokenId"] == prepared.enrollment_token_id
        assert world.live_tokens() == [prepared.enrollment_token_id]
        if kind == "pod":
            assert world.live_clients() == [prepared.client_id]
            assert (
                daemon.config.cdi_dir / f"thundercompute.com-gpu_claim-{ref.uid}.json"
            ).is_file()
        else:
            assert len(world.secrets()) == 1
    else:
        # Start-up finished the interrupted unprepare.
        world.assert_clean()
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()
    await daemon.stop()


@pytest.mark.parametrize(
    "step", ["prepare:token-recorded", "prepare:exchanged", "prepare:cdi-written"]
)
async def test_a_new_instance_rolls_back_the_dead_instances_journal(
    world: World, step: str
) -> None:
    ref = world.claim("train")
    daemon = await _crash_then_restart(world, ref, step, new_instance=True)
    assert world.open_journal_entries() == []
    assert world.live_tokens() == []
    assert world.client_records() == []
    assert world.node_files() == []
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim)
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_a_crash_with_claims_in_flight_rolls_back_only_the_uncommitted(
    world: World,
) -> None:
    """Three claims in one call; the third claim's files kill the daemon, so at least
    that claim never committed. After the restart committed claims keep their enrollment,
    the others are rolled back, and the kubelet's retry prepares all three."""
    refs = [world.claim(f"c{n}") for n in range(3)]
    daemon = await world.start(crash=CrashAt("prepare:cdi-written", 3))
    with pytest.raises(Crashed):
        await daemon.prepare(*refs)
    await daemon.kill()
    committed = set(world.checkpoint_claims())
    assert len(committed) < 3
    daemon = await world.start()
    assert set(world.checkpoint_claims()) == committed
    assert world.open_journal_entries() == []
    assert len(world.live_tokens()) == len(committed)
    results = await daemon.prepare(*refs)
    assert all(isinstance(r, PreparedClaim) for r in results.values())
    assert len(world.live_tokens()) == 3
    assert await daemon.unprepare(*refs) == {r.uid: "" for r in refs}
    world.assert_clean()


async def test_a_rollback_thunder_refuses_at_start_up_is_finished_by_the_sweep(
    world: World,
) -> None:
    ref = world.claim("train")
    daemon = await world.start(crash=CrashAt("prepare:cdi-written"))
    with pytest.raises(Crashed):
        await daemon.prepare(ref)
    await daemon.kill()
    world.thunder.faults.add({"method": "DELETE", "path": "/api/v1/*", "status": 503})
    daemon = await world.start()  # start-up logs the failure and goes on
    assert len(world.open_journal_entries()) == 1
    assert len(world.live_tokens()) == 1
    assert daemon.abandoned
    assert len(await daemon.recovery.sweep()) == 1  # still down: counted, retried later
    world.thunder.faults.clear()
    assert await daemon.recovery.sweep() == []
    assert world.open_journal_entries() == []
    assert world.live_tokens() == []
    assert world.client_records() == []
    assert world.node_files() == []
    assert world.leaks() == []
