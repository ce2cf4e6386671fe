"""The claim lifecycle in-process: prepare, repeat, unprepare, with fake Kubernetes and the
fake Thunder service, and each prepare step's failure rolled back without a leak."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.unit.plugin.fakes import CrashAt, Crashed, Recording, until
from tests.unit.plugin.lifecycle_node import NAMESPACE, World
from thunder_dra.api import ClaimReference
from thunder_dra.kube.errors import Invalid
from thunder_dra.kube.resources import EVENTS
from thunder_dra.plugin.kubelet import handler
from thunder_dra.plugin.state.checkpoint import ClaimState, PreparedClaim
from thunder_dra.plugin.state.crashpoints import PREPARE_STEPS, UNPREPARE_STEPS
from thunder_dra.plugin.state.journal import MintJournal, MintPurpose


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _prepared(result: object) -> PreparedClaim:
    assert isinstance(result, PreparedClaim), result
    return result


async def test_a_pod_claim_is_prepared_repeated_and_unprepared(world: World) -> None:
    crash = Recording()
    daemon = await world.start(crash=crash)
    ref = world.claim("train", devices=2)

    first = _prepared((await daemon.prepare(ref))[ref.uid])
    assert [d.device_name for d in first.devices] == ["a6000-0", "a6000-1"]
    assert {d.cdi_device_ids for d in first.devices} == {
        (f"thundercompute.com/gpu=claim-{ref.uid}",)
    }
    assert first.state is ClaimState.PREPARED
    assert crash.reached_steps == [s for s in PREPARE_STEPS if s != "prepare:secret-written"]
    await daemon.service.drain()  # the record's status is written after the answer
    (record,) = world.client_records()
    assert record["spec"]["enrollmentTokenId"] == first.enrollment_token_id
    assert record["spec"]["clientId"] == first.client_id
    assert record["status"] == {"phase": "Enrolled", "clientId": first.client_id}
    assert world.live_clients() == [first.client_id]
    assert world.checkpoint_claims()[ref.uid]["clientId"] == first.client_id
    config = world.root / "state" / "claims" / ref.uid / "config.json"
    assert config.is_file()
    assert world.open_journal_entries() == []

    again = _prepared((await daemon.prepare(ref))[ref.uid])
    assert again == first  # same answer, no second enrollment
    assert len(world.thunder.state.tokens) == 1

    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert crash.reached_steps[-len(UNPREPARE_STEPS) + 1 :] == [
        s for s in UNPREPARE_STEPS if s != "unprepare:secret-removed"
    ]
    world.assert_clean()
    # An unprepare of a claim already gone is a success too.
    assert await daemon.unprepare(ref) == {ref.uid: ""}


async def test_a_vm_claim_gets_a_setup_secret_and_no_node_files(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("desk", vm=True)
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    assert prepared.is_vm
    assert prepared.client_id is None
    assert all(d.cdi_device_ids == () for d in prepared.devices)
    (secret,) = world.secrets()
    assert secret["metadata"]["name"] == "desk-thunder-setup"
    assert world.node_files() == []
    (record,) = world.client_records()
    assert record["spec"]["consumerKind"] == "VirtualMachine"
    assert record["spec"]["consumerName"] == "desk-vm"

    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert world.secrets() == []
    assert world.client_records() == []
    assert world.live_tokens() == []


async def test_a_claim_without_an_allocation_is_a_per_claim_error(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("pending")
    del world.claim_object(ref)["status"]["allocation"]
    ok = world.claim("fine")
    results = await daemon.prepare(ref, ok)
    assert (
        results[ref.uid] == f"claim {NAMESPACE}/pending: not allocated (status.allocation is empty)"
    )
    _prepared(results[ok.uid])
    (event,) = world.of_collection(EVENTS.collection(NAMESPACE))
    assert event["reason"] == "ThunderPrepareFailed"
    assert event["involvedObject"]["uid"] == ref.uid
    assert world.thunder.state.tokens.keys() == {_prepared(results[ok.uid]).enrollment_token_id}


# Each Thunder step's failure: (fault rule, error the kubelet gets). The client retries a
# 5xx once (FAST_RETRY), so those rules answer twice; a 4xx is not retried.
THUNDER_FAILURES = [
    ({"method": "GET", "path": "/api/v1/zones", "status": 500, "times": 2}, "zone lookup failed"),
    (
        {"method": "POST", "path": "/api/v1/enrollment-tokens", "status": 403, "times": 1},
        "Thunder mint failed",
    ),
    (
        {"method": "POST", "path": "/api/v1/enrollment-tokens/enroll", "status": 500, "times": 2},
        "Thunder exchange failed",
    ),
    (
        {"method": "GET", "path": "/artifacts/libthunder.so", "status": 404, "times": 1},
        "libthunder",
    ),
]


@pytest.mark.parametrize(("fault", "message"), THUNDER_FAILURES, ids=lambda v: str(v)[:40])
async def test_a_failed_thunder_step_is_rolled_back_and_the_retry_succeeds(
    world: World, fault: dict[str, object], message: str
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    world.thunder.faults.add(fault)
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert error.startswith(f"claim {NAMESPACE}/train: ")
    assert message in error
    assert world.leaks() == []
    assert world.live_clients() == []
    assert world.client_records() == []
    assert world.open_journal_entries() == []
    assert world.checkpoint_claims() == {}

    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    assert world.live_clients() == [prepared.client_id]
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


# Each Kubernetes step's failure: (method, path pattern, status, error the kubelet gets).
KUBE_FAILURES = [
    ("GET", r"/resourceclaims/train$", 500, "the claim's read"),
    ("GET", r"/resourceslices$", 503, "reading the slices of pool"),
    ("POST", r"/clients$", 503, "create"),
]


@pytest.mark.parametrize(("method", "path", "status", "what"), KUBE_FAILURES)
async def test_a_failed_kubernetes_step_is_rolled_back_and_the_retry_succeeds(
    world: World, method: str, path: str, status: int, what: str
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail(method, path, status=status, times=None)
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str), what
    assert error.startswith(f"claim {NAMESPACE}/train: ")
    assert str(status) in error
    assert world.leaks() == []
    assert world.live_clients() == []
    assert world.live_tokens() == []
    assert world.client_records() == []
    assert world.node_files() == []
    assert world.open_journal_entries() == []

    world.kube.faults.clear()
    _prepared((await daemon.prepare(ref))[ref.uid])
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_a_vm_pod_that_cannot_be_read_fails_the_prepare_naming_it(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("desk", vm=True)
    world.kube.fail("GET", r"/pods/virt-launcher-desk-0$", status=500, times=None)
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert "reading the consuming pod" in error
    assert "500" in error
    assert world.live_tokens() == []
    assert world.leaks() == []
    world.kube.faults.clear()
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    assert prepared.consumer.kind == "vm"


async def test_a_pod_not_named_as_kubevirt_names_them_is_not_read(world: World) -> None:
    """Only a pod named ``virt-launcher-...`` can be a VM's; any other is prepared as a
    pod without reading it, labels or not."""
    daemon = await world.start()
    ref = world.claim("train", pod="trainer", vm=True)  # labelled, but not so named
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    assert prepared.consumer.kind == "pod"
    assert prepared.consumer.name == "trainer"
    assert world.kube.calls("GET", f"/api/v1/namespaces/{NAMESPACE}/pods") == []
    assert world.secrets() == []
    assert world.node_files()


async def test_a_vm_secret_that_cannot_be_written_is_rolled_back(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("desk", vm=True)
    world.kube.fail("POST", r"/secrets$", status=403)
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert "403" in error
    assert world.live_tokens() == []
    assert world.leaks() == []
    assert world.open_journal_entries() == []


async def test_a_mint_whose_answer_is_lost_is_the_one_unrevocable_window(world: World) -> None:
    """Thunder minted, then answered 503 (a mint is never retried: it is not idempotent).
    The token ID never reaches the node, so nothing can revoke it: the entry is closed and
    counted as unrevocable (docs/daemon.md, Crash safety); the kubelet's retry prepares."""
    daemon = await world.start()
    ref = world.claim("train")
    world.thunder.faults.add(
        {
            "method": "POST",
            "path": "/api/v1/enrollment-tokens",
            "status": 503,
            "after": True,
            "times": 1,
        }
    )
    error = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(error, str)
    assert "Thunder mint failed" in error
    assert {leak["reason"] for leak in world.leaks()} == {"unspent"}
    assert len(world.leaks()) == 1
    assert world.open_journal_entries() == []
    assert (
        daemon.metrics.registry.get_sample_value(
            "thunder_dra_daemon_journal_rollbacks_total", {"outcome": "unrevocable"}
        )
        == 1.0
    )
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    assert world.live_clients() == [prepared.client_id]


async def test_a_failing_prepare_retried_by_the_kubelet_is_one_event(world: World) -> None:
    """The kubelet retries a failed prepare every few seconds: the recorder the operator
    uses too counts the repeats into the one event instead of writing one each time."""
    daemon = await world.start()
    ref = world.claim("pending")
    del world.claim_object(ref)["status"]["allocation"]
    for _ in range(3):
        assert (await daemon.prepare(ref))[ref.uid].startswith(f"claim {NAMESPACE}/pending:")
    (event,) = world.of_collection(EVENTS.collection(NAMESPACE))
    assert event["involvedObject"]["uid"] == ref.uid
    assert len(world.kube.calls("POST", EVENTS.collection(NAMESPACE))) == 1


STATUS_WRITE = r"/clients/[^/]+/status$"


@pytest.fixture
def quick_record_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler, "RECORD_RETRY_SECONDS", 0.0)


@pytest.mark.usefixtures("quick_record_retries")
async def test_the_record_status_is_written_after_the_answer_and_retried(world: World) -> None:
    """The kubelet's answer does not wait for the record's status: a status write that
    fails does not fail the prepare, the record (client ID in its spec) stays Pending, and
    the write is tried again."""
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail("PATCH", STATUS_WRITE, status=500, times=2)
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    await daemon.service.drain()
    (record,) = world.client_records()
    assert record["spec"]["clientId"] == prepared.client_id
    assert record["status"] == {"phase": "Enrolled", "clientId": prepared.client_id}
    assert len(world.kube.calls("PATCH", "/apis/thundercompute.com")) >= 3
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


@pytest.mark.usefixtures("quick_record_retries")
async def test_a_record_left_pending_is_set_enrolled_by_the_next_prepare(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail("PATCH", STATUS_WRITE, status=500, times=None)
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    await daemon.service.drain()
    (record,) = world.client_records()
    assert record["spec"]["clientId"] == prepared.client_id
    assert "status" not in record  # every try failed: Pending
    world.kube.faults.clear()
    assert _prepared((await daemon.prepare(ref))[ref.uid]) == prepared
    await daemon.service.drain()
    (record,) = world.client_records()
    assert record["status"] == {"phase": "Enrolled", "clientId": prepared.client_id}


async def test_a_record_left_pending_by_a_crash_is_set_enrolled_at_start_up(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail("PATCH", STATUS_WRITE, hang=True, times=None)
    prepared = _prepared((await daemon.prepare(ref))[ref.uid])
    await daemon.kill()  # while the status write hangs
    (record,) = world.client_records()
    assert "status" not in record
    world.kube.faults.clear()
    restarted = await world.start(instance="instance-2")
    (record,) = world.client_records()
    assert record["status"] == {"phase": "Enrolled", "clientId": prepared.client_id}
    assert world.live_clients() == [prepared.client_id]
    assert await restarted.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_an_unprepare_cancels_a_record_status_write_not_under_way(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod deleted right after its start, while its record's status write waits for a
    retry: the unprepare cancels the write rather than queue behind it, and removes the
    record. (A write under way is never cut off: it goes on beside the unprepare.)"""
    monkeypatch.setattr(handler, "RECORD_RETRY_SECONDS", 3600.0)
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail("PATCH", STATUS_WRITE, status=500, times=None)

    def status_writes() -> list[object]:
        return [r for r in world.kube.calls("PATCH") if r.path.endswith("/status")]

    _prepared((await daemon.prepare(ref))[ref.uid])
    await until(status_writes, "the first try (once the calls pause)")
    assert len(status_writes()) == 1
    assert await asyncio.wait_for(daemon.unprepare(ref), 30) == {ref.uid: ""}
    await asyncio.wait_for(daemon.service.drain(), 30)  # not an hour: the retry is gone
    assert len(status_writes()) == 1
    world.assert_clean()


async def test_a_pod_deleted_right_after_its_start_costs_no_record_status_write(
    world: World,
) -> None:
    """The record's status write waits for a pause in the kubelet's calls: an unprepare
    that follows the prepare's answer at once cancels it before it is sent, and the record
    is removed without it."""
    daemon = await world.start()
    ref = world.claim("train")
    _prepared((await daemon.prepare(ref))[ref.uid])
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    assert [r for r in world.kube.calls("PATCH") if re.search(STATUS_WRITE, r.path)] == []
    world.assert_clean()


async def test_under_calls_that_never_pause_the_record_status_is_written_all_the_same(
    world: World,
) -> None:
    """Another call stays in flight the whole time: the record's status write goes ahead
    once the lull's longest deferral has passed, not when the calls end."""
    daemon = await world.start()
    daemon.service.lull.longest = 0.2
    ref = world.claim("train")
    async with daemon.service.lull.call():
        prepared = _prepared((await daemon.prepare(ref))[ref.uid])
        await asyncio.wait_for(daemon.service.drain(), 30)
        (record,) = world.client_records()
        assert record["status"] == {"phase": "Enrolled", "clientId": prepared.client_id}
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_an_unprepare_goes_on_beside_a_record_status_write_in_flight(world: World) -> None:
    """A pod deleted right after its start, while its record's status write is in flight:
    the unprepare revokes, removes the files and the record without waiting for it."""
    daemon = await world.start()
    ref = world.claim("train")
    world.kube.fail("PATCH", STATUS_WRITE, hang=True, times=1)
    _prepared((await daemon.prepare(ref))[ref.uid])
    await asyncio.wait_for(world.kube.hung.wait(), 5)
    assert await asyncio.wait_for(daemon.service.unprepare([ref]), 5) == {ref.uid: ""}
    assert world.live_tokens() == []
    assert world.live_clients() == []
    assert world.node_files() == []
    await until(
        lambda: not world.client_records() and not world.checkpoint_claims(),
        "the record's removal after the answer",
    )
    await daemon.kill()  # the status write still hangs
    world.assert_clean()


@pytest.mark.usefixtures("quick_record_retries")
async def test_a_record_status_write_lands_only_on_the_record_of_its_enrollment(
    world: World,
) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    first = _prepared((await daemon.prepare(ref))[ref.uid])
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.kube.fail("PATCH", STATUS_WRITE, status=500, times=3)
    second = _prepared((await daemon.prepare(ref))[ref.uid])
    await daemon.service.drain()
    (record,) = world.client_records()
    assert "status" not in record  # the claim's new record, still Pending
    records = daemon.preparer.d.records
    await records.mark_enrolled(first)  # the earlier enrollment's write, late
    (record,) = world.client_records()
    assert "status" not in record
    # An invalid status of the record's own enrollment is not taken for a replaced record.
    world.kube.fail("PATCH", STATUS_WRITE, status=422, times=1)
    with pytest.raises(Invalid):
        await records.mark_enrolled(second)
    await records.mark_enrolled(second)
    (record,) = world.client_records()
    assert record["status"] == {"phase": "Enrolled", "clientId": second.client_id}
    assert await daemon.unprepare(ref) == {ref.uid: ""}
    world.assert_clean()


async def test_the_journal_entry_is_begun_while_the_claim_is_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry needs only the claim's identity: it is on disk before the claim read
    answers, and nothing is minted before the read."""
    daemon = await world.start()
    ref = world.claim("train")
    kube = daemon.preparer.d.kube
    read = kube.get_claim
    answer = asyncio.Event()

    async def held(namespace: str, name: str) -> object:
        await answer.wait()
        return await read(namespace, name)

    monkeypatch.setattr(kube, "get_claim", held)
    call = asyncio.ensure_future(daemon.prepare(ref))
    await until(lambda: world.open_journal_entries() != [], "an entry during the claim read")
    assert not call.done()
    assert world.thunder.state.tokens == {}
    answer.set()
    prepared = _prepared((await call)[ref.uid])
    assert world.live_clients() == [prepared.client_id]
    assert world.open_journal_entries() == []


@pytest.mark.parametrize("failure", ["missing", "unallocated", "unreadable", "unnameable"])
async def test_a_claim_that_fails_before_its_mint_leaves_no_journal_entry(
    world: World, failure: str
) -> None:
    """The entry begun during the read is closed when the claim fails before its mint:
    nothing is counted unrevocable, then or at the next start-up."""
    daemon = await world.start()
    ref = world.claim("train")
    if failure == "missing":
        world.delete_claim(ref)
    elif failure == "unallocated":
        del world.claim_object(ref)["status"]["allocation"]
    elif failure == "unreadable":
        world.kube.fail("GET", r"/resourceclaims/train$", status=500, times=None)
    else:  # a UID that cannot name the claim's directory
        ref = ClaimReference(namespace=ref.namespace, name=ref.name, uid=".hidden")
        world.claim_object(ref)["metadata"]["uid"] = ref.uid
    assert isinstance((await daemon.prepare(ref))[ref.uid], str)
    assert world.open_journal_entries() == []
    assert world.thunder.state.tokens == {}
    await daemon.kill()
    daemon = await world.start()
    assert (
        daemon.metrics.registry.get_sample_value(
            "thunder_dra_daemon_journal_rollbacks_total", {"outcome": "unrevocable"}
        )
        == 0.0
    )
    await daemon.stop()


async def test_a_vm_claims_entry_says_vm_before_its_mint(world: World) -> None:
    """Begun as a pod's while the claim is read, the entry of a VM's claim says ``vm`` on
    disk before the mint, so a rollback removes the VM's Secret."""
    daemon = await world.start(crash=CrashAt("prepare:token-recorded"))
    ref = world.claim("desk", vm=True)
    with pytest.raises(Crashed):
        await daemon.prepare(ref)
    await daemon.kill()
    (name,) = world.open_journal_entries()
    (entry,) = MintJournal((world.root / "state" / "journal" / name).parent).open_entries_sync()
    assert entry.purpose is MintPurpose.VM
    assert entry.enrollment_token_id in world.live_tokens()
