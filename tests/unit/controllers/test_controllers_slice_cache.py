"""The publisher's slice cache and pool memo against the in-memory apiserver.

After a publish, a pass lists only the slices' metadata and reads none of them again;
a slice changed, deleted or created by someone else is seen (re-read, absent, read) and
the pool repaired; a pool found unchanged is not compared again until its desired state
or one of its slices' resourceVersions changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.fakekube import FakeKube
from tests.unit.controllers.test_controllers_diff import CONFIG, capacity
from thunder_dra.controllers.inventory import plan
from thunder_dra.controllers.inventory.capacity import PoolCapacity
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.publish import Publisher, PublishOutcome
from thunder_dra.controllers.inventory.slices import build_pools, published_devices
from thunder_dra.controllers.shared.objects import (
    SliceCache,
    list_device_classes,
    list_inventory_slices,
)
from thunder_dra.kube.client import METADATA_ONLY, KubeClient
from thunder_dra.kube.resources import RESOURCE_SLICES

pytestmark = pytest.mark.unit

CAPACITIES = [capacity("zone-a", "A100", 200), capacity("zone-b", "H100", 8)]


async def _pass(
    kube: KubeClient, publisher: Publisher, capacities: Sequence[PoolCapacity] = CAPACITIES
) -> tuple[PublishOutcome, list[dict[str, Any]]]:
    """One planning and publishing round the way an inventory pass makes it."""
    slices = await publisher.cache.slices(kube)
    current = published_devices(slices)
    pools = build_pools(capacities, CONFIG, current_devices=current).pools
    classes = build_device_classes(pools, CONFIG)
    existing_classes = await list_device_classes(kube)
    outcome = await publisher.publish(pools, classes, slices, existing_classes, current)
    return outcome, slices


def _slice_requests(fake: FakeKube, since: int) -> list[tuple[str, str, str | None]]:
    return [
        (r.method, r.path, r.accept)
        for r in fake.requests[since:]
        if r.path.startswith(RESOURCE_SLICES.collection())
    ]


async def test_after_a_publish_a_pass_lists_metadata_only_and_writes_nothing() -> None:
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    first, _ = await _pass(kube, publisher)
    assert first.writes == 7  # two classes, four slices of zone-a (64 each), one of zone-b
    mark = len(fake.requests)

    again, slices = await _pass(kube, publisher)

    assert again.writes == 0
    assert _slice_requests(fake, mark) == [("GET", RESOURCE_SLICES.collection(), METADATA_ONLY)]
    # The slices planned against are those the API server holds, devices included.
    assert sorted(s["metadata"]["name"] for s in slices) == sorted(
        s["metadata"]["name"] for s in await list_inventory_slices(kube)
    )
    assert sum(len(s["spec"]["devices"]) for s in slices) == 208


async def test_a_slice_changed_by_someone_else_is_read_again_and_repaired() -> None:
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    await _pass(kube, publisher)
    listed = await list_inventory_slices(kube)
    victim = next(s for s in listed if s["spec"]["pool"]["name"].startswith("zone-b"))
    name = victim["metadata"]["name"]
    changed = await kube.get(RESOURCE_SLICES.item(name))
    changed["spec"]["devices"] = changed["spec"]["devices"][:3]
    await kube.replace(RESOURCE_SLICES.item(name), changed)
    mark = len(fake.requests)

    outcome, slices = await _pass(kube, publisher)

    seen = next(s for s in slices if s["metadata"]["name"] == name)
    assert len(seen["spec"]["devices"]) == 3
    assert ("GET", RESOURCE_SLICES.item(name), None) in _slice_requests(fake, mark)
    assert outcome.writes == 1
    repaired = await kube.get(RESOURCE_SLICES.item(name))
    assert len(repaired["spec"]["devices"]) == 8


async def test_a_slice_deleted_by_someone_else_is_created_again() -> None:
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    await _pass(kube, publisher)
    name = (await list_inventory_slices(kube))[0]["metadata"]["name"]
    await kube.delete(RESOURCE_SLICES.item(name))

    outcome, slices = await _pass(kube, publisher)

    assert name not in {s["metadata"]["name"] for s in slices}
    assert outcome.writes > 0
    assert await kube.get_optional(RESOURCE_SLICES.item(name)) is not None
    again, _ = await _pass(kube, publisher)
    assert again.writes == 0


async def test_a_slice_created_by_someone_else_is_read_and_removed() -> None:
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    await _pass(kube, publisher)
    stray = await kube.get(
        RESOURCE_SLICES.item((await list_inventory_slices(kube))[0]["metadata"]["name"])
    )
    stray["metadata"] = {
        "name": "stray-slice",
        "labels": stray["metadata"]["labels"],
    }
    stray["spec"]["pool"] = {"name": "zone-gone/a100", "generation": 1, "resourceSliceCount": 1}
    await kube.create(RESOURCE_SLICES.collection(), stray)

    outcome, slices = await _pass(kube, publisher)

    assert "stray-slice" in {s["metadata"]["name"] for s in slices}
    assert outcome.removed_pools == ["zone-gone/a100"]
    assert await kube.get_optional(RESOURCE_SLICES.item("stray-slice")) is None


async def test_an_empty_cache_or_many_changes_list_the_slices_whole() -> None:
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    await _pass(kube, publisher, [capacity(f"zone-{i}", "A100", 4) for i in range(70)])
    restarted = SliceCache()
    await restarted.slices(kube)
    assert restarted.full_lists == 1

    # A fresh cache fills from one whole list; more changed slices than the refetch
    # limit are listed whole rather than read one by one.
    for obj in await list_inventory_slices(kube):
        obj = await kube.get(RESOURCE_SLICES.item(obj["metadata"]["name"]))
        obj["metadata"].setdefault("annotations", {})["touched"] = "yes"
        await kube.replace(RESOURCE_SLICES.item(obj["metadata"]["name"]), obj)
    await restarted.slices(kube)
    assert restarted.full_lists == 2
    assert restarted.refetched == 0


async def test_an_unchanged_pool_is_not_compared_again_until_its_slices_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[str] = []
    real = plan._pool_actions

    def counting(pool: Any, existing: Any) -> Any:
        compared.append(pool.name)
        return real(pool, existing)

    monkeypatch.setattr(plan, "_pool_actions", counting)
    fake = FakeKube()
    kube = KubeClient(fake)
    publisher = Publisher(kube, 4)
    await _pass(kube, publisher)
    await _pass(kube, publisher)  # finds both pools unchanged
    compared.clear()

    outcome, _ = await _pass(kube, publisher)
    assert compared == []
    assert outcome.writes == 0

    # Another model count (desired state changed): compared, and written.
    outcome, _ = await _pass(kube, publisher, [CAPACITIES[0], capacity("zone-b", "H100", 9)])
    assert compared == ["zone-b/h100"]
    assert outcome.writes == 1

    # A slice changed behind the operator's back (its resourceVersion): compared again.
    compared.clear()
    await _pass(kube, publisher, [CAPACITIES[0], capacity("zone-b", "H100", 9)])
    compared.clear()
    name = next(
        s["metadata"]["name"]
        for s in await list_inventory_slices(kube)
        if s["spec"]["pool"]["name"] == "zone-a/a100"
    )
    obj = await kube.get(RESOURCE_SLICES.item(name))
    obj["metadata"].setdefault("labels", {})["someone"] = "else"
    await kube.replace(RESOURCE_SLICES.item(name), obj)
    outcome, _ = await _pass(kube, publisher, [CAPACITIES[0], capacity("zone-b", "H100", 9)])
    assert compared == ["zone-a/a100"]
    assert outcome.writes == 0


def test_pool_key_needs_every_slice_version() -> None:
    pool = build_pools(CAPACITIES[1:], CONFIG).pools[0]
    assert plan.pool_key(pool, [{"metadata": {"name": "x"}}]) is None
    one = plan.pool_key(pool, [{"metadata": {"name": "x", "resourceVersion": "5"}}])
    other = plan.pool_key(pool, [{"metadata": {"name": "x", "resourceVersion": "6"}}])
    assert one is not None
    assert other is not None
    assert one != other
