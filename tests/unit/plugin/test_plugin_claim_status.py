"""The daemon's entries in ResourceClaim.status.devices (thunder_dra/plugin/claims/status.py):
their shape and limits, that no secret reaches them, that nothing is written when nothing
changed, and that a failed write is retried in the background without failing anything:
the kubelet's handler answers before the write and whatever the write does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from tests.unit.plugin.fakes import until
from thunder_dra.kube.errors import Forbidden, Invalid, NotFound
from thunder_dra.kube.resources import RESOURCE_CLAIMS
from thunder_dra.plugin.claims.status import (
    CONDITION_READY,
    FIELD_MANAGER,
    MAX_CONDITIONS,
    MAX_DATA_BYTES,
    MAX_MESSAGE,
    REASON_PREPARED,
    TRUNCATED,
    ClaimStatusWriter,
    Outcome,
    check_entry,
    desired_entries,
    failed_outcome,
    prepared_outcome,
)
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.kubelet.handler import ClaimService
from thunder_dra.plugin.metrics import DaemonMetrics, ErrorReason
from thunder_dra.plugin.state.checkpoint import CheckpointStore, Consumer, PreparedClaim
from thunder_dra.plugin.state.locks import CallLull, KeyedLocks, NodeSerializeLock
from thunder_dra.process.logs import SecretScrubber

pytestmark = pytest.mark.unit

DRIVER = "thundercompute.com"
OTHER = "net.example.com"
TOKEN = "tcet_enroll-5b0c7d1e9f"
NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
PATH = RESOURCE_CLAIMS.item("gpu", "work")


def _claim(*, devices: list[dict[str, Any]] | None = None, uid: str = "uid-1") -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": "zone-a-a6000", "device": "gpu-0"},
        {"request": "gpu", "driver": DRIVER, "pool": "zone-a-a6000", "device": "gpu-1"},
        {"request": "nic", "driver": OTHER, "pool": "node-1", "device": "eth1"},
    ]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if devices is not None:
        status["devices"] = devices
    return {
        "metadata": {"name": "gpu", "namespace": "work", "uid": uid},
        "status": status,
    }


def _prepared(*, client_id: str | None = "client-42", vm: bool = False) -> PreparedClaim:
    return PreparedClaim(
        uid="uid-1",
        namespace="work",
        name="gpu",
        consumer=Consumer(kind="vm" if vm else "pod", name="p"),
        zone_name="zone-a",
        zone_id="z-1",
        gpu_type="A6000",
        gpu_count=2,
        enrollment_token_id="tok-1",
        client_id=client_id,
    )


OTHER_ENTRY = {
    "driver": OTHER,
    "pool": "node-1",
    "device": "eth1",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Up",
            "message": "",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
    ],
}


def test_a_prepared_claim_gets_one_ready_entry_per_device_of_this_driver() -> None:
    entries = desired_entries(_claim(), DRIVER, prepared_outcome(_prepared()), NOW)
    assert [(e["driver"], e["pool"], e["device"]) for e in entries] == [
        (DRIVER, "zone-a-a6000", "gpu-0"),
        (DRIVER, "zone-a-a6000", "gpu-1"),
    ]
    for entry in entries:
        (condition,) = entry["conditions"]
        assert condition["type"] == CONDITION_READY
        assert condition["status"] == "True"
        assert condition["reason"] == REASON_PREPARED
        assert condition["lastTransitionTime"] == "2026-12-02T09:00:00Z"
        assert entry["data"] == {
            "zone": "zone-a",
            "gpuModel": "A6000",
            "thunderClientId": "client-42",
        }
        assert set(entry) == {"driver", "pool", "device", "conditions", "data"}
        assert len(entry["conditions"]) <= MAX_CONDITIONS
        assert len(json.dumps(entry["data"]).encode()) <= MAX_DATA_BYTES


def test_a_vm_claim_has_no_client_id_and_a_shared_device_keeps_its_share_id() -> None:
    claim = _claim()
    claim["status"]["allocation"]["devices"]["results"][0]["shareID"] = "share-1"
    entries = desired_entries(
        claim, DRIVER, prepared_outcome(_prepared(vm=True, client_id=None)), NOW
    )
    assert entries[0]["shareID"] == "share-1"
    assert "shareID" not in entries[1]
    assert entries[0]["data"] == {"zone": "zone-a", "gpuModel": "A6000"}


def test_a_failed_prepare_is_not_ready_with_its_step_and_error_and_no_data() -> None:
    outcome = failed_outcome("Thunder mint failed: 503 unavailable", ErrorReason.THUNDER_MINT, str)
    (entry, _) = desired_entries(_claim(), DRIVER, outcome, NOW)
    (condition,) = entry["conditions"]
    assert condition["status"] == "False"
    assert condition["reason"] == "ThunderMintFailed"
    assert condition["message"] == "Thunder mint failed: 503 unavailable"
    assert "data" not in entry


def test_an_error_message_is_scrubbed_of_secrets_and_bounded() -> None:
    scrubber = SecretScrubber()
    scrubber.add(TOKEN)
    message = f"Thunder exchange failed: token {TOKEN} refused; " + "x" * 5000
    outcome = failed_outcome(message, ErrorReason.THUNDER_EXCHANGE, scrubber.scrub)
    assert TOKEN not in outcome.message
    assert len(outcome.message) == MAX_MESSAGE
    assert outcome.message.endswith(TRUNCATED)
    entries = desired_entries(_claim(), DRIVER, outcome, NOW)
    assert TOKEN not in json.dumps(entries)


def test_no_token_ever_reaches_a_prepared_entry() -> None:
    entries = desired_entries(_claim(), DRIVER, prepared_outcome(_prepared()), NOW)
    text = json.dumps(entries)
    assert "tok-1" not in text  # not even the enrollment token's ID
    assert "token" not in text.lower()


def test_the_limits_are_checked() -> None:
    condition = {"type": "Ready", "status": "True"}
    with pytest.raises(ValueError, match="conditions"):
        check_entry({"conditions": [condition] * (MAX_CONDITIONS + 1)})
    with pytest.raises(ValueError, match="bytes"):
        check_entry({"conditions": [], "data": {"zone": "z" * MAX_DATA_BYTES}})
    with pytest.raises(ValueError, match="keys"):
        check_entry({"conditions": [], "data": {"token": "x"}})


def test_a_condition_keeps_its_transition_time_while_its_status_stays() -> None:
    first = desired_entries(_claim(), DRIVER, prepared_outcome(_prepared()), NOW)
    later = NOW + timedelta(hours=1)
    again = desired_entries(_claim(devices=first), DRIVER, prepared_outcome(_prepared()), later)
    assert again == first
    failed = failed_outcome("boom", ErrorReason.INTERNAL, str)
    flipped = desired_entries(_claim(devices=first), DRIVER, failed, later)
    assert flipped[0]["conditions"][0]["lastTransitionTime"] == "2026-12-02T10:00:00Z"


def test_an_unprepared_claim_has_no_entries() -> None:
    assert desired_entries(_claim(), DRIVER, Outcome(ready=None), NOW) == []


class FakeClaims:
    """The claim's GET and a server-side apply by one field manager of one driver's entries."""

    def __init__(self, claim: dict[str, Any] | None) -> None:
        self.claim = claim
        self.applies: list[tuple[str, dict[str, Any], str, bool]] = []
        self.failures: list[Exception] = []
        self.gets = 0

    async def get(self, path: str, *, request_timeout: float | None = None) -> dict[str, Any]:
        assert path == PATH
        self.gets += 1
        if self.claim is None:
            raise NotFound("GET", path, 404, "NotFound", "not found")
        copy: dict[str, Any] = json.loads(json.dumps(self.claim))
        return copy

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        if self.failures:
            raise self.failures.pop(0)
        if self.claim is None:
            raise NotFound("PATCH", path, 404, "NotFound", "not found")
        uid = body["metadata"]["uid"]
        if uid != self.claim["metadata"]["uid"]:
            raise Invalid("PATCH", path, 422, "Invalid", f"metadata.uid: {uid}: immutable")
        allocated = {(r["pool"], r["device"]) for r in _allocated(self.claim)}
        if any((d["pool"], d["device"]) not in allocated for d in body["status"]["devices"]):
            raise Invalid("PATCH", path, 422, "Invalid", "status.devices: not allocated")
        self.applies.append((path, json.loads(json.dumps(body)), field_manager, force))
        kept = [d for d in self.claim["status"].get("devices") or [] if d["driver"] != DRIVER]
        self.claim["status"]["devices"] = kept + list(body["status"]["devices"])
        return self.claim


def _allocated(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = (
        (claim["status"].get("allocation") or {}).get("devices") or {}
    ).get("results") or []
    return results


def _writer(
    api: FakeClaims, registry: CollectorRegistry, lull: CallLull | None = None
) -> ClaimStatusWriter:
    return ClaimStatusWriter(
        api,
        driver=DRIVER,
        scrub=str,
        registry=registry,
        retry_base=0.001,
        retry_cap=0.001,
        lull=lull,
    )


def _count(registry: CollectorRegistry, result: str) -> float:
    value = registry.get_sample_value(
        "thunder_dra_daemon_claim_status_writes_total", {"result": result}
    )
    assert value is not None
    return value


async def test_the_writer_writes_only_its_entries_and_only_when_they_change() -> None:
    api = FakeClaims(_claim(devices=[OTHER_ENTRY]))
    registry = CollectorRegistry()
    writer = _writer(api, registry)
    writer.prepared(_prepared())
    await writer.idle()
    ((path, body, manager, force),) = api.applies
    assert path == RESOURCE_CLAIMS.item("gpu", "work", "status")
    assert manager == FIELD_MANAGER
    assert force
    assert body["kind"] == "ResourceClaim"
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert set(body["status"]) == {"devices"}
    assert {d["driver"] for d in body["status"]["devices"]} == {DRIVER}
    assert api.claim is not None
    assert OTHER_ENTRY in api.claim["status"]["devices"]

    writer.prepared(_prepared())  # the kubelet's repeated prepare: nothing changed
    await writer.idle()
    assert len(api.applies) == 1
    assert _count(registry, "written") == 1
    assert _count(registry, "unchanged") == 1

    writer.unprepared(_prepared())
    await writer.idle()
    assert api.applies[-1][1]["status"] == {"devices": []}
    assert api.claim["status"]["devices"] == [OTHER_ENTRY]
    writer.unprepared(_prepared())
    await writer.idle()
    assert len(api.applies) == 2


async def test_a_failed_write_is_retried_and_counted_and_never_raises() -> None:
    api = FakeClaims(_claim())
    api.failures = [Forbidden("PATCH", PATH, 403, "Forbidden", "no")] * 2
    registry = CollectorRegistry()
    writer = _writer(api, registry)
    writer.failed(_prepared(), "Thunder mint failed: refused", ErrorReason.THUNDER_MINT)
    await writer.idle()
    assert _count(registry, "error") == 2
    assert _count(registry, "written") == 1
    assert api.claim is not None
    (entry, _) = api.claim["status"]["devices"]
    assert entry["conditions"][0]["status"] == "False"


async def test_the_newest_outcome_of_a_claim_replaces_one_not_yet_written() -> None:
    api = FakeClaims(_claim())
    registry = CollectorRegistry()
    writer = _writer(api, registry)
    writer.failed(_prepared(), "first", ErrorReason.INTERNAL)
    writer.prepared(_prepared())  # before the writer's task ran
    await writer.idle()
    assert len(api.applies) == 1
    assert api.claim is not None
    assert {d["conditions"][0]["status"] for d in api.claim["status"]["devices"]} == {"True"}


async def test_a_claim_unprepared_while_the_calls_go_on_costs_no_request() -> None:
    """Outcomes wait while a kubelet call is in flight; the unprepare's replaces the
    prepare's before either is written, and the claim as the prepare read it already
    says it: none of this driver's entries, and none set since."""
    api = FakeClaims(_claim(devices=[OTHER_ENTRY]))
    registry = CollectorRegistry()
    writer = _writer(api, registry, CallLull(lull=0.01, longest=60))
    async with writer.lull.call():
        writer.prepared(_prepared(), _claim(devices=[OTHER_ENTRY]))
        await asyncio.sleep(0.05)
        assert (api.gets, api.applies) == (0, [])
        writer.unprepared(_prepared())
    await asyncio.wait_for(writer.idle(), 10)
    assert (api.gets, api.applies) == (0, [])
    assert _count(registry, "unchanged") == 1


async def test_entries_in_the_claim_the_prepare_read_are_removed_without_a_read() -> None:
    """Entries a restarted daemon's predecessor set are in the claim the prepare read: the
    unprepare that replaces the prepare's outcome removes them with one apply."""
    ours = {"driver": DRIVER, "pool": "zone-a-a6000", "device": "gpu-0", "conditions": []}
    api = FakeClaims(_claim(devices=[OTHER_ENTRY, ours]))
    writer = _writer(api, CollectorRegistry(), CallLull(lull=0.01, longest=60))
    async with writer.lull.call():
        writer.prepared(_prepared(), _claim(devices=[OTHER_ENTRY, ours]))
        writer.unprepared(_prepared())
    await asyncio.wait_for(writer.idle(), 10)
    assert api.gets == 0
    assert [body["status"] for _, body, _, _ in api.applies] == [{"devices": []}]
    assert api.claim is not None
    assert api.claim["status"]["devices"] == [OTHER_ENTRY]


class _AnswerLost(FakeClaims):
    """An apply that lands but whose answer never arrives (a timeout on the way back)."""

    def __init__(self, claim: dict[str, Any]) -> None:
        super().__init__(claim)
        self.lost = 1

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        answer = await super().apply(path, body, field_manager=field_manager, force=force)
        if self.lost:
            self.lost -= 1
            raise TimeoutError("no answer")
        return answer


async def test_after_a_write_of_unknown_fate_the_unprepare_removes_what_it_may_have_set() -> None:
    """A failure's apply landed without an answer; while its retry waits the kubelet
    prepares again (its read taken before the apply landed) and unprepares: the claim the
    prepare read no longer says what is stored, so the unprepare's removal is sent."""
    api = _AnswerLost(_claim(devices=[OTHER_ENTRY]))
    before = _claim(devices=[OTHER_ENTRY])
    registry = CollectorRegistry()
    writer = ClaimStatusWriter(
        api, driver=DRIVER, scrub=str, registry=registry, retry_base=0.2, retry_cap=0.2
    )
    writer.failed(_prepared(), "Thunder mint failed: refused", ErrorReason.THUNDER_MINT)
    await until(lambda: _count(registry, "error") == 1)
    assert api.claim is not None
    assert len(api.claim["status"]["devices"]) == 3  # it landed
    writer.prepared(_prepared(), before)
    writer.unprepared(_prepared())
    await asyncio.wait_for(writer.idle(), 10)
    assert api.gets == 1  # the failure's write read the claim
    assert api.applies[-1][1]["status"] == {"devices": []}
    assert api.claim["status"]["devices"] == [OTHER_ENTRY]


async def test_under_calls_that_never_pause_an_outcome_is_written_all_the_same() -> None:
    api = FakeClaims(_claim())
    registry = CollectorRegistry()
    writer = _writer(api, registry, CallLull(lull=0.01, longest=0.2))
    async with writer.lull.call():
        writer.prepared(_prepared(), api.claim)
        await asyncio.wait_for(writer.idle(), 10)
        assert len(api.applies) == 1


@pytest.mark.parametrize("outcome", ["prepared", "failed"])
async def test_the_outcome_of_a_prepare_before_binding_does_not_wait(outcome: str) -> None:
    """The scheduler waits for it: written while calls are in flight, even when an outcome
    of the claim was already waiting for a pause."""
    api = FakeClaims(_claim())
    registry = CollectorRegistry()
    writer = _writer(api, registry, CallLull(lull=0.01, longest=60))
    async with writer.lull.call():
        writer.unprepared(_prepared())
        await asyncio.sleep(0.05)
        assert api.gets == 0
        if outcome == "prepared":
            writer.prepared(_prepared(), api.claim, urgent=True)
        else:
            writer.failed(
                _prepared(), "Thunder mint failed", ErrorReason.THUNDER_MINT, before_binding=True
            )
        await until(lambda: api.applies, "the urgent write")
        assert writer.lull.calls == 1
    await asyncio.wait_for(writer.idle(), 10)
    assert len(api.applies) == 1
    assert api.claim is not None
    ready = {
        c["status"]
        for d in api.claim["status"]["devices"]
        for c in d["conditions"]
        if d["driver"] == DRIVER and c["type"] == "Ready"
    }
    assert ready == ({"True"} if outcome == "prepared" else {"False"})


async def test_a_claim_gone_or_recreated_is_left_alone() -> None:
    registry = CollectorRegistry()
    gone = FakeClaims(None)
    writer = _writer(gone, registry)
    writer.prepared(_prepared())
    await writer.idle()
    recreated = FakeClaims(_claim(uid="uid-2"))
    writer = _writer(recreated, CollectorRegistry())
    writer.prepared(_prepared())
    await writer.idle()
    assert gone.applies == []
    assert recreated.applies == []
    assert _count(registry, "gone") == 1


async def test_close_stops_a_write_that_keeps_failing() -> None:
    api = FakeClaims(_claim())
    api.failures = [Forbidden("PATCH", PATH, 403, "Forbidden", "no")] * 1000
    writer = ClaimStatusWriter(
        api, driver=DRIVER, scrub=str, registry=CollectorRegistry(), retry_base=60, retry_cap=60
    )
    writer.prepared(_prepared())
    await asyncio.sleep(0)
    await writer.close(grace=0.01)
    await writer.idle()
    assert api.applies == []


class _Preparer:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    async def prepare(self, ref: Any) -> tuple[PreparedClaim, dict[str, Any]]:
        if self.fail:
            raise ClaimError("Thunder mint failed: refused", ErrorReason.THUNDER_MINT)
        return _prepared(), _claim()


class _Unpreparer:
    async def unprepare(self, ref: Any) -> None:
        return None


class _Records:
    async def claim_event(self, *args: Any) -> None:
        return None


class _BlockingClaims(FakeClaims):
    """A status write that waits until the test lets it go, or fails."""

    def __init__(self, claim: dict[str, Any]) -> None:
        super().__init__(claim)
        self.release = asyncio.Event()

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        await self.release.wait()
        return await super().apply(path, body, field_manager=field_manager, force=force)


def _service(tmp_path: Path, api: FakeClaims, *, fail: bool) -> tuple[ClaimService, Any]:
    registry = CollectorRegistry()
    writer = _writer(api, registry)

    async def reload() -> None:
        return None

    checkpoint = CheckpointStore(tmp_path / "state")
    service = ClaimService(
        preparer=cast(Any, _Preparer(fail)),
        repairer=cast(Any, None),
        unpreparer=cast(Any, _Unpreparer()),
        checkpoint=checkpoint,
        records=cast(Any, _Records()),
        node_lock=NodeSerializeLock(tmp_path / "serialize.lock", reload),
        claim_locks=KeyedLocks(),
        metrics=DaemonMetrics(registry),
        tracer=NoOpTracer(),
        status=writer,
    )
    return service, writer


async def test_the_kubelet_has_its_answer_before_the_status_is_written(tmp_path: Path) -> None:
    api = _BlockingClaims(_claim())
    service, writer = _service(tmp_path, api, fail=False)
    ref = _prepared()
    answers = await service.prepare([ref])
    assert isinstance(answers[ref.uid], PreparedClaim)
    assert api.applies == []  # the write still waits
    api.release.set()
    await writer.idle()
    assert len(api.applies) == 1
    assert await service.unprepare([ref]) == {ref.uid: ""}
    await writer.idle()
    assert api.applies[-1][1]["status"] == {"devices": []}


async def test_a_failing_status_write_changes_no_answer(tmp_path: Path) -> None:
    api = FakeClaims(_claim())
    api.failures = [Forbidden("PATCH", PATH, 403, "Forbidden", "no")] * 3
    service, writer = _service(tmp_path, api, fail=True)
    ref = _prepared()
    answers = await service.prepare([ref])
    assert answers[ref.uid] == "claim work/gpu: Thunder mint failed: refused"
    await writer.idle()
    assert api.claim is not None
    (entry, _) = api.claim["status"]["devices"]
    assert entry["conditions"][0]["reason"] == "ThunderMintFailed"
    assert entry["conditions"][0]["message"] == "Thunder mint failed: refused"


async def test_close_lets_a_write_in_flight_finish_within_the_grace() -> None:
    api = _BlockingClaims(_claim())
    writer = _writer(api, CollectorRegistry())
    writer.prepared(_prepared())
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_soon(api.release.set)
    await writer.close(grace=30)
    assert len(api.applies) == 1


async def test_a_fresh_prepare_writes_from_the_claim_it_read_and_its_unprepare_reads_nothing() -> (
    None
):
    api = FakeClaims(_claim(devices=[OTHER_ENTRY]))
    registry = CollectorRegistry()
    writer = _writer(api, registry)
    writer.prepared(_prepared(), _claim(devices=[OTHER_ENTRY]))
    await writer.idle()
    ((_, body, _, _),) = api.applies
    assert body["metadata"] == {"name": "gpu", "namespace": "work", "uid": "uid-1"}
    assert [d["device"] for d in body["status"]["devices"]] == ["gpu-0", "gpu-1"]
    writer.unprepared(_prepared())
    await writer.idle()
    assert api.applies[-1][1]["status"] == {"devices": []}
    assert api.gets == 0
    assert _count(registry, "written") == 2
    assert api.claim is not None
    assert api.claim["status"]["devices"] == [OTHER_ENTRY]

    # A writer that did not set the entries (a restarted daemon) reads the claim first.
    restarted = _writer(api, CollectorRegistry())
    restarted.unprepared(_prepared())
    await restarted.idle()
    assert api.gets == 1
    assert len(api.applies) == 2


async def test_a_repeated_prepare_of_entries_this_writer_set_reads_and_writes_nothing() -> None:
    api = FakeClaims(_claim())
    registry = CollectorRegistry()
    writer = _writer(api, registry)
    writer.prepared(_prepared(), _claim())
    await writer.idle()
    writer.prepared(_prepared())  # the kubelet's prepare of a claim enrolled before binding
    await writer.idle()
    assert (api.gets, len(api.applies)) == (0, 1)
    assert _count(registry, "unchanged") == 1

    # Another outcome, or the same one to a writer that did not set the entries (a
    # restarted daemon), reads the claim first.
    writer.prepared(_prepared(client_id="client-43"))
    await writer.idle()
    assert (api.gets, len(api.applies)) == (1, 2)
    restarted = _writer(api, CollectorRegistry())
    restarted.prepared(_prepared(client_id="client-43"))
    await restarted.idle()
    assert (api.gets, len(api.applies)) == (2, 2)

    # A failure is read each time: a claim that failed may since be allocated anew.
    writer.failed(_prepared(), "Thunder mint failed: refused", ErrorReason.THUNDER_MINT)
    await writer.idle()
    writer.failed(_prepared(), "Thunder mint failed: refused", ErrorReason.THUNDER_MINT)
    await writer.idle()
    assert (api.gets, len(api.applies)) == (4, 3)


async def test_a_claim_read_before_it_changed_is_read_again() -> None:
    # The prepare read the claim allocated two devices; it now has one: the API server
    # refuses entries for a device not allocated, and the writer writes what it reads.
    read = _claim()
    now = _claim()
    now["status"]["allocation"]["devices"]["results"] = _allocated(now)[1:]
    api = FakeClaims(now)
    writer = _writer(api, CollectorRegistry())
    writer.prepared(_prepared(), read)
    await writer.idle()
    assert api.gets == 1
    assert api.claim is not None
    assert [d["device"] for d in api.claim["status"]["devices"]] == ["gpu-1"]


async def test_a_namesake_of_the_claim_read_or_set_is_left_alone() -> None:
    registry = CollectorRegistry()
    api = FakeClaims(_claim(uid="uid-2"))  # re-created under the same name
    writer = _writer(api, registry)
    writer.prepared(_prepared(), _claim())
    await writer.idle()
    assert api.applies == []
    assert _count(registry, "gone") == 1

    registry = CollectorRegistry()
    api = FakeClaims(_claim())
    writer = _writer(api, registry)
    writer.prepared(_prepared(), _claim())
    await writer.idle()
    api.claim = _claim(uid="uid-2")
    writer.unprepared(_prepared())
    await writer.idle()
    assert len(api.applies) == 1
    assert _count(registry, "gone") == 1
    writer.prepared(_prepared(), _claim(uid="uid-2"))  # not the claim's read: not used
    await writer.idle()
    assert _count(registry, "gone") == 2
    assert len(api.applies) == 1
