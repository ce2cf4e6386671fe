"""The operator's one planner, whole: its steps joined into one plan held at once.

The publisher takes the plan step by step (`plan_outside_batches`, then `plan_steps`);
tests that want the whole plan of a pass join the same steps here, so there is no second
planner to keep in line with the first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thunder_dra.controllers.inventory.classes import DesiredDeviceClass
from thunder_dra.controllers.inventory.plan import (
    BATCH_DEVICES,
    Action,
    group_by_pool,
    plan_outside_batches,
    plan_steps,
)
from thunder_dra.controllers.inventory.slices import DesiredPool, is_inventory_slice


@dataclass(frozen=True, slots=True)
class PassPlan:
    """A whole pass's plan held at once."""

    actions: tuple[Action, ...]
    """Every action, in apply order."""
    class_actions: tuple[Action, ...]
    changed_pools: frozenset[str]
    """Pools that get writes or are deleted."""
    kept_pools: frozenset[str]
    """Listed pools no longer desired but kept as they are (zone unread, or held)."""

    def ordered(self) -> list[Action]:
        return list(self.actions)

    @property
    def empty(self) -> bool:
        return not self.actions


def plan_pass(
    pools: Sequence[DesiredPool],
    classes: Sequence[DesiredDeviceClass],
    existing_slices: Sequence[Mapping[str, Any]],
    existing_classes: Sequence[Mapping[str, Any]],
    *,
    inventory_available: bool = True,
    unavailable_zones: Collection[str] = (),
    keep_pools: Collection[str] = (),
    extended_resource_supported: bool = True,
    budget: int = BATCH_DEVICES,
) -> PassPlan:
    """The plan of one pass, all of it: `plan_outside_batches` and `plan_steps` joined."""
    by_pool = group_by_pool([obj for obj in existing_slices if is_inventory_slice(obj)])
    outside = plan_outside_batches(
        pools,
        classes,
        by_pool,
        existing_classes,
        inventory_available=inventory_available,
        unavailable_zones=unavailable_zones,
        extended_resource_supported=extended_resource_supported,
        keep_pools=keep_pools,
    )
    changed: set[str] = set(outside.retired_pools)
    steps = plan_steps(pools, outside, by_pool, budget, changed=changed)
    actions = tuple(action for _, step in steps for action in step)
    return PassPlan(actions, outside.class_actions, frozenset(changed), outside.kept_pools)
