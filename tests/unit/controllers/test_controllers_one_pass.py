"""The operator's reconcile cycle, one pass at a time, in memory.

Each test runs the operator's own ClusterLoop cycle (the daemon DaemonSet, the inventory
pass and the ThunderCluster's status) against the in-memory apiserver and the fake
Thunder (tests/support/operator_pass.py): what a cluster's user sees after a pass, the
slices, DeviceClasses, conditions and events, and the writes the pass cost.
"""

from __future__ import annotations

import pytest

from tests.support.operator_pass import OperatorWorld, operator_world
from thunder_dra.controllers.inventory.taints import TAINT_KEY

pytestmark = pytest.mark.unit

TWO_ZONES = {"us-east": {"A6000": 4}, "eu-west": {"H100": 2}}
CONFIRM_THREE = {"operator": {"inventoryProtection": {"confirmPasses": 3}}}


def taints(world: OperatorWorld) -> dict[str, str]:
    """Device -> the value of its thundercompute.com/unbacked NoSchedule taint."""
    found = {}
    for piece in world.slices():
        for device in piece["spec"]["devices"]:
            for taint in device.get("taints") or []:
                assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoSchedule")
                found[device["name"]] = taint["value"]
    return found


async def test_a_first_pass_publishes_the_pools_their_classes_and_the_conditions() -> None:
    async with operator_world(TWO_ZONES) as world:
        first = await world.run_pass()

        assert world.published() == {"us-east/a6000": 4, "eu-west/h100": 2}
        assert [c["metadata"]["name"] for c in world.device_classes()] == [
            "thunder-gpu-a6000",
            "thunder-gpu-h100",
        ]
        assert len(first.writes_to("resourceslices")) == 2
        assert len(first.writes_to("deviceclasses")) == 2
        conditions = world.conditions()
        assert conditions["InventorySynced"] == ("True", "Synced")
        assert conditions["ThunderReachable"] == ("True", "InventoryRead")
        assert conditions["InventorySuspect"] == ("False", "InventoryTrusted")
        assert conditions["SpecValid"] == ("True", "Valid")
        # The DaemonSet was just written: no daemon pod runs it yet, so not Ready.
        assert conditions["DaemonReady"][0] == "False"
        assert conditions["Ready"][0] == "False"
        status = world.cluster()["status"]
        assert (status["poolCount"], status["deviceCount"]) == (2, 6)
        assert ("Normal", "PoolsAdded") in world.events()
        assert ("Normal", "DeviceClassesAdded") in world.events()

        await world.roll_out_daemon(nodes=3)
        await world.run_pass()
        assert world.conditions()["DaemonReady"] == ("True", "AllPodsReady")
        assert world.conditions()["Ready"] == ("True", "Ready")


async def test_a_second_pass_with_nothing_changed_writes_nothing() -> None:
    async with operator_world(TWO_ZONES) as world:
        assert (await world.run_pass()).writes
        assert (await world.run_pass()).writes == []

        await world.roll_out_daemon(nodes=2)
        # Only the status says so: DaemonReady and Ready turn True.
        assert (await world.run_pass()).writes == [
            "PATCH /apis/thundercompute.com/v1alpha1/thunderclusters/thunder/status"
        ]
        assert (await world.run_pass()).writes == []


async def test_a_restarted_operator_writes_nothing_when_nothing_changed() -> None:
    async with operator_world(TWO_ZONES) as world:
        await world.run_pass()
        await world.roll_out_daemon(nodes=2)
        await world.run_pass()

        await world.restart()
        again = await world.run_pass()

        assert again.writes == []
        assert world.published() == {"us-east/a6000": 4, "eu-west/h100": 2}


async def test_a_zone_thunder_stops_listing_is_held_until_the_answer_repeats() -> None:
    async with operator_world(TWO_ZONES, CONFIRM_THREE) as world:
        await world.run_pass()
        world.remove_zone("eu-west")

        for n in range(2):
            held = await world.run_pass()
            assert world.published() == {"us-east/a6000": 4, "eu-west/h100": 2}
            # Held, not withdrawn: the first held pass taints the pool's devices, the
            # second finds them tainted and writes nothing.
            assert len(held.writes_to("resourceslices")) == (1 if n == 0 else 0)
            assert taints(world) == {
                "h100-0": "ZoneNotListed",
                "h100-1": "ZoneNotListed",
            }
            assert held.writes_to("deviceclasses") == []
            assert world.conditions()["InventorySuspect"] == ("True", "ShrinkHeld")
            assert world.events()[-1] == ("Warning", "InventorySuspect")

        # The third pass with the same answer: now it is believed.
        withdrawn = await world.run_pass()
        assert world.published() == {"us-east/a6000": 4}
        assert [c["metadata"]["name"] for c in world.device_classes()] == ["thunder-gpu-a6000"]
        assert len(withdrawn.writes_to("resourceslices")) == 1
        assert world.conditions()["InventorySuspect"] == ("False", "InventoryTrusted")
        assert ("Normal", "InventoryShrinkConfirmed") in world.events()


async def test_more_gpus_are_published_at_once_and_a_brief_drop_withdraws_nothing() -> None:
    async with operator_world(TWO_ZONES, CONFIRM_THREE) as world:
        await world.run_pass()

        world.set_gpus("us-east", "A6000", 6)
        grown = await world.run_pass()
        assert world.published() == {"us-east/a6000": 6, "eu-west/h100": 2}
        assert len(grown.writes_to("resourceslices")) == 1
        assert ("Normal", "PoolsResized") in world.events()

        world.set_gpus("us-east", "A6000", 1)
        dropped = await world.run_pass()
        assert world.published()["us-east/a6000"] == 6
        assert len(dropped.writes_to("resourceslices")) == 1
        assert taints(world) == {f"a6000-{i}": "HostsOffline" for i in range(1, 6)}, (
            "the devices beyond what Thunder backs are tainted, not withdrawn"
        )
        world.set_gpus("us-east", "A6000", 6)
        back = await world.run_pass()
        assert len(back.writes_to("resourceslices")) == 1, "the taints go"
        assert taints(world) == {}
        assert world.published() == {"us-east/a6000": 6, "eu-west/h100": 2}
        assert world.conditions()["InventorySuspect"] == ("False", "InventoryTrusted")


async def test_held_pools_and_clamped_figures_show_in_the_operators_metrics() -> None:
    limits = {"operator": {**CONFIRM_THREE["operator"], "limits": {"maxDevicesPerPool": 3}}}
    async with operator_world(TWO_ZONES, limits) as world:
        registry = world.operator.services.metrics.registry

        def gauges() -> tuple[float | None, ...]:
            return tuple(
                registry.get_sample_value(f"thunder_dra_operator_{name}")
                for name in ("inventory_pools_held", "inventory_clamped")
            )

        await world.run_pass()
        assert world.published() == {"us-east/a6000": 3, "eu-west/h100": 2}
        assert gauges() == (0, 1)

        world.remove_zone("eu-west")
        await world.run_pass()
        assert gauges() == (1, 1)
        await world.run_pass()
        await world.run_pass()  # the third pass with the same answer is believed
        assert world.published() == {"us-east/a6000": 3}
        assert gauges() == (0, 1)

        world.set_gpus("us-east", "A6000", 3)  # now within the limit
        await world.run_pass()
        assert world.published() == {"us-east/a6000": 3}
        assert gauges() == (0, 0)
