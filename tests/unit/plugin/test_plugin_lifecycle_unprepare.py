"""Each failure of an unprepare step the kubelet's answer waits for, in-process: the kubelet
gets a per-claim error naming the claim, the claim stays marked ``unpreparing`` with
whatever is not yet removed, and the kubelet's retry finishes it with nothing left behind.
(The record's removal follows the answer: test_plugin_unprepare_stages.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.plugin.lifecycle_node import NAMESPACE, World
from thunder_dra.plugin.state.checkpoint import ClaimState, PreparedClaim


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _thunder(method: str, path: str) -> Callable[[World], None]:
    def inject(world: World) -> None:
        world.thunder.faults.add({"method": method, "path": path, "status": 500, "times": 2})

    return inject


def _kube(method: str, path: str) -> Callable[[World], None]:
    def inject(world: World) -> None:
        world.kube.fail(method, path, status=500)

    return inject


# (kind, the failing step, fault, what the error says)
FAILURES = [
    ("pod", "unenroll", _thunder("DELETE", "/api/v1/enrollment-tokens/*/node"), "revocation"),
    ("pod", "client revoke", _thunder("POST", "/api/v1/clients/*/revoke"), "revocation"),
    ("vm", "Secret delete", _kube("DELETE", r"/secrets/[^/]+$"), "500"),
    ("vm", "Secret look-up", _kube("PATCH", r"/secrets/[^/]+$"), "500"),
]


@pytest.mark.parametrize(
    ("kind", "step", "inject", "what"), FAILURES, ids=[f"{k}-{s}" for k, s, _, _ in FAILURES]
)
async def test_a_failed_unprepare_step_is_retried_to_the_end(
    world: World, kind: str, step: str, inject: Callable[[World], None], what: str
) -> None:
    daemon = await world.start()
    ref = world.claim("train", vm=kind == "vm")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    inject(world)
    error = (await daemon.unprepare(ref))[ref.uid]
    assert error.startswith(f"claim {NAMESPACE}/train: "), step
    assert what in error
    assert world.checkpoint_claims()[ref.uid]["state"] == ClaimState.UNPREPARING.value
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert world.leaks() == []
    assert world.live_tokens() == []
    assert world.live_clients() == []
    assert world.client_records() == []
    assert world.secrets() == []
    assert world.node_files() == []
    assert world.checkpoint_claims() == {}


async def test_a_cdi_spec_that_cannot_be_removed_is_an_error_until_it_can(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    assert isinstance((await daemon.prepare(ref))[ref.uid], PreparedClaim)
    spec = daemon.config.cdi_dir / f"thundercompute.com-gpu_claim-{ref.uid}.json"
    spec.unlink()
    spec.mkdir()  # something the daemon cannot unlink as a file
    (spec / "held").write_text("x")
    error = (await daemon.unprepare(ref))[ref.uid]
    assert error.startswith(f"claim {NAMESPACE}/train: file system: ")
    assert world.live_tokens() == []  # revoked before the files: nothing to leak
    (spec / "held").unlink()
    spec.rmdir()
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert world.node_files() == []
    assert world.client_records() == []
