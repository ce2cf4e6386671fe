"""Enrollment before binding on the daemon's side (thunder_dra/plugin/claims/binding.py):
which node a claim's allocation names, when the scheduler waits for this driver's
``Enrolled``, and the watcher that enrolls this node's waiting claims once and releases
the checkpointed claims the kubelet will never prepare.

The watcher runs against scripted listings and watch windows, a handler that records
its calls (and can be held mid-enrollment), and a real checkpoint in a temporary folder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED
from thunder_dra.kube.errors import Gone, NotFound, Unavailable
from thunder_dra.kube.resources import PODS, RESOURCE_CLAIMS
from thunder_dra.plugin.claims import binding
from thunder_dra.plugin.claims.binding import (
    BindingWatcher,
    allocated_node,
    reserved_pod,
    waits_for_enrollment,
)
from thunder_dra.plugin.state.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRef,
    ClaimState,
    Consumer,
    PreparedClaim,
)

pytestmark = pytest.mark.unit

DRIVER = "thundercompute.com"
OTHER_DRIVER = "net.example.com"
NODE = "node-a"
CONDITION_READY_TYPE = "Ready"
JSON = dict[str, Any]


# -- claim bodies -------------------------------------------------------------------------


def _binds_to(node: str) -> JSON:
    term = {"key": "metadata.name", "operator": "In", "values": [node]}
    return {"nodeSelectorTerms": [{"matchFields": [term]}]}


def _zone_selector(zone: str) -> JSON:
    """How the operator's zone pools select nodes (no single node)."""
    term = {"key": "thundercompute.com/zone", "operator": "In", "values": [zone]}
    return {"nodeSelectorTerms": [{"matchExpressions": [term]}]}


def _result(*, driver: str = DRIVER, conditions: tuple[str, ...] = (ENROLLED,)) -> JSON:
    result: JSON = {"request": "gpu", "driver": driver, "pool": "zone-a", "device": "gpu-0"}
    if conditions:
        result["bindingConditions"] = list(conditions)
        result["bindingFailureConditions"] = [ENROLLMENT_FAILED]
    return result


def _entry(condition: str, status: str = "True", *, driver: str = DRIVER) -> JSON:
    return {
        "driver": driver,
        "pool": "zone-a",
        "device": "gpu-0",
        "conditions": [{"type": condition, "status": status}],
    }


def _claim(
    name: str = "gpu",
    *,
    uid: str | None = None,
    node: str | None = NODE,
    reserved: bool = True,
    results: list[JSON] | None = None,
    devices: list[JSON] | None = None,
) -> JSON:
    """A claim allocated to ``node`` (None: not allocated) that waits for ``Enrolled``
    unless told otherwise."""
    status: JSON = {}
    if node is not None:
        status["allocation"] = {
            "devices": {"results": [_result()] if results is None else results},
            "nodeSelector": _binds_to(node),
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    if devices is not None:
        status["devices"] = devices
    meta = {"name": name, "namespace": "work", "uid": uid or f"uid-{name}"}
    return {"metadata": meta, "status": status}


# -- allocated_node -----------------------------------------------------------------------


def test_one_matchfields_term_on_the_node_name_is_that_node() -> None:
    assert allocated_node(_claim(node="node-7")) == "node-7"


def _with_selector(selector: object) -> JSON:
    return {"status": {"allocation": {"nodeSelector": selector}}}


def _field(**changes: object) -> JSON:
    term: JSON = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    term.update(changes)
    return _with_selector({"nodeSelectorTerms": [{"matchFields": [term]}]})


NO_SINGLE_NODE: dict[str, object] = {
    "no status": {},
    "not allocated": _claim(node=None),
    "no node selector": {"status": {"allocation": {"devices": {"results": []}}}},
    "zone pool selector": _with_selector(_zone_selector("zone-a")),
    "two terms": _with_selector(
        {"nodeSelectorTerms": _binds_to(NODE)["nodeSelectorTerms"] * 2},
    ),
    "no terms": _with_selector({"nodeSelectorTerms": []}),
    "two fields": _with_selector(
        {
            "nodeSelectorTerms": [
                {"matchFields": _binds_to(NODE)["nodeSelectorTerms"][0]["matchFields"] * 2}
            ]
        }
    ),
    "two values": _field(values=[NODE, "node-b"]),
    "no values": _field(values=[]),
    "NotIn": _field(operator="NotIn"),
    "other key": _field(key="metadata.namespace"),
    "number value": _field(values=[7]),
    "null value": _field(values=[None]),
    "values a string": _field(values=NODE),
    "terms a dict": _with_selector({"nodeSelectorTerms": {"matchFields": []}}),
    "selector a list": _with_selector([_binds_to(NODE)]),
    "status a list": {"status": [1, 2]},
    "allocation a string": {"status": {"allocation": "node-a"}},
    "term a string": _with_selector({"nodeSelectorTerms": ["metadata.name"]}),
    "field a list": _with_selector({"nodeSelectorTerms": [{"matchFields": [["metadata.name"]]}]}),
}


@pytest.mark.parametrize("claim", NO_SINGLE_NODE.values(), ids=NO_SINGLE_NODE.keys())
def test_anything_but_one_node_is_none(claim: Mapping[str, Any]) -> None:
    assert allocated_node(claim) is None


_KEYS = st.sampled_from(
    [
        "status",
        "allocation",
        "nodeSelector",
        "nodeSelectorTerms",
        "matchFields",
        "matchExpressions",
        "key",
        "operator",
        "values",
        "reservedFor",
        "devices",
        "results",
        "driver",
        "bindingConditions",
        "conditions",
        "type",
        "metadata",
        "uid",
        "name",
        "namespace",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["metadata.name", "In", "NotIn", NODE, DRIVER, ENROLLED, "True"]),
)
_HOSTILE = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=25,
)


def _nest(path: list[str], leaf: object) -> JSON:
    body: object = leaf
    for key in reversed(path):
        body = {key: body}
    assert isinstance(body, dict)
    return body


_PLACES = st.sampled_from(
    [
        ["status"],
        ["status", "allocation"],
        ["status", "allocation", "nodeSelector"],
        ["status", "allocation", "nodeSelector", "nodeSelectorTerms"],
        ["status", "allocation", "devices"],
        ["status", "allocation", "devices", "results"],
        ["status", "devices"],
        ["status", "reservedFor"],
    ]
)
_CLAIMS = st.one_of(
    st.dictionaries(_KEYS, _HOSTILE, max_size=4),
    st.builds(_nest, _PLACES, _HOSTILE),
)


@given(claim=_CLAIMS)
def test_allocated_node_never_raises_on_hostile_claims(claim: JSON) -> None:
    node = allocated_node(claim)
    if node is not None:
        (term,) = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
        (field,) = term["matchFields"]
        assert (field["key"], field["operator"], field["values"]) == ("metadata.name", "In", [node])


def test_the_hostile_strategy_can_place_a_real_selector() -> None:
    """Its deepest place holds what names a node (the property above is not vacuous)."""
    claim = _nest(
        ["status", "allocation", "nodeSelector", "nodeSelectorTerms"],
        _binds_to(NODE)["nodeSelectorTerms"],
    )
    assert allocated_node(claim) == NODE


# -- waits_for_enrollment -------------------------------------------------------------------


def test_a_reserved_claim_whose_device_asks_for_enrolled_waits() -> None:
    assert waits_for_enrollment(_claim(), DRIVER)


def test_a_claim_reserved_for_nobody_does_not_wait() -> None:
    assert not waits_for_enrollment(_claim(reserved=False), DRIVER)
    claim = _claim()
    claim["status"]["reservedFor"] = []
    assert not waits_for_enrollment(claim, DRIVER)


@pytest.mark.parametrize(
    "results",
    [
        [],
        [_result(conditions=())],
        [_result(conditions=("example.com/Attached",))],
        [_result(driver=OTHER_DRIVER)],
        [_result(driver=OTHER_DRIVER), _result(conditions=())],
    ],
    ids=["no results", "no conditions", "other condition", "other driver", "mixed"],
)
def test_no_device_of_this_driver_asking_for_enrolled_means_no_wait(results: list[JSON]) -> None:
    assert not waits_for_enrollment(_claim(results=results), DRIVER)


def test_one_asking_device_among_others_is_enough() -> None:
    results = [_result(conditions=()), _result(driver=OTHER_DRIVER), _result()]
    assert waits_for_enrollment(_claim(results=results), DRIVER)


def test_an_unallocated_claim_does_not_wait() -> None:
    assert not waits_for_enrollment(_claim(node=None), DRIVER)


@pytest.mark.parametrize("condition", [ENROLLED, ENROLLMENT_FAILED])
def test_a_true_answer_of_this_driver_ends_the_wait(condition: str) -> None:
    assert not waits_for_enrollment(_claim(devices=[_entry(condition)]), DRIVER)
    other = _entry(CONDITION_READY_TYPE)
    assert not waits_for_enrollment(_claim(devices=[other, _entry(condition)]), DRIVER)


@pytest.mark.parametrize(
    "devices",
    [
        [_entry(ENROLLED, "False")],
        [_entry(ENROLLMENT_FAILED, "False")],
        [_entry(ENROLLED, "Unknown")],
        [_entry(CONDITION_READY_TYPE)],
        [_entry(ENROLLED, driver=OTHER_DRIVER)],
        [_entry(ENROLLMENT_FAILED, driver=OTHER_DRIVER)],
        [{"driver": DRIVER, "pool": "zone-a", "device": "gpu-0"}],
    ],
    ids=[
        "enrolled false",
        "failed false",
        "enrolled unknown",
        "only ready",
        "other driver enrolled",
        "other driver failed",
        "no conditions",
    ],
)
def test_false_conditions_and_other_drivers_answers_do_not_end_the_wait(
    devices: list[JSON],
) -> None:
    assert waits_for_enrollment(_claim(devices=devices), DRIVER)


def test_the_driver_name_decides_whose_devices_count() -> None:
    claim = _claim(results=[_result(driver=OTHER_DRIVER)])
    assert waits_for_enrollment(claim, OTHER_DRIVER)
    assert not waits_for_enrollment(claim, DRIVER)


# -- the watcher --------------------------------------------------------------------------


class Parked(Exception):
    """Never raised: the scripts ran out and the fake waits until cancelled."""


def _pod(name: str, uid: str = "pod-uid", **fields: Any) -> JSON:
    """A pod as the API server answers it: unbound and pending, unless ``fields`` say
    otherwise (``spec``, ``status``, ``metadata`` entries merged in)."""
    pod: JSON = {"metadata": {"name": name, "uid": uid}, "spec": {}, "status": {"phase": "Pending"}}
    for key, value in fields.items():
        pod[key] = {**pod[key], **value}
    return pod


class ScriptedKube:
    """Listings, watch windows and gets answered from scripts. A script entry that is an
    exception is raised. When the listings or windows run out the call waits until the
    test cancels the watcher."""

    def __init__(self) -> None:
        self.listings: list[tuple[list[JSON], str] | Exception] = []
        self.windows: list[tuple[list[JSON], str] | Exception] = []
        self.claims: dict[str, JSON | Exception] = {}
        # Pods the claims are reserved for: unbound and pending unless a test says else.
        self.pods: dict[str, JSON | None] = {}
        self.list_calls = 0
        self.window_versions: list[str] = []
        self.gets: list[str] = []
        self.parked = asyncio.Event()

    async def get(self, path: str, *, request_timeout: float | None = None) -> JSON:
        self.gets.append(path)
        await asyncio.sleep(0)
        found = self.claims.get(path)
        if found is None and "/pods/" in path:
            found = self.pods.get(path, _pod(path.rsplit("/", 1)[1]))
        if found is None:
            raise NotFound("GET", path, 404, "NotFound", "not found")
        if isinstance(found, Exception):
            raise found
        return found

    async def list_with_version(self, collection: str) -> tuple[list[JSON], str]:
        assert collection == RESOURCE_CLAIMS.collection()
        self.list_calls += 1
        return await self._next(self.listings)

    async def watch_window(
        self, collection: str, *, resource_version: str
    ) -> tuple[list[JSON], str]:
        assert collection == RESOURCE_CLAIMS.collection()
        self.window_versions.append(resource_version)
        return await self._next(self.windows)

    async def _next(
        self, script: list[tuple[list[JSON], str] | Exception]
    ) -> tuple[list[JSON], str]:
        await asyncio.sleep(0)
        if not script:
            self.parked.set()
            await asyncio.Event().wait()
            raise Parked
        answer = script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _prepared(claim: ClaimRef) -> PreparedClaim:
    return PreparedClaim(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        consumer=Consumer(kind="pod", name="p"),
        zone_name="zone-a",
        zone_id="z-1",
        gpu_type="A6000",
        gpu_count=1,
        state=ClaimState.PREPARED,
    )


class RecordingHandler:
    """Prepares into and releases from the checkpoint, recording each call; while
    ``hold`` is set, enrollments wait for ``proceed``."""

    def __init__(self, checkpoint: CheckpointStore) -> None:
        self.checkpoint = checkpoint
        self.calls: list[tuple[str, str]] = []
        self.hold = False
        self.proceed = asyncio.Event()
        self.enrolling = asyncio.Event()
        self.fail_with: Exception | None = None

    async def prepare_before_binding(self, ref: ClaimRef) -> PreparedClaim | str:
        self.calls.append(("enroll", ref.uid))
        self.enrolling.set()
        if self.hold:
            await self.proceed.wait()
        if self.fail_with is not None:
            raise self.fail_with
        claim = _prepared(ref)
        await self.checkpoint.put(claim)
        return claim

    async def release(self, ref: ClaimRef) -> str:
        self.calls.append(("release", ref.uid))
        await asyncio.sleep(0)
        await self.checkpoint.drop(ref.uid)
        return ref.uid

    def count(self, kind: str, uid: str) -> int:
        return self.calls.count((kind, uid))


class Rig:
    def __init__(self, checkpoint: CheckpointStore) -> None:
        self.kube = ScriptedKube()
        self.checkpoint = checkpoint
        self.handler = RecordingHandler(checkpoint)
        self.watcher = BindingWatcher(
            self.kube, self.handler, checkpoint, driver=DRIVER, node_name=NODE
        )
        self._task: asyncio.Task[None] | None = None

    async def checkpointed(self, *names: str) -> None:
        for name in names:
            await self.checkpoint.put(_prepared(_Ref("work", name, f"uid-{name}")))

    def listing(self, *claims: JSON, version: str = "10") -> None:
        self.kube.listings.append((list(claims), version))

    def window(self, *events: tuple[str, JSON], version: str = "") -> None:
        self.kube.windows.append(([{"type": t, "object": o} for t, o in events], version))

    async def run_until_parked(self) -> None:
        """Run the watcher until its scripts are used up and its work is done."""
        self._task = asyncio.get_running_loop().create_task(self.watcher.run())
        await self.kube.parked.wait()
        await self.watcher.idle()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await self._task
        await self.watcher.idle()

    def uids(self) -> set[str]:
        return set(self.checkpoint.current.claims)


class _Ref:
    def __init__(self, namespace: str, name: str, uid: str) -> None:
        self.namespace, self.name, self.uid = namespace, name, uid


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = CheckpointStore(tmp_path)
    await store.load()
    made = Rig(store)
    yield made
    await made.stop()


async def _settle(condition: Callable[[], bool], rounds: int = 200) -> None:
    """Let the loop run until ``condition`` holds (a bounded number of turns, no clock)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the watcher never got there")


async def test_a_waiting_claim_on_this_node_is_enrolled_once_while_events_repeat(
    rig: Rig,
) -> None:
    claim = _claim()
    rig.handler.hold = True
    rig.listing(claim)
    rig.window(("MODIFIED", claim), ("MODIFIED", claim), version="11")
    rig.window(("MODIFIED", claim), version="12")
    task = asyncio.get_running_loop().create_task(rig.watcher.run())
    await rig.kube.parked.wait()
    assert rig.handler.calls == [("enroll", "uid-gpu")], "held: one enrollment in flight"
    rig.handler.proceed.set()
    await rig.watcher.idle()
    assert rig.handler.calls == [("enroll", "uid-gpu")], "enrolled, not enrolled again"
    assert rig.uids() == {"uid-gpu"}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (None, "the pod is gone"),
        (_pod("p", uid="another-pod"), "the pod is gone"),
        (_pod("p", metadata={"deletionTimestamp": "2026-12-02T10:00:00Z"}), "being deleted"),
        (_pod("p", spec={"nodeName": NODE}), "bound already"),
        (_pod("p", status={"phase": "Succeeded"}), "has ended"),
        (_pod("p", status={"phase": "Failed"}), "has ended"),
    ],
    ids=["gone", "replaced", "deleting", "bound", "succeeded", "failed"],
)
async def test_a_claim_whose_pod_no_longer_waits_for_binding_is_not_enrolled(
    rig: Rig, caplog: pytest.LogCaptureFixture, pod: JSON | None, why: str
) -> None:
    # What the kubelet's unprepare leaves while the claim controller has not yet dropped
    # the reservation: no Enrolled entry, still reserved, its pod past binding.
    rig.kube.pods[PODS.item("p", "work")] = pod
    rig.listing(_claim())
    with caplog.at_level(logging.INFO, logger=binding.__name__):
        await rig.run_until_parked()
    assert rig.handler.calls == []
    assert rig.uids() == set()
    assert PODS.item("p", "work") in rig.kube.gets
    [record] = [r for r in caplog.records if r.getMessage().startswith("not enrolling")]
    assert why in record.__dict__["why"]
    assert record.__dict__["claim_uid"] == "uid-gpu"


async def test_a_claim_whose_pod_waits_unbound_is_enrolled(rig: Rig) -> None:
    rig.kube.pods[PODS.item("p", "work")] = _pod("p", status={"phase": "Pending"})
    rig.listing(_claim())
    await rig.run_until_parked()
    assert rig.handler.calls == [("enroll", "uid-gpu")]


def test_the_reserved_pod_is_the_first_core_pod_entry() -> None:
    claim = _claim()
    claim["status"]["reservedFor"] = [
        {"apiGroup": "example.com", "resource": "pods", "name": "other", "uid": "x"},
        {"resource": "jobs", "name": "j", "uid": "y"},
        {"resource": "pods", "name": "p", "uid": "pod-uid"},
        {"resource": "pods", "name": "q", "uid": "z"},
    ]
    assert reserved_pod(claim) == ("p", "pod-uid")
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p"}]
    assert reserved_pod(claim) == ("p", "")
    assert reserved_pod(_claim(reserved=False)) is None
    assert reserved_pod({"status": {"reservedFor": "not a list"}}) is None


async def test_an_enrolled_claim_seen_again_is_neither_enrolled_nor_released(rig: Rig) -> None:
    await rig.checkpointed("gpu")
    rig.listing(_claim())
    rig.window(("MODIFIED", _claim(devices=[_entry(ENROLLED)])))
    rig.window(("MODIFIED", _claim()))
    await rig.run_until_parked()
    assert rig.handler.calls == []
    assert rig.uids() == {"uid-gpu"}


@pytest.mark.parametrize(
    "claim",
    [
        _claim(node="node-b"),
        _claim(reserved=False),
        _claim(devices=[_entry(ENROLLMENT_FAILED)]),
        _claim(results=[_result(conditions=())]),
        _claim(node=None),
    ],
    ids=["other node", "not reserved", "already failed", "no binding conditions", "unallocated"],
)
async def test_a_claim_not_waiting_on_this_node_is_not_enrolled(rig: Rig, claim: JSON) -> None:
    rig.listing(claim)
    rig.window(("ADDED", claim), ("MODIFIED", claim))
    await rig.run_until_parked()
    assert rig.handler.calls == []
    assert rig.uids() == set()


def _cleared() -> JSON:
    return _claim(node=None, reserved=False)


def _elsewhere() -> JSON:
    return _claim(node="node-b")


@pytest.mark.parametrize(
    ("kind", "claim"),
    [("MODIFIED", _cleared()), ("DELETED", _claim()), ("MODIFIED", _elsewhere())],
    ids=["allocation cleared", "deleted", "allocated elsewhere"],
)
async def test_a_checkpointed_claim_the_kubelet_will_not_prepare_is_released(
    rig: Rig, kind: str, claim: JSON
) -> None:
    await rig.checkpointed("gpu", "kept")
    rig.listing(_claim(), _claim("kept"))
    rig.window((kind, claim))
    await rig.run_until_parked()
    assert rig.handler.calls == [("release", "uid-gpu")]
    assert rig.uids() == {"uid-kept"}


@pytest.mark.parametrize(
    "claim",
    [_cleared(), _elsewhere()],
    ids=["allocation cleared", "allocated elsewhere"],
)
async def test_a_listing_releases_checkpointed_claims_as_events_do(rig: Rig, claim: JSON) -> None:
    await rig.checkpointed("gpu")
    rig.listing(claim)
    await rig.run_until_parked()
    assert rig.handler.calls == [("release", "uid-gpu")]
    assert rig.uids() == set()


async def test_an_allocation_naming_no_single_node_releases_nothing(rig: Rig) -> None:
    await rig.checkpointed("gpu")
    zoned = _claim()
    zoned["status"]["allocation"]["nodeSelector"] = _zone_selector("zone-a")
    rig.listing(zoned)
    rig.window(("MODIFIED", zoned))
    await rig.run_until_parked()
    assert rig.handler.calls == []
    assert rig.uids() == {"uid-gpu"}


async def test_deleting_an_unknown_claim_releases_nothing(rig: Rig) -> None:
    await rig.checkpointed("kept")
    rig.listing(_claim("kept"))
    rig.window(("DELETED", _claim("gone")), ("DELETED", {"metadata": {"name": "no-uid"}}))
    await rig.run_until_parked()
    assert rig.handler.calls == []
    assert rig.uids() == {"uid-kept"}


async def test_a_checkpointed_claim_missing_from_a_listing_and_gone_is_released(
    rig: Rig,
) -> None:
    await rig.checkpointed("gone")
    rig.watcher.reconcile([])
    await rig.watcher.idle()
    assert rig.kube.gets == [RESOURCE_CLAIMS.item("gone", "work")]
    assert rig.handler.calls == [("release", "uid-gone")]
    assert rig.uids() == set()


async def test_a_missing_claim_replaced_by_a_newer_one_of_its_name_is_released(
    rig: Rig,
) -> None:
    await rig.checkpointed("gpu")
    rig.kube.claims[RESOURCE_CLAIMS.item("gpu", "work")] = _claim(uid="uid-newer")
    rig.watcher.reconcile([])
    await rig.watcher.idle()
    assert rig.handler.calls == [("release", "uid-gpu")]


async def test_a_missing_claim_that_still_exists_is_kept_and_looked_at(rig: Rig) -> None:
    """The listing may be older than the claim: the claim as got decides."""
    await rig.checkpointed("gpu", "moved")
    rig.kube.claims[RESOURCE_CLAIMS.item("gpu", "work")] = _claim()
    rig.kube.claims[RESOURCE_CLAIMS.item("moved", "work")] = _claim("moved", node="node-b")
    rig.watcher.reconcile([])
    await rig.watcher.idle()
    assert rig.handler.calls == [("release", "uid-moved")], "kept; the moved one released"
    assert rig.uids() == {"uid-gpu"}


async def test_a_failed_lookup_of_a_missing_claim_releases_nothing(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.checkpointed("gpu")
    path = RESOURCE_CLAIMS.item("gpu", "work")
    rig.kube.claims[path] = Unavailable("GET", path, 503, "ServiceUnavailable", "try later")
    with caplog.at_level(logging.ERROR, logger=binding.__name__):
        rig.watcher.reconcile([])
        await rig.watcher.idle()
    assert rig.handler.calls == []
    assert rig.uids() == {"uid-gpu"}
    assert any(r.getMessage() == "binding work failed" for r in caplog.records)


async def test_a_new_claim_is_found_by_a_listing_that_has_it(rig: Rig) -> None:
    """A listed claim is never looked up one by one."""
    await rig.checkpointed("gpu")
    rig.watcher.reconcile([_claim(devices=[_entry(ENROLLED)])])
    await rig.watcher.idle()
    assert rig.kube.gets == []
    assert rig.handler.calls == []


async def test_a_claim_deleted_while_it_is_enrolled_is_released_afterwards(rig: Rig) -> None:
    claim = _claim()
    rig.handler.hold = True
    rig.listing()
    rig.window(("ADDED", claim))
    rig.window(("DELETED", claim))
    task = asyncio.get_running_loop().create_task(rig.watcher.run())
    await rig.kube.parked.wait()
    assert rig.handler.calls == [("enroll", "uid-gpu")]
    rig.handler.proceed.set()
    await rig.watcher.idle()
    assert rig.handler.calls == [("enroll", "uid-gpu"), ("release", "uid-gpu")]
    assert rig.uids() == set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "change", [_cleared(), _elsewhere()], ids=["allocation cleared", "allocated elsewhere"]
)
async def test_a_claim_changed_while_it_is_enrolled_is_looked_at_again(
    rig: Rig, change: JSON
) -> None:
    rig.handler.hold = True
    rig.listing(_claim())
    rig.window(("MODIFIED", change))
    task = asyncio.get_running_loop().create_task(rig.watcher.run())
    await rig.kube.parked.wait()
    rig.handler.proceed.set()
    await rig.watcher.idle()
    assert rig.handler.calls == [("enroll", "uid-gpu"), ("release", "uid-gpu")]
    assert rig.uids() == set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_failed_enrollment_is_logged_and_the_claim_looked_at_again(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.handler.fail_with = RuntimeError("the handler broke")
    with caplog.at_level(logging.ERROR, logger=binding.__name__):
        rig.watcher.reconcile([_claim()])
        await rig.watcher.idle()
    assert rig.handler.calls == [("enroll", "uid-gpu")]
    assert any(r.getMessage() == "binding work failed" for r in caplog.records)
    rig.handler.fail_with = None
    rig.watcher.reconcile([_claim()])
    await rig.watcher.idle()
    assert rig.handler.calls == [("enroll", "uid-gpu")] * 2
    assert rig.uids() == {"uid-gpu"}


async def test_windows_follow_on_from_the_version_each_returns(rig: Rig) -> None:
    rig.listing(version="10")
    rig.window(version="11")
    rig.window(("ADDED", _claim("a", node="node-b")), version="15")
    await rig.run_until_parked()
    assert rig.kube.window_versions == ["10", "11", "15"]
    assert rig.kube.list_calls == 1


async def test_a_gone_window_lists_again_and_watches_from_the_new_listing(rig: Rig) -> None:
    claim = _claim()
    rig.listing(version="10")
    rig.kube.windows.append(Gone("GET", RESOURCE_CLAIMS.collection(), 410, "Expired", "old"))
    rig.listing(claim, version="30")
    await rig.run_until_parked()
    assert rig.kube.list_calls == 2
    assert rig.kube.window_versions == ["10", "30"]
    assert rig.handler.calls == [("enroll", "uid-gpu")], "the new listing was reconciled"


class Delays:
    def __init__(self) -> None:
        self.failures: list[int] = []

    def __call__(self, failures: int, *, base: float, cap: float) -> float:
        assert (base, cap) == (binding.RETRY_BASE, binding.RETRY_CAP)
        self.failures.append(failures)
        return 0.0


async def test_failed_listings_are_retried_with_growing_backoff(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays = Delays()
    monkeypatch.setattr(binding, "backoff_delay", delays)
    unavailable = Unavailable("GET", RESOURCE_CLAIMS.collection(), 503, "Unavailable", "")
    rig.kube.listings += [unavailable, unavailable, OSError("connection refused")]
    rig.listing(_claim(), version="20")
    await rig.run_until_parked()
    assert rig.kube.list_calls == 4
    assert delays.failures == [1, 2, 3]
    assert rig.handler.calls == [("enroll", "uid-gpu")]
    assert rig.kube.window_versions == ["20"]


async def test_a_failing_window_backs_off_and_a_good_pass_resets_the_count(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays = Delays()
    monkeypatch.setattr(binding, "backoff_delay", delays)
    broken = Unavailable("GET", RESOURCE_CLAIMS.collection(), 500, "InternalError", "")
    rig.listing(version="1")
    rig.kube.windows.append(broken)
    rig.listing(version="2")
    rig.kube.windows.append(broken)
    await rig.run_until_parked()
    assert delays.failures == [1, 2], "a window failing is a failed pass like a listing"
    assert rig.kube.list_calls == 3


async def test_a_pass_that_ends_without_error_resets_the_failure_count(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays = Delays()
    monkeypatch.setattr(binding, "backoff_delay", delays)
    unavailable = Unavailable("GET", RESOURCE_CLAIMS.collection(), 503, "Unavailable", "")
    gone = Gone("GET", RESOURCE_CLAIMS.collection(), 410, "Expired", "")
    rig.kube.listings += [unavailable, unavailable]
    rig.listing(version="1")
    rig.kube.windows.append(gone)
    rig.kube.listings.append(unavailable)
    rig.listing(version="2")
    await rig.run_until_parked()
    assert delays.failures == [1, 2, 1]


async def test_claims_are_listed_again_after_the_resync_period(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    await store.load()
    kube = ScriptedKube()
    handler = RecordingHandler(store)
    watcher = BindingWatcher(kube, handler, store, driver=DRIVER, node_name=NODE, resync=0.0)
    kube.listings += [([], "1"), ([_claim()], "2"), ([], "3")]
    task = asyncio.get_running_loop().create_task(watcher.run())
    await kube.parked.wait()
    await watcher.idle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert kube.list_calls == 4
    assert kube.window_versions == [], "a zero resync period only lists"
    assert handler.calls == [("enroll", "uid-gpu")]


_NAMES = st.sampled_from(["a", "b", "c"])
_CONDITIONS = st.lists(st.sampled_from([ENROLLED, ENROLLMENT_FAILED, "example.com/X"]), max_size=2)


@st.composite
def _served_claims(draw: st.DrawFn) -> JSON:
    """Claims as an apiserver serves them (fields of the right types), in every state the
    watcher can meet: allocated to this node, another, a zone or none; reserved or not;
    any driver's devices and answers."""
    name = draw(_NAMES)
    node = draw(st.sampled_from([NODE, "node-b", None]))
    results = draw(
        st.lists(
            st.builds(
                lambda driver, conditions: _result(driver=driver, conditions=tuple(conditions)),
                st.sampled_from([DRIVER, OTHER_DRIVER]),
                _CONDITIONS,
            ),
            max_size=2,
        )
    )
    devices = draw(
        st.lists(
            st.builds(
                lambda kind, status, driver: _entry(kind, status, driver=driver),
                st.sampled_from([ENROLLED, ENROLLMENT_FAILED, CONDITION_READY_TYPE]),
                st.sampled_from(["True", "False", "Unknown"]),
                st.sampled_from([DRIVER, OTHER_DRIVER]),
            ),
            max_size=2,
        )
    )
    claim = _claim(
        name,
        uid=f"uid-{name}-{draw(st.integers(0, 1))}",
        node=node,
        reserved=draw(st.booleans()),
        results=results,
        devices=devices,
    )
    if node is not None and draw(st.booleans()):
        claim["status"]["allocation"]["nodeSelector"] = _zone_selector("zone-a")
    return claim


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    # A listing names each claim once (one UID, one object).
    claims=st.lists(_served_claims(), max_size=4, unique_by=lambda c: c["metadata"]["uid"]),
    checkpointed=st.lists(_NAMES, max_size=3, unique=True),
)
def test_a_listing_enrolls_only_waiting_claims_once_and_releases_only_checkpointed_ones(
    tmp_path: Path, claims: list[JSON], checkpointed: list[str]
) -> None:
    async def reconcile() -> RecordingHandler:
        store = CheckpointStore(tmp_path / "checkpoint")
        store.path.parent.mkdir(exist_ok=True)
        prepared = [_prepared(_Ref("work", n, f"uid-{n}-0")) for n in checkpointed]
        await store.save(Checkpoint(claims={p.uid: p for p in prepared}))
        handler = RecordingHandler(store)
        watcher = BindingWatcher(ScriptedKube(), handler, store, driver=DRIVER, node_name=NODE)
        watcher.reconcile(claims)
        await watcher.idle()
        return handler

    handler = asyncio.run(reconcile())
    waiting = {
        c["metadata"]["uid"]
        for c in claims
        if allocated_node(c) == NODE and waits_for_enrollment(c, DRIVER)
    }
    enrolled = [uid for kind, uid in handler.calls if kind == "enroll"]
    released = [uid for kind, uid in handler.calls if kind == "release"]
    assert set(enrolled) <= waiting
    assert len(enrolled) == len(set(enrolled)), "each claim enrolled once"
    assert set(released) <= {f"uid-{n}-0" for n in checkpointed}
    assert len(released) == len(set(released))
