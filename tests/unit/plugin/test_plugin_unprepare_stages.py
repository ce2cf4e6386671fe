"""Unprepare's stages: the two revocations are made at once, the files and a VM's Secret
are removed only after both, and the ``Client`` record (the claim's last trace outside
the checkpoint) only after the files; a failed step does not stop the rest of its stage,
and the kubelet still gets its error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.unit.plugin.fakes import CrashAt, Crashed
from tests.unit.plugin.lifecycle_node import NAMESPACE, World
from thunder_dra.plugin.state.checkpoint import ClaimState, PreparedClaim
from thunder_dra.thunder import ThunderClient


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_the_token_and_the_client_are_revoked_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    both_started = asyncio.Event()
    started: list[str] = []

    def meeting(
        name: str, call: Callable[[str], Awaitable[object]]
    ) -> Callable[[str], Awaitable[object]]:
        async def wrapped(resource_id: str) -> object:
            started.append(name)
            if len(started) == 2:
                both_started.set()
            # Sequential calls would never get past this: the other one has not started.
            await asyncio.wait_for(both_started.wait(), timeout=5)
            return await call(resource_id)

        return wrapped

    thunder: ThunderClient = daemon.thunder
    monkeypatch.setattr(thunder, "unenroll", meeting("unenroll", thunder.unenroll))
    monkeypatch.setattr(thunder, "revoke_client", meeting("revoke", thunder.revoke_client))
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert sorted(started) == ["revoke", "unenroll"]
    world.assert_clean()
    await daemon.stop()


async def test_a_crash_during_revocation_leaves_files_secret_and_record_for_start_up(
    world: World,
) -> None:
    ref = world.claim("train", vm=True)
    daemon = await world.start(crash=CrashAt("unprepare:token-revoked"))
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    with pytest.raises(Crashed):
        await daemon.unprepare(ref)
    await daemon.kill()
    assert world.live_tokens() == []
    assert len(world.secrets()) == 1  # the files' stage never started
    assert len(world.client_records()) == 1
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
