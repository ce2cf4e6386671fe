"""Pools keep their names when a zone sharing their label cannot be read or is empty.

Two Thunder zones may have display names with one DNS label (`us-east`, `US-East`): the
exact spelling keeps the label and the other gets a hashed one (`naming.assign_labels`).
The labels must depend on the zones Thunder lists, not on which of them could be read
or have capacity this pass, or a readable zone would take the label of a pool that is
kept (tainted) for an unreadable one, and the operator would create a slice that exists.
"""

from __future__ import annotations

from thunder_dra.controllers.inventory.capacity import (
    HostInventory,
    ZoneInventory,
    compute_capacity,
)
from thunder_dra.controllers.inventory.slices import InventoryConfig, build_pools

CONFIG = InventoryConfig()


def _zone(zone_id: str, name: str, gpus: int) -> ZoneInventory:
    hosts = (HostInventory("A6000", gpus),) if gpus else ()
    return ZoneInventory(zone_id=zone_id, zone_name=name, hosts=hosts)


def _pool_names(zones: list[ZoneInventory], listed: list[str]) -> list[str]:
    layout = build_pools(compute_capacity(zones), CONFIG, zone_names=listed)
    return [pool.name for pool in layout.pools]


def test_both_readable_the_exact_spelling_keeps_the_label() -> None:
    names = _pool_names([_zone("z0", "us-east", 1), _zone("z1", "US-East", 1)], [])
    assert "us-east/a6000" in names
    other = next(n for n in names if n != "us-east/a6000")
    assert other.startswith("us-east-")
    assert other.endswith("/a6000")


def test_a_readable_zone_does_not_take_the_label_of_one_that_cannot_be_read() -> None:
    both = _pool_names([_zone("z0", "us-east", 1), _zone("z1", "US-East", 1)], [])
    us_east_upper = next(n for n in both if n != "us-east/a6000")
    # us-east's hosts could not be read: only US-East has capacity this pass.
    alone = _pool_names([_zone("z1", "US-East", 1)], ["us-east", "US-East"])
    assert alone == [us_east_upper]
    # Without the listed names it would have taken us-east's pool name.
    assert _pool_names([_zone("z1", "US-East", 1)], []) == ["us-east/a6000"]


def test_an_empty_zone_keeps_its_label_for_when_it_has_capacity() -> None:
    both = _pool_names([_zone("z0", "us-east", 1), _zone("z1", "US-East", 1)], [])
    listed = ["us-east", "US-East"]
    assert _pool_names([_zone("z0", "us-east", 0), _zone("z1", "US-East", 1)], listed) == [
        n for n in both if n != "us-east/a6000"
    ]


def test_names_no_node_label_can_carry_are_not_labelled() -> None:
    assert _pool_names([_zone("z0", "us-east", 1)], ["us east!", ""]) == ["us-east/a6000"]
