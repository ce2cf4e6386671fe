"""The one planner's plan does not depend on how it is batched or on lean listings: any
batch budget, with listed slices full or lean (compressed), gives the same actions in the
same phase order as one batch over the full objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.plans import plan_pass
from tests.unit.controllers.test_controllers_diff import CONFIG, FakeApiServer, capacity, sync
from thunder_dra.controllers.inventory.capacity import PoolCapacity
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.plan import (
    Action,
    Delete,
    batches,
    group_by_pool,
    plan_outside_batches,
    plan_steps,
)
from thunder_dra.controllers.inventory.slices import build_pools, published_devices
from thunder_dra.controllers.shared.objects import LeanSliceSpec, lean_slice

WHOLE = 1_000_000
"""A budget no test inventory reaches: the whole plan in one batch."""


def _key(action: Action) -> tuple[str, str, str, str]:
    body = getattr(action, "body", None)
    return type(action).__name__, action.kind, action.name, repr(body)


def _phase(action: Action) -> str:
    kind = "class" if action.kind == "DeviceClass" else "slice"
    return f"{kind}-{'deletes' if isinstance(action, Delete) else 'writes'}"


def compare(
    server: FakeApiServer,
    capacities: Sequence[PoolCapacity],
    budget: int,
    *,
    lean: bool = False,
    **options: Any,
) -> None:
    full = server.list("ResourceSlice")
    existing = [lean_slice(obj) for obj in full] if lean else full
    classes_existing = server.list("DeviceClass")
    pools = build_pools(capacities, CONFIG, current_devices=published_devices(full)).pools
    classes = build_device_classes(pools, CONFIG)
    expected = plan_pass(pools, classes, full, classes_existing, budget=WHOLE, **options)

    by_pool = group_by_pool(existing)
    outside = plan_outside_batches(
        pools,
        classes,
        by_pool,
        classes_existing,
        inventory_available=options.get("inventory_available", True),
        unavailable_zones=options.get("unavailable_zones", ()),
        extended_resource_supported=options.get("extended_resource_supported", True),
    )
    steps = list(plan_steps(pools, outside, by_pool, budget))
    got = [action for _, actions in steps for action in actions]

    assert Counter(map(_key, got)) == Counter(map(_key, expected.ordered()))
    # Same phase order: class writes, slice writes, slice deletes, class deletes.
    order = ["class-writes", "slice-writes", "slice-deletes", "class-deletes"]
    phases = [order.index(_phase(a)) for a in got]
    assert phases == sorted(phases)
    assert [order.index(phase) for phase, _ in steps] == sorted(order.index(p) for p, _ in steps)
    joined = plan_pass(pools, classes, existing, classes_existing, budget=budget, **options)
    assert list(map(_key, joined.ordered())) == list(map(_key, got))


BASE = [capacity("us-east", "A6000", 6), capacity("us-east", "H100", 300), capacity("eu", "L4", 2)]


@pytest.mark.parametrize("budget", [1, 8, 300, 4096])
@pytest.mark.parametrize("lean", [False, True])
def test_the_plan_is_the_same_whatever_the_budget_and_listing(budget: int, lean: bool) -> None:
    server = FakeApiServer()
    compare(server, BASE, budget, lean=lean)
    sync(server, BASE)
    compare(server, BASE, budget, lean=lean)  # nothing to do
    changed = [
        capacity("us-east", "A6000", 9, target="1.5"),
        capacity("us-east", "H100", 100),
        capacity("ap", "B200", 129),
    ]
    compare(server, changed, budget, lean=lean)
    compare(server, [], budget, lean=lean, inventory_available=False)
    compare(server, changed, budget, lean=lean, unavailable_zones={"eu"})
    compare(server, changed, budget, lean=lean, extended_resource_supported=False)


def test_batches_hold_at_most_the_budget_unless_one_pool_is_bigger() -> None:
    pools = build_pools(
        [capacity("a", "A6000", 100), capacity("b", "A6000", 100), capacity("c", "H100", 500)],
        CONFIG,
    ).pools
    sizes = [[len(p.devices) for p in batch] for batch in batches(pools, 250)]
    assert sizes == [[100, 100], [500]]


def test_lean_slice_spec_reads_like_the_original() -> None:
    server = FakeApiServer()
    sync(server, BASE)
    for obj in server.list("ResourceSlice"):
        lean = lean_slice(obj)
        assert "managedFields" not in lean["metadata"]
        spec = lean["spec"]
        assert isinstance(spec, LeanSliceSpec)
        assert dict(spec) == obj["spec"]
        assert spec.stored_bytes < len(repr(obj["spec"]["devices"]))
    empty = LeanSliceSpec({"driver": "x"})
    assert "devices" not in empty
    assert dict(empty) == {"driver": "x"}


def test_matching_with_identical_specs_still_checks_the_owned_metadata() -> None:
    from thunder_dra.controllers.inventory.plan import SLICE_SPEC_KEYS, matches, owned_view

    (pool,) = build_pools([capacity("us-east", "A6000", 4)], CONFIG).pools
    desired = pool.manifest(pool.slices[0], 1)
    stored = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "9"}}
    assert matches(stored, desired, SLICE_SPEC_KEYS)
    relabelled = {
        **stored,
        "metadata": {**stored["metadata"], "labels": {**desired["metadata"]["labels"]}},
    }
    relabelled["metadata"]["labels"]["thundercompute.com/oversubscription"] = "2"
    full = owned_view(relabelled, desired, SLICE_SPEC_KEYS) == owned_view(
        desired, desired, SLICE_SPEC_KEYS
    )
    assert matches(relabelled, desired, SLICE_SPEC_KEYS) is full is False
