"""Capacity arithmetic: physical GPUs x target, never below live clients, never above target."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_dra.controllers.inventory.capacity import (
    MAX_TARGET,
    ClientInventory,
    HostInventory,
    OversubscriptionTargets,
    TargetSource,
    ZoneInventory,
    compute_capacity,
    format_target,
    parse_target,
    published_count,
    resolve_target,
)

EXAMPLES = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize(
    ("physical", "target", "published"),
    [(4, 1.5, 6), (3, 1.1, 3), (10, 0.3, 3), (7, 1.0, 7), (1, 0.5, 0), (3, 2.25, 6), (0, 4.0, 0)],
)
def test_floor_of_the_decimal_product(physical: int, target: float, published: int) -> None:
    parsed = parse_target(target)
    assert parsed is not None
    assert published_count(physical, parsed, 0) == published


def test_live_clients_keep_the_pool_from_shrinking_under_them() -> None:
    assert published_count(4, Decimal("0.5"), 3) == 3
    assert published_count(0, Decimal(1), 2) == 2


@EXAMPLES
@given(
    st.integers(min_value=0, max_value=10_000),
    st.floats(min_value=0.01, max_value=64, allow_nan=False),
    st.integers(min_value=0, max_value=10_000),
)
def test_published_never_exceeds_the_target_unless_clients_need_it(
    physical: int, target: float, live: int
) -> None:
    parsed = parse_target(target)
    assert parsed is not None
    published = published_count(physical, parsed, live)
    # Exact rational arithmetic on the decimal the API sent.
    exact = physical * Fraction(repr(target))
    assert published == max(math.floor(exact), live)
    assert published >= live
    assert published <= max(exact, Fraction(live))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, Decimal("1.5")),
        (2, Decimal(2)),
        ("1.25", Decimal("1.25")),
        (None, None),
        (0, None),
        (-1.5, None),
        (float("nan"), None),
        (float("inf"), None),
        ("abc", None),
        (True, None),
    ],
)
def test_parse_target(value: float | int | str | None, expected: Decimal | None) -> None:
    assert parse_target(value) == expected


def test_target_resolution_follows_the_api_rules() -> None:
    targets = OversubscriptionTargets(per_model={"H100": 1.5, "a6000": 0}, default=2)
    assert resolve_target(targets, "h100")[:2] == (Decimal("1.5"), TargetSource.MODEL)
    target, source, warnings = resolve_target(targets, "A6000")
    assert (target, source) == (Decimal(2), TargetSource.ZONE_DEFAULT)
    assert warnings
    assert resolve_target(targets, "L4")[:2] == (Decimal(2), TargetSource.ZONE_DEFAULT)
    assert resolve_target(OversubscriptionTargets(), "L4") == (Decimal(1), TargetSource.UNSET, ())
    failed = OversubscriptionTargets(per_model={"L4": 3}, default=2, read_failed=True)
    assert resolve_target(failed, "L4")[:2] == (Decimal(1), TargetSource.READ_FAILED)


def test_absurd_targets_are_clamped() -> None:
    target, _, warnings = resolve_target(OversubscriptionTargets(default=1e9), "L4")
    assert target == MAX_TARGET
    assert warnings


@pytest.mark.parametrize(
    ("target", "label"),
    [
        ("1", "1"),
        ("1.50", "1.5"),
        ("10", "10"),
        ("0.25", "0.25"),
        ("1E+1", "10"),
        ("1.23456789", "1.234567"),
        ("1E-70", "0"),
    ],
)
def test_target_labels(target: str, label: str) -> None:
    assert format_target(Decimal(target)) == label


def test_only_healthy_uncordoned_hosts_count() -> None:
    zone = ZoneInventory(
        zone_id="z1",
        zone_name="us-east",
        hosts=[
            HostInventory("A6000", 4, "Active"),
            HostInventory("A6000", 2, ""),
            HostInventory("A6000", 8, "offline"),
            HostInventory("A6000", 16, "online", cordoned=True),
            HostInventory("", 4, "ready"),
        ],
    )
    [pool] = compute_capacity([zone])
    assert (pool.physical, pool.published) == (6, 6)


def test_models_are_grouped_ignoring_case_with_a_stable_spelling() -> None:
    zone = ZoneInventory(
        zone_id="z1",
        zone_name="us-east",
        hosts=[HostInventory("a6000", 2), HostInventory("A6000", 2)],
        clients=[ClientInventory("A6000", 1)],
    )
    [pool] = compute_capacity([zone])
    assert (pool.model, pool.physical, pool.live_client_gpus) == ("A6000", 4, 1)


def test_live_clients_count_unless_decommissioned_or_unknown() -> None:
    zone = ZoneInventory(
        zone_id="z1",
        zone_name="us-east",
        hosts=[HostInventory("L4", 1)],
        clients=[
            ClientInventory("L4", 2),
            ClientInventory("l4", 1),
            ClientInventory("L4", 5, decommissioned=True),
            ClientInventory(None, 3),
            ClientInventory("L4", None),
        ],
    )
    [pool] = compute_capacity([zone])
    assert (pool.physical, pool.live_client_gpus, pool.published) == (1, 3, 3)


def test_a_model_held_only_by_clients_stays_published() -> None:
    zone = ZoneInventory(zone_id="z1", zone_name="us-east", clients=[ClientInventory("H100", 2)])
    [pool] = compute_capacity([zone])
    assert (pool.model, pool.physical, pool.published) == ("H100", 0, 2)


def test_zones_sharing_a_display_name_add_up() -> None:
    zones = [
        ZoneInventory(
            zone_id="z-b",
            zone_name="us-east",
            hosts=[HostInventory("A6000", 4)],
            targets=OversubscriptionTargets(default=1.5),
        ),
        ZoneInventory(zone_id="z-a", zone_name="us-east", hosts=[HostInventory("A6000", 3)]),
        ZoneInventory(zone_id="z-c", zone_name="eu-west", hosts=[HostInventory("A6000", 1)]),
    ]
    east, west = sorted(compute_capacity(zones), key=lambda p: p.zone_name, reverse=True)
    assert (east.physical, east.published) == (7, 6 + 3)
    assert east.zone_ids == ("z-a", "z-b")
    # The name resolves to its smallest zone ID, whose target the pool reports.
    assert east.target == Decimal(1)
    assert (west.zone_name, west.published) == ("eu-west", 1)


def test_a_failed_target_read_means_one_not_an_empty_zone() -> None:
    zone = ZoneInventory(
        zone_id="z1",
        zone_name="us-east",
        hosts=[HostInventory("A6000", 4)],
        targets=OversubscriptionTargets(read_failed=True),
    )
    [pool] = compute_capacity([zone])
    assert (pool.published, pool.target_source) == (4, TargetSource.READ_FAILED)


hosts = st.builds(
    HostInventory,
    gpu_type=st.sampled_from(["A6000", "a6000", "H100", "L4"]),
    gpu_count=st.integers(min_value=0, max_value=16),
    status=st.sampled_from(["active", "offline", ""]),
    cordoned=st.booleans(),
)


@EXAMPLES
@given(st.lists(hosts, max_size=12), st.floats(min_value=0.1, max_value=4))
def test_physical_is_the_sum_of_contributing_hosts(
    host_list: list[HostInventory], t: float
) -> None:
    zone = ZoneInventory(
        zone_id="z", zone_name="z", hosts=host_list, targets=OversubscriptionTargets(default=t)
    )
    pools = compute_capacity([zone])
    assert sum(p.physical for p in pools) == sum(h.gpu_count for h in host_list if h.adds_capacity)
    for pool in pools:
        assert pool.published == math.floor(pool.physical * Fraction(repr(t)))
    assert len({p.model_key for p in pools}) == len(pools)
