"""The write plan: exactly the writes needed, none when nothing changed."""

from __future__ import annotations

import copy
import itertools
import json
import marshal
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.plans import PassPlan, plan_pass
from thunder_dra.controllers.inventory.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.plan import (
    Action,
    Create,
    Delete,
    Replace,
    Update,
    prune,
    same_when_pruned,
)
from thunder_dra.controllers.inventory.slices import (
    InventoryConfig,
    build_pools,
    published_devices,
)
from thunder_dra.controllers.shared.ownership import ThunderClusterRef

OWNER = ThunderClusterRef("thunder", "uid-1")
CONFIG = InventoryConfig(owner=OWNER)


class FakeApiServer:
    """Stores what the plan writes the way the API server would hand it back."""

    def __init__(
        self, *, drops_extended_resource: bool = False, drops_taints: bool = False
    ) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.drops_extended_resource = drops_extended_resource
        self.drops_taints = drops_taints
        """As an API server with DRADeviceTaints off (1.34, 1.35)."""
        self.writes: list[Action] = []
        self._versions = itertools.count(100)
        self._clock = itertools.count(1)

    def list(self, kind: str) -> list[dict[str, Any]]:
        """Fresh copies, as a server hands them out. The stored objects are plain JSON
        (`_store` makes them so), which marshal copies exactly, in a fifth of a JSON round
        trip's time and a tenth of deepcopy's (copies were most of the property test's)."""
        return [
            marshal.loads(marshal.dumps(o))
            for (k, _), o in sorted(self.objects.items())
            if k == kind
        ]

    def _store(self, kind: str, body: dict[str, Any], uid: str) -> None:
        obj = json.loads(json.dumps(body))
        meta = obj["metadata"]
        meta.update(
            uid=uid,
            resourceVersion=str(next(self._versions)),
            creationTimestamp="2026-01-01T00:00:00Z",
            generation=meta.get("generation", 0) + 1,
            managedFields=[{"manager": "thunder-operator", "operation": "Update"}],
        )
        spec = obj["spec"]
        # Empty values and fields of newer API versions, as a server may return them.
        spec["futureField"] = {"defaulted": True}
        if kind == "ResourceSlice":
            spec["allNodes"] = False
            for term in spec["nodeSelector"]["nodeSelectorTerms"]:
                term["matchFields"] = []
            for device in spec["devices"]:
                device["capacity"] = {}
                if self.drops_taints:
                    device.pop("taints", None)
                for taint in device.get("taints") or []:
                    # The API server stamps a taint that comes without a time.
                    taint.setdefault("timeAdded", self._now())
        else:
            spec["config"] = []
            if self.drops_extended_resource:
                spec.pop("extendedResourceName", None)
        self.objects[(kind, meta["name"])] = obj

    def _now(self) -> str:
        """A new second per call, so a restamped taint shows."""
        seconds = next(self._clock)
        return f"2026-01-01T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"

    def apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            self.writes.append(action)
            key = (action.kind, action.name)
            if isinstance(action, Create):
                assert key not in self.objects, f"create of existing {key}"
                self._store(action.kind, action.body, uid=f"uid-{action.name}")
            elif isinstance(action, Update):
                old = self.objects[key]
                meta = action.body["metadata"]
                assert meta["resourceVersion"] == old["metadata"]["resourceVersion"]
                assert meta["uid"] == old["metadata"]["uid"]
                self._store(action.kind, action.body, uid=meta["uid"])
            elif isinstance(action, Replace | Delete):
                assert self.objects[key]["metadata"]["resourceVersion"] == action.resource_version
                del self.objects[key]
                if isinstance(action, Replace):
                    self._store(action.kind, action.body, uid=f"uid2-{action.name}")


def capacity(zone: str, model: str, published: int, target: str = "1") -> PoolCapacity:
    return PoolCapacity(
        zone_name=zone,
        model=model,
        physical=published,
        target=Decimal(target),
        target_source=TargetSource.UNSET,
        live_client_gpus=0,
        published=published,
        zone_ids=(zone,),
    )


def plan(
    server: FakeApiServer,
    capacities: Iterable[PoolCapacity],
    config: InventoryConfig = CONFIG,
    **options: Any,
) -> PassPlan:
    existing_slices = server.list("ResourceSlice")
    pools = build_pools(
        capacities, config, current_devices=published_devices(existing_slices)
    ).pools
    classes = build_device_classes(pools, config)
    return plan_pass(pools, classes, existing_slices, server.list("DeviceClass"), **options)


def sync(
    server: FakeApiServer,
    capacities: Sequence[PoolCapacity],
    config: InventoryConfig = CONFIG,
    **options: Any,
) -> PassPlan:
    result = plan(server, capacities, config, **options)
    server.apply(result.ordered())
    return result


def generations(server: FakeApiServer) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for obj in server.list("ResourceSlice"):
        pool = obj["spec"]["pool"]
        found.setdefault(pool["name"], set()).add(pool["generation"])
    return found


BASE = [capacity("us-east", "A6000", 6), capacity("us-east", "H100", 300), capacity("eu", "L4", 2)]


def test_first_pass_creates_and_the_next_writes_nothing() -> None:
    server = FakeApiServer()
    first = sync(server, BASE)
    assert all(isinstance(a, Create) for a in first.ordered())
    assert len(server.list("ResourceSlice")) == 1 + 5 + 1, "300 devices: 64 per slice"
    assert len(server.list("DeviceClass")) == 3
    assert plan(server, BASE).empty
    assert generations(server) == {"eu/l4": {1}, "us-east/a6000": {1}, "us-east/h100": {1}}


def test_classes_come_first_and_deletes_last() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    result = plan(server, [capacity("us-east", "A6000", 6), capacity("us-east", "B200", 1)])
    kinds = [(type(a).__name__, a.kind) for a in result.ordered()]
    assert kinds[0] == ("Create", "DeviceClass")
    assert kinds[1] == ("Create", "ResourceSlice")
    assert set(kinds[2:]) == {("Delete", "ResourceSlice"), ("Delete", "DeviceClass")}
    assert kinds[-2:] == [("Delete", "DeviceClass")] * 2


def test_growing_one_pool_bumps_only_its_generation_once() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    before = {o["metadata"]["name"]: o for o in server.list("ResourceSlice")}
    grown = [capacity("us-east", "A6000", 6), capacity("us-east", "H100", 400), BASE[2]]
    result = sync(server, grown)
    assert result.changed_pools == {"us-east/h100"}
    assert generations(server)["us-east/h100"] == {2}
    assert generations(server)["us-east/a6000"] == {1}
    after = {o["metadata"]["name"]: o for o in server.list("ResourceSlice")}
    for name in ("thunder.us-east.a6000.0", "thunder.eu.l4.0"):
        assert after[name] == before[name]
    h100 = [
        d["name"] for n, o in sorted(after.items()) if "h100" in n for d in o["spec"]["devices"]
    ]
    assert sorted(h100) == sorted(f"h100-{i}" for i in range(400))
    assert {o["spec"]["pool"]["resourceSliceCount"] for n, o in after.items() if "h100" in n} == {7}
    assert plan(server, grown).empty


def test_shrinking_deletes_surplus_slices_of_the_pool() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    result = sync(server, [BASE[0], capacity("us-east", "H100", 60), BASE[2]])
    deletes = [a.name for a in result.ordered() if isinstance(a, Delete)]
    assert deletes == [f"thunder.us-east.h100.{k}" for k in range(1, 5)]
    [h100] = [o for o in server.list("ResourceSlice") if "h100" in o["metadata"]["name"]]
    assert h100["spec"]["pool"] == {
        "name": "us-east/h100",
        "generation": 2,
        "resourceSliceCount": 1,
    }


def test_a_model_leaving_inventory_takes_its_pool_and_class() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    sync(server, BASE[:2])
    assert "eu/l4" not in generations(server)
    assert [o["metadata"]["name"] for o in server.list("DeviceClass")] == [
        "thunder-gpu-a6000",
        "thunder-gpu-h100",
    ]


def test_unavailable_inventory_deletes_nothing() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    assert plan(server, [], inventory_available=False).empty


def test_unreadable_zones_keep_their_pools_and_classes() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    result = plan(server, BASE[:2], unavailable_zones={"eu"})
    assert result.empty
    assert result.kept_pools == {"eu/l4"}


def test_what_others_add_is_kept_and_causes_no_write() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    key = ("ResourceSlice", "thunder.eu.l4.0")
    meta = server.objects[key]["metadata"]
    meta["labels"]["team"] = "ml"
    meta["annotations"]["note"] = "hello"
    meta["finalizers"] = ["example.com/hold"]
    meta["ownerReferences"].append({"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u2"})
    assert plan(server, BASE).empty
    result = sync(server, [*BASE[:2], capacity("eu", "L4", 2, target="2")])
    [update] = result.ordered()
    assert isinstance(update, Update)
    stored = server.objects[key]["metadata"]
    assert stored["labels"]["team"] == "ml"
    assert stored["labels"]["thundercompute.com/oversubscription"] == "2"
    assert stored["annotations"]["note"] == "hello"
    assert stored["finalizers"] == ["example.com/hold"]
    assert {r["uid"] for r in stored["ownerReferences"]} == {"uid-1", "u2"}


def test_manual_edits_to_owned_fields_are_reverted() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    server.objects[("ResourceSlice", "thunder.eu.l4.0")]["spec"]["devices"].pop()
    server.objects[("DeviceClass", "thunder-gpu-l4")]["spec"]["selectors"] = []
    result = sync(server, BASE)
    assert {a.name for a in result.ordered()} == {"thunder.eu.l4.0", "thunder-gpu-l4"}
    assert generations(server)["eu/l4"] == {2}
    assert plan(server, BASE).empty


def test_a_changed_driver_replaces_slices() -> None:
    server = FakeApiServer()
    sync(server, BASE[2:])
    other = InventoryConfig(driver_name="gpu.example.com", owner=OWNER)
    result = plan(server, BASE[2:], config=other)
    kinds = {type(a) for a in result.ordered() if a.kind == "ResourceSlice"}
    assert kinds == {Replace}
    server.apply(result.ordered())
    assert plan(server, BASE[2:], config=other).empty


def test_a_dropped_extended_resource_name_does_not_churn() -> None:
    server = FakeApiServer(drops_extended_resource=True)
    sync(server, BASE, extended_resource_supported=False)
    assert plan(server, BASE, extended_resource_supported=False).empty
    # Told the field works after all, the operator writes it once more.
    assert {type(a) for a in plan(server, BASE).class_actions} == {Update}


def test_foreign_objects_are_left_alone() -> None:
    server = FakeApiServer()
    foreign = {
        "metadata": {"name": "other-driver-slice", "labels": {}, "resourceVersion": "1"},
        "spec": {"driver": "gpu.example.com", "pool": {"name": "us-east/a6000"}},
    }
    result = plan_pass([], [], [foreign], [foreign])
    assert result.empty
    assert server.list("ResourceSlice") == []


def test_awkward_names_are_published_once_then_left_alone() -> None:
    awkward = [
        capacity("US.East_1", "NVIDIA RTX 6000 Ada", 3),
        capacity("us-east-1", "nvidia-rtx-6000-ada", 2),
        capacity("Zone_" + "z" * 58, "A" * 90, 129, target="1.25"),
    ]
    server = FakeApiServer()
    sync(server, awkward)
    assert len(generations(server)) == 3
    assert plan(server, awkward).empty


zones = st.sampled_from(["us-east", "US-East", "eu.west", "ap"])
models = st.sampled_from(["A6000", "a6000", "H100", "NVIDIA L4", "B200"])
inventories = st.lists(
    st.tuples(zones, models, st.integers(min_value=0, max_value=300)), max_size=6
).map(
    lambda rows: list(
        {
            (zone, model.casefold()): capacity(zone, model, count) for zone, model, count in rows
        }.values()
    )
)


@settings(max_examples=40, deadline=None)
@given(st.lists(inventories, min_size=1, max_size=4))
def test_every_pass_converges_and_generations_move_once_per_change(
    passes: list[list[PoolCapacity]],
) -> None:
    server = FakeApiServer()
    for capacities in passes:
        before = generations(server)
        result = sync(server, capacities)
        after = generations(server)
        assert plan(server, capacities).empty
        for pool, gens in after.items():
            assert len(gens) == 1
            if pool in result.changed_pools:
                assert gens == {max(before.get(pool, {0})) + 1}
            else:
                assert gens == before[pool]
        stored = server.list("ResourceSlice")
        devices: dict[str, list[str]] = {}
        for obj in stored:
            pool = obj["spec"]["pool"]
            assert pool["resourceSliceCount"] == sum(
                o["spec"]["pool"]["name"] == pool["name"] for o in stored
            )
            assert 0 < len(obj["spec"]["devices"]) <= 128
            devices.setdefault(pool["name"], []).extend(d["name"] for d in obj["spec"]["devices"])
        assert all(len(names) == len(set(names)) for names in devices.values())
        assert sorted(len(names) for names in devices.values()) == sorted(
            cap.published for cap in capacities if cap.published > 0
        )


@pytest.mark.parametrize("available", [True, False])
def test_plans_do_not_mutate_their_inputs(available: bool) -> None:
    server = FakeApiServer()
    sync(server, BASE)
    existing = server.list("ResourceSlice")
    snapshot = copy.deepcopy(existing)
    plan_pass([], [], existing, [], inventory_available=available)
    assert existing == snapshot


def test_a_recreated_thundercluster_takes_over_as_controller() -> None:
    server = FakeApiServer()
    sync(server, BASE[2:])
    successor = ThunderClusterRef("thunder", "uid-2")
    result = sync(server, BASE[2:], config=InventoryConfig(owner=successor))
    assert {type(a) for a in result.ordered()} == {Update}
    for obj in [*server.list("ResourceSlice"), *server.list("DeviceClass")]:
        refs = obj["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs if r.get("controller")] == ["uid-2"]


empties: st.SearchStrategy[Any] = st.sampled_from([None, False, "", [], {}])
# Numbers other than 0 and 1: Python has False == 0 and True == 1, and same_when_pruned
# compares as Python does; in the bodies it compares a field is a boolean on both sides or
# a number on both sides (the API's schema), never one of each.
json_values = st.recursive(
    st.one_of(
        empties,
        st.sampled_from([-2, -1, 2, 3]),
        st.sampled_from(["a", "b"]),
        st.just(True),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["x", "y", "z"]), inner, max_size=3),
    ),
    max_leaves=12,
)


@st.composite
def with_empties_added(draw: st.DrawFn, value: Any) -> Any:
    """`value` with empty entries added to some of its mappings: the same when pruned."""
    if isinstance(value, dict):
        out = {key: draw(with_empties_added(item)) for key, item in value.items()}
        for key in draw(st.lists(st.sampled_from(["x", "y", "z", "w"]), max_size=2)):
            out.setdefault(key, draw(empties))
        return out
    if isinstance(value, list | tuple):
        return [draw(with_empties_added(item)) for item in value]
    return value


@settings(max_examples=150, deadline=None)
@given(json_values, json_values)
def test_same_when_pruned_agrees_with_pruning_both(a: Any, b: Any) -> None:
    assert same_when_pruned(a, b) == (prune(a) == prune(b))


@settings(max_examples=100, deadline=None)
@given(st.data(), json_values)
def test_defaulted_empty_fields_compare_the_same(data: st.DataObject, value: Any) -> None:
    returned = data.draw(with_empties_added(value))
    assert same_when_pruned(value, returned)
    assert same_when_pruned(returned, value)
    assert prune(value) == prune(returned)


def test_zero_is_a_value_and_false_is_empty() -> None:
    # The property tests draw no 0 or 1 (they would equal False and True); these do.
    assert not same_when_pruned({"x": 0}, {})
    assert not same_when_pruned({}, {"x": 0})
    assert same_when_pruned({"x": False, "y": 0}, {"y": 0})
    assert not same_when_pruned({"x": 1}, {"x": 2})
    assert prune({"x": 0, "y": False}) == {"x": 0}
