"""Hostile Thunder inventories through capacity, limits, the shrink guard and slice building.

Generated answers (unicode, long and duplicate names, zero, negative, huge and NaN
numbers, zones and hosts coming and going) are run pass after pass against a fake API
server, checking what must hold whatever Thunder says:

- the limits hold (only devices claims hold may go past them);
- devices allocated to a claim stay published, with their pool and DeviceClass;
- every published name is valid (DNS labels, pool and slice names within limits);
- the same answer again plans no write, with taints as without (their stored
  `timeAdded` carried back);
- devices Thunder does not back are tainted (one `thundercompute.com/unbacked`
  NoSchedule taint with a valid label value, in slices of at most 64 devices), every
  device of an unreadable zone among them, and taints coming and going change no
  slice's devices;
- a shrink is applied only after the same answer came `confirm_passes` passes.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.plans import plan_pass
from tests.unit.controllers.test_controllers_diff import FakeApiServer
from thunder_dra.api import syntax
from thunder_dra.api.thundercluster import InventoryProtectionSpec
from thunder_dra.controllers.inventory.capacity import (
    ClientInventory,
    HostInventory,
    OversubscriptionTargets,
    PoolCapacity,
    TargetSource,
    ZoneInventory,
    compute_capacity,
)
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.guard import GuardDecision, PublishedPool, judge
from thunder_dra.controllers.inventory.layout import plan_layout
from thunder_dra.controllers.inventory.slices import (
    InventoryConfig,
    build_pools,
    published_devices,
    stable_device_names,
)
from thunder_dra.controllers.inventory.taints import (
    MAX_DEVICES_PER_TAINTED_SLICE,
    MAX_TAINTS_PER_DEVICE,
    TAINT_KEY,
    TaintReason,
)
from thunder_dra.controllers.inventory.thunder import ThunderInventory, ZoneFailure
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.kube import naming
from thunder_dra.thunder.models import ClientRecord, Host
from thunder_dra.thunder.targets import OversubscriptionTargets as WireTargets

OWNER = ThunderClusterRef("thunder", "uid-1")
CONFIG = InventoryConfig(
    owner=OWNER, max_gpus_per_host=8, max_devices_per_pool=12, max_pools=6, max_devices=50
)
PROTECTION = InventoryProtectionSpec(max_shrink_percent=50, confirm_passes=3)

# Few enough names that duplicates (and case-only differences) come up often.
ZONE_NAMES = st.sampled_from(
    ["us-east", "US-East", "eu", "zoné-ü", "a" * 63, "b" * 64, "", "has space", "東京", "x.y"]
)
MODELS = st.sampled_from(["A6000", "a6000", "H100", "H" * 80, "RTX 4090", "ü-gpu", "L4"])
COUNTS = st.one_of(
    st.integers(min_value=-5, max_value=20),
    st.sampled_from([0, 64, 65, 5_000_000, 10**30]),
)
TARGETS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, 1e300, 1.5, 2, "lots", "3"]),
    st.floats(allow_nan=True, allow_infinity=True),
)


# Built once: a strategy made inside `zones` would be built, validated and labelled again
# by hypothesis in every draw, which took most of the property tests' time.
HOSTS = st.lists(
    st.builds(
        HostInventory,
        gpu_type=MODELS,
        gpu_count=COUNTS,
        status=st.sampled_from(["", "active", "offline"]),
        cordoned=st.booleans(),
    ),
    max_size=4,
)
CLIENTS = st.lists(
    st.builds(
        ClientInventory,
        gpu_type=st.one_of(st.none(), MODELS),
        gpu_count=st.one_of(st.none(), COUNTS),
        decommissioned=st.booleans(),
    ),
    max_size=3,
)
PER_MODEL_TARGETS = st.dictionaries(MODELS, TARGETS, max_size=2)
READ_FAILED = st.sampled_from([False, False, False, True])
ZONE_COUNT = st.integers(min_value=0, max_value=5)


@st.composite
def zones(draw: st.DrawFn) -> list[ZoneInventory]:
    result = []
    for index in range(draw(ZONE_COUNT)):
        hosts = draw(HOSTS)
        clients = draw(CLIENTS)
        targets = OversubscriptionTargets(
            per_model=draw(PER_MODEL_TARGETS),
            default=draw(TARGETS),
            read_failed=draw(READ_FAILED),
        )
        result.append(
            ZoneInventory(f"zone-{index}", draw(ZONE_NAMES), tuple(hosts), tuple(clients), targets)
        )
    return result


def read_of(answer: Sequence[ZoneInventory], unreadable: Collection[str] = ()) -> ThunderInventory:
    """Thunder's answer as read; zones named in `unreadable` failed their host read."""
    return ThunderInventory(
        zones=[z for z in answer if z.zone_name not in unreadable],
        unavailable=[
            ZoneFailure(z.zone_id, z.zone_name, "503") for z in answer if z.zone_name in unreadable
        ],
        listed_zone_names=frozenset(z.zone_name for z in answer),
    )


TaintMap = dict[tuple[str, str], tuple[str, str]]
"""(pool, device) -> (taint value, timeAdded)."""


def taint_map(slices: Sequence[Mapping[str, Any]]) -> TaintMap:
    found: TaintMap = {}
    for obj in slices:
        for device in obj["spec"]["devices"]:
            for taint in device.get("taints") or []:
                key = (obj["spec"]["pool"]["name"], device["name"])
                found[key] = (taint["value"], taint["timeAdded"])
    return found


def membership(slices: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Slice name -> its device names: the layout taints must leave alone."""
    return {o["metadata"]["name"]: [d["name"] for d in o["spec"]["devices"]] for o in slices}


class Cluster:
    """The fake API server and the operator's per-process memory, across passes."""

    def __init__(self) -> None:
        self.server = FakeApiServer()
        self.streaks: dict[str, tuple[int, int]] = {}
        self.last: list[tuple[str, str, str]] = []
        self.history: list[Any] = []

    def published(self) -> dict[str, frozenset[str]]:
        return published_devices(self.server.list("ResourceSlice"))

    def run(
        self,
        answer: Sequence[ZoneInventory],
        allocated: Mapping[str, frozenset[str]],
        unreadable: Collection[str] = (),
    ) -> int:
        """One pass; the number of writes it made."""
        slices = self.server.list("ResourceSlice")
        read = read_of(answer, unreadable)
        planned = plan_layout(read, CONFIG, slices, allocated, PROTECTION, self.streaks)
        self.streaks = planned.decision.streaks
        pools = planned.layout.pools
        classes = build_device_classes(pools, CONFIG)
        plan = plan_pass(
            pools,
            classes,
            slices,
            self.server.list("DeviceClass"),
            keep_pools=planned.decision.held_names,
            unavailable_zones=read.unavailable_zone_names,
        )
        actions = plan.ordered()
        self.last = [(type(a).__name__, a.kind, a.name) for a in actions]
        held = sorted(planned.decision.held_names)
        self.history.append((self.last, held, sorted(p.name for p in pools)))
        self.server.apply(actions)
        after = self.server.list("ResourceSlice")
        # A taint that stays the same keeps the time the API server gave it.
        before_taints, after_taints = taint_map(slices), taint_map(after)
        for key, (value, added) in after_taints.items():
            if key in before_taints and before_taints[key][0] == value:
                assert before_taints[key][1] == added, f"timeAdded of {key} restamped"
        # Every device of a pool of an unreadable zone is tainted ZoneUnreadable.
        for obj in after:
            if obj["metadata"]["labels"][naming.LABEL_ZONE] in read.unavailable_zone_names:
                for device in obj["spec"]["devices"]:
                    assert [(t["key"], t["value"]) for t in device.get("taints") or []] == [
                        (TAINT_KEY, "ZoneUnreadable")
                    ], device
        return len(actions)


def check_published(cluster: Cluster, allocated: Mapping[str, frozenset[str]]) -> None:
    slices = cluster.server.list("ResourceSlice")
    published = published_devices(slices)
    held = sum(len(devices) for devices in allocated.values())
    pools_with_claims = sum(1 for devices in allocated.values() if devices)
    assert len(published) <= CONFIG.max_pools + pools_with_claims  # type: ignore[operator]
    assert sum(len(d) for d in published.values()) <= CONFIG.max_devices + held  # type: ignore[operator]
    for pool, pinned in allocated.items():
        assert pinned <= published.get(pool, frozenset()), f"allocated devices of {pool} withdrawn"
    for pool, devices in published.items():
        pinned = allocated.get(pool, frozenset())
        assert len(devices - pinned) <= CONFIG.max_devices_per_pool  # type: ignore[operator]
        assert pinned <= devices, f"allocated devices of {pool} withdrawn"
        zone_label, _, type_label = pool.partition("/")
        assert syntax.is_dns_label(zone_label), pool
        assert syntax.is_dns_label(type_label), pool
        for device in devices:
            assert syntax.is_dns_label(device), device
    for obj in slices:
        assert syntax.is_dns_subdomain(obj["metadata"]["name"])
        assert len(obj["spec"]["devices"]) <= CONFIG.max_devices_per_slice
        tainted = False
        for device in obj["spec"]["devices"]:
            taints = device.get("taints") or []
            assert len(taints) <= MAX_TAINTS_PER_DEVICE
            for taint in taints:
                tainted = True
                assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoSchedule")
                assert syntax.is_qualified_name(taint["key"])
                assert syntax.is_label_value(taint["value"]), taint
                assert taint["value"] in set(TaintReason), taint
        if tainted:
            assert len(obj["spec"]["devices"]) <= MAX_DEVICES_PER_TAINTED_SLICE
        for key, value in obj["metadata"]["labels"].items():
            assert syntax.is_qualified_name(key)
            assert syntax.is_label_value(value), (key, value)
    labels = {
        obj["metadata"]["labels"][naming.LABEL_GPU_TYPE]
        for obj in slices
        if published_devices([obj]).keys() & allocated.keys()
    }
    classes = {
        c["metadata"]["labels"][naming.LABEL_GPU_TYPE] for c in cluster.server.list("DeviceClass")
    }
    assert labels <= classes, "a pool with allocated devices keeps its DeviceClass"


def claims_on(
    published: Mapping[str, frozenset[str]], pick: st.DataObject
) -> dict[str, frozenset[str]]:
    """Some published devices, allocated to claims."""
    allocated: dict[str, frozenset[str]] = {}
    for pool in sorted(published):
        devices = sorted(published[pool])
        chosen = pick.draw(st.lists(st.sampled_from(devices), max_size=3, unique=True))
        if chosen:
            allocated[pool] = frozenset(chosen)
    return allocated


def unreadable_of(answer: Sequence[ZoneInventory], pick: st.DataObject) -> frozenset[str]:
    """Some of the answer's zone names, whose hosts could not be read."""
    names = sorted({z.zone_name for z in answer})
    if not names:
        return frozenset()
    return frozenset(pick.draw(st.lists(st.sampled_from(names), max_size=2, unique=True)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=st.lists(zones(), min_size=1, max_size=5), pick=st.data())
def test_hostile_answers_pass_after_pass_keep_every_invariant(
    answers: list[list[ZoneInventory]], pick: st.DataObject
) -> None:
    cluster = Cluster()
    allocated: dict[str, frozenset[str]] = {}
    unreadable: frozenset[str] = frozenset()
    for answer in answers:
        unreadable = unreadable_of(answer, pick)
        cluster.run(answer, allocated, unreadable)
        check_published(cluster, allocated)
        # Claims come and go: some of what is published now gets allocated.
        allocated = claims_on(cluster.published(), pick)
        check_published(cluster, allocated)
    # The same answer, again and again: once the guard has decided, nothing is written,
    # with the taints it leaves (timeAdded carried back) as without.
    last = answers[-1]
    for _ in range(PROTECTION.confirm_passes):
        cluster.run(last, allocated, unreadable)
    writes = cluster.run(last, allocated, unreadable)
    assert writes == 0, f"a repeated answer plans no writes: {cluster.history}"
    check_published(cluster, allocated)


def offline(answer: Sequence[ZoneInventory], zone_names: Collection[str]) -> list[ZoneInventory]:
    """`answer` with every host of the named zones offline."""
    return [
        replace(z, hosts=tuple(replace(h, status="offline") for h in z.hosts))
        if z.zone_name in zone_names
        else z
        for z in answer
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=zones(), pick=st.data())
def test_taints_coming_and_going_change_no_slices_devices(
    answer: list[ZoneInventory], pick: st.DataObject
) -> None:
    cluster = Cluster()
    cluster.run(answer, {})
    allocated = claims_on(cluster.published(), pick)
    cluster.run(answer, allocated)
    layout = membership(cluster.server.list("ResourceSlice"))
    assert taint_map(cluster.server.list("ResourceSlice")) == {}

    unreadable = unreadable_of(answer, pick)
    cluster.run(answer, allocated, unreadable)
    assert membership(cluster.server.list("ResourceSlice")) == layout, "zone unreadable"
    assert cluster.run(answer, allocated, unreadable) == 0, "tainted and unchanged: no write"

    # Hosts offline: a suspect shrink is held on its first pass, tainted only (a shrink
    # the guard trusts, within maxShrinkPercent, is withdrawn at once as before).
    down = unreadable_of(answer, pick)
    published = cluster.published()
    cluster.run(offline(answer, down), allocated)
    held = set(cluster.history[-1][1])
    # A shrink the guard trusts (within maxShrinkPercent) is withdrawn at once: under
    # maxDevices another pool may grow into the room, and keeps it when Thunder is back
    # (a pool never loses devices to one served before it).
    trusted = [
        pool
        for pool, devices in published.items()
        if pool not in held and len(cluster.published().get(pool, ())) < len(devices)
    ]
    after = cluster.server.list("ResourceSlice")
    for name, devices in membership(after).items():
        pool = next(o["spec"]["pool"]["name"] for o in after if o["metadata"]["name"] == name)
        if pool in held:
            assert devices == layout[name], f"held pool {pool} keeps its slices' devices"
    for pool, device in taint_map(after):
        assert pool in held or device in allocated.get(pool, ()), (pool, device)
    check_published(cluster, allocated)

    if not held:
        return
    cluster.run(answer, allocated)
    if not trusted:
        assert membership(cluster.server.list("ResourceSlice")) == layout, "Thunder back"
    assert taint_map(cluster.server.list("ResourceSlice")) == {}, "the taints are gone"
    assert cluster.run(answer, allocated) == 0


@settings(max_examples=40, deadline=None)
@given(answer=zones())
def test_a_repeated_answer_writes_nothing_from_the_first_repeat(
    answer: list[ZoneInventory],
) -> None:
    cluster = Cluster()
    cluster.run(answer, {})
    assert cluster.run(answer, {}) == 0


@settings(max_examples=60, deadline=None)
@given(
    published=st.integers(min_value=1, max_value=500),
    answered=st.integers(min_value=0, max_value=500),
    confirm=st.integers(min_value=1, max_value=6),
    percent=st.integers(min_value=0, max_value=100),
)
def test_a_shrink_is_applied_exactly_on_the_confirming_pass(
    published: int, answered: int, confirm: int, percent: int
) -> None:
    pool = PublishedPool("z/a6000", "z", published)
    streaks: Mapping[str, tuple[int, int]] = {}
    lost = published - answered
    suspect = answered == 0 or (lost > 0 and lost * 100 > published * percent)
    for n in range(1, confirm + 1):
        decision = judge(
            [pool],
            {"z/a6000": answered} if answered else {},
            listed_zones={"z"},
            unreadable_zones=(),
            max_shrink_percent=percent,
            confirm_passes=confirm,
            streaks=streaks,
        )
        streaks = decision.streaks
        if not suspect:
            assert not decision.held
            assert not decision.confirmed
            return
        if n < confirm:
            assert [p.name for p in decision.held] == ["z/a6000"]
            assert decision.held[0].passes == n
        else:
            assert not decision.held
            assert [p.name for p in decision.confirmed] == ["z/a6000"]


def guard(
    pools: list[PublishedPool],
    answered: Mapping[str, int],
    listed: set[str],
    streaks: Mapping[str, tuple[int, int]],
) -> GuardDecision:
    return judge(
        pools,
        answered,
        listed_zones=listed,
        unreadable_zones=(),
        max_shrink_percent=50,
        confirm_passes=3,
        streaks=streaks,
    )


def test_an_empty_zone_list_is_held_and_a_changing_answer_counts_again() -> None:
    pools = [PublishedPool("z/a", "z", 4), PublishedPool("y/a", "y", 2)]
    first = guard(pools, {}, set(), {})
    assert first.held_names == {"z/a", "y/a"}
    assert "Thunder listed no zones" in first.held[0].reason
    # Zone y is back with one device of 2 (50%: not more), z still missing.
    second = guard(pools, {"y/a": 1}, {"y"}, first.streaks)
    assert second.held_names == {"z/a"}
    assert second.held[0].passes == 2
    assert "zone 'z' is no longer listed" in second.held[0].reason
    third = guard(pools, {"z/a": 1, "y/a": 1}, {"y", "z"}, second.streaks)
    assert third.held[0].passes == 1, "another answer for z/a: counting starts again"


def test_pools_of_unreadable_zones_are_not_judged() -> None:
    decision = judge(
        [PublishedPool("z/a", "z", 4)],
        {},
        listed_zones={"z"},
        unreadable_zones={"z"},
        max_shrink_percent=50,
        confirm_passes=3,
        streaks={},
    )
    assert not decision.held
    assert not decision.confirmed


def huge(published: int) -> PoolCapacity:
    return PoolCapacity(
        zone_name="z",
        model="H100",
        physical=published,
        target=Decimal(1),
        target_source=TargetSource.UNSET,
        live_client_gpus=0,
        published=published,
        zone_ids=("z",),
    )


def test_five_million_gpus_on_one_host_count_as_the_host_limit() -> None:
    zone = ZoneInventory("z", "z", (HostInventory("H100", 5_000_000),))
    (capacity,) = compute_capacity([zone], max_gpus_per_host=64)
    assert capacity.physical == 64
    assert capacity.clamped_hosts == 1
    (unbounded,) = compute_capacity([zone])
    assert unbounded.physical == 5_000_000, "without a limit the figure is Thunder's"


def test_a_pool_of_millions_is_clamped_before_any_device_is_named() -> None:
    config = InventoryConfig(max_devices_per_pool=4096, max_pools=4096, max_devices=131072)
    layout = build_pools([huge(10**30)], config)
    (pool,) = layout.pools
    assert len(pool.devices) == 4096
    assert layout.clamps == (
        "1 pools clamped to maxDevicesPerPool=4096: z/h100 " + str(10**30) + "->4096",
    )


def test_limits_serve_pools_with_claims_then_published_ones_then_by_name() -> None:
    capacities = [
        PoolCapacity("a", "L4", 5, Decimal(1), TargetSource.UNSET, 0, 5, ("a",)),
        PoolCapacity("b", "L4", 5, Decimal(1), TargetSource.UNSET, 0, 5, ("b",)),
        PoolCapacity("c", "L4", 5, Decimal(1), TargetSource.UNSET, 0, 5, ("c",)),
    ]
    config = InventoryConfig(max_pools=2, max_devices=7)
    layout = build_pools(
        capacities,
        config,
        current_devices={"b/l4": frozenset({"l4-0"})},
        allocated_devices={"c/l4": frozenset({"l4-4"})},
    )
    sizes = {pool.name: len(pool.devices) for pool in layout.pools}
    assert sizes == {"c/l4": 5, "b/l4": 2}, "c (claimed) first, then b (published); a is cut"
    assert any("maxPools=2: a/l4" in line for line in layout.clamps)
    assert any("maxDevices=7: b/l4 5->2" in line for line in layout.clamps)


def test_a_pool_keeps_its_devices_under_the_total_limit_when_an_earlier_pool_grows() -> None:
    # Found by the pass-after-pass property: b was published, a was not. The first pass
    # serves b first and gives a what is left; from the second on both are published and
    # served by name, so a took b's devices and every pass after a shrink rewrote both.
    capacities = [
        PoolCapacity("a", "L4", 8, Decimal(1), TargetSource.UNSET, 0, 8, ("a",)),
        PoolCapacity("b", "L4", 8, Decimal(1), TargetSource.UNSET, 0, 8, ("b",)),
    ]
    config = InventoryConfig(max_devices=10)
    current: dict[str, frozenset[str]] = {"b/l4": frozenset(f"l4-{i}" for i in range(8))}
    sizes = []
    for _ in range(3):
        layout = build_pools(capacities, config, current_devices=current)
        current = {pool.name: frozenset(pool.devices) for pool in layout.pools}
        sizes.append({name: len(devices) for name, devices in current.items()})
    assert sizes == [{"a/l4": 2, "b/l4": 8}] * 3
    assert layout.clamps == ("1 pools clamped to stay within maxDevices=10: a/l4 8->2",)


def test_allocated_devices_are_kept_whatever_the_count() -> None:
    names = stable_device_names("a6000", 0, ["a6000-0", "a6000-5"], ["a6000-5", "a6000-9"])
    assert names == ("a6000-5", "a6000-9")


def test_a_vanished_pool_with_claims_keeps_them_once_the_shrink_is_confirmed() -> None:
    cluster = Cluster()
    answer = [ZoneInventory("z1", "z", (HostInventory("A6000", 4),))]
    cluster.run(answer, {})
    allocated = {"z/a6000": frozenset({"a6000-2"})}
    for _ in range(PROTECTION.confirm_passes - 1):
        cluster.run([], allocated)
        assert len(cluster.published()["z/a6000"]) == 4, "held"
    cluster.run([], allocated)
    assert cluster.published() == {"z/a6000": frozenset({"a6000-2"})}
    assert [c["metadata"]["name"] for c in cluster.server.list("DeviceClass")] == [
        "thunder-gpu-a6000"
    ]
    assert cluster.run([], allocated) == 0, "and it stays that way without writes"


# -- what the Thunder models accept ----------------------------------------------------


HOSTILE_NUMBERS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, -(10**30), 10**30, 1e300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(value=HOSTILE_NUMBERS)
def test_a_host_gpu_count_is_a_non_negative_integer_or_a_clear_error(value: Any) -> None:
    try:
        host = Host.model_validate(
            {"hostId": "h", "zoneId": "z", "gpuType": "A6000", "gpuCount": value}
        )
    except ValidationError as exc:
        locations = [error["loc"] for error in exc.errors()]
        assert locations == [("gpuCount",)], "the error names the field"
        return
    assert isinstance(host.gpu_count, int)
    assert host.gpu_count >= 0


@settings(max_examples=150, deadline=None)
@given(value=HOSTILE_NUMBERS)
def test_a_client_gpu_count_is_an_integer_or_absent(value: Any) -> None:
    record = ClientRecord.model_validate({"clientId": "c", "zoneId": "z", "gpuCount": value})
    assert record.gpu_count is None or isinstance(record.gpu_count, int)
    # Negative and huge counts are read; capacity ignores the first and clamps the second.
    (capacity,) = compute_capacity(
        [
            ZoneInventory(
                "z",
                "z",
                (HostInventory("A6000", 1),),
                (ClientInventory("A6000", record.gpu_count),),
            )
        ],
        max_gpus_per_host=64,
    )
    assert 0 <= capacity.live_client_gpus <= 64


@settings(max_examples=150, deadline=None)
@given(value=HOSTILE_NUMBERS)
def test_targets_are_finite_and_positive_or_unset(value: Any) -> None:
    wire = WireTargets.model_validate(
        {
            "oversubscriptionTargets": [{"gpuType": "A6000", "oversubscriptionTarget": value}],
            "defaultOversubscriptionTarget": value,
        }
    )
    for target in (wire.default, *(item.target for item in wire.targets)):
        assert target is None or (math.isfinite(target) and target > 0)


@pytest.mark.parametrize("count", [5_000_000, 10**30])
def test_huge_host_counts_parse_and_are_bounded_downstream(count: int) -> None:
    host = Host.model_validate({"hostId": "h", "zoneId": "z", "gpuType": "A", "gpuCount": count})
    (capacity,) = compute_capacity(
        [ZoneInventory("z", "z", (HostInventory(host.gpu_type, host.gpu_count),))],
        max_gpus_per_host=64,
    )
    assert capacity.physical == 64


def test_the_pools_of_an_unreadable_zone_count_against_the_limits() -> None:
    # Found by the property test above: the pools kept as published for a zone that could
    # not be read were left out of maxPools and maxDevices, so a readable zone's new
    # models were published past both.
    def zone(zone_id: str, name: str, *models: str) -> ZoneInventory:
        hosts = tuple(HostInventory(model, 8) for model in models)
        return ZoneInventory(zone_id, name, hosts, (), OversubscriptionTargets(per_model={}))

    cluster = Cluster()
    first = [zone("z-1", "east", "A6000", "H100", "L4"), zone("z-2", "west", "A6000", "H100")]
    cluster.run(first, {})
    assert len(cluster.published()) == 5
    grown = [first[0], zone("z-2", "west", "A6000", "H100", "L4", "A100", "T4", "V100")]
    cluster.run(grown, {}, unreadable={"east"})
    published = cluster.published()
    assert {p for p in published if p.startswith("east/")} == {
        "east/a6000",
        "east/h100",
        "east/l4",
    }, "the unreadable zone's pools are kept"
    assert len(published) <= CONFIG.max_pools  # type: ignore[operator]
    assert sum(len(d) for d in published.values()) <= CONFIG.max_devices  # type: ignore[operator]
    check_published(cluster, {})


def test_a_pool_kept_for_its_claims_counts_against_the_limits_while_thunder_drops_it() -> None:
    # Found by the taints property test (as zone names with one DNS label, `US-East` and
    # `us-east`, though the labels never changed): a pool Thunder stopped reporting, kept
    # for the device a claim holds, was left out of maxPools, so a pool cut by the limit
    # was published in its place; once Thunder reported it again, another published pool
    # was withdrawn to make room.
    def zone(zone_id: str, name: str, *models: str, offline: str = "") -> ZoneInventory:
        hosts = tuple(
            HostInventory(model, 1, status="offline" if model == offline else "")
            for model in models
        )
        return ZoneInventory(zone_id, name, hosts, (), OversubscriptionTargets(per_model={}))

    models = ("A100", "A6000", "H100", "L4", "T4", "V100")
    answer = [zone("z-1", "east", *models), zone("z-2", "west", "A6000")]
    cluster = Cluster()
    cluster.run(answer, {})
    before = cluster.published()
    assert "west/a6000" not in before, "cut by maxPools=6"
    allocated = {"east/h100": frozenset({"h100-0"})}
    assert cluster.run(answer, allocated) == 0
    cluster.run([zone("z-1", "east", *models, offline="H100"), answer[1]], allocated)
    assert cluster.published() == before, "the claimed pool keeps its place under maxPools"
    cluster.run(answer, allocated)
    assert cluster.published() == before, "Thunder back: nothing published or withdrawn"
    assert cluster.run(answer, allocated) == 0
    check_published(cluster, allocated)
