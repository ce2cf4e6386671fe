"""Resource quantities compare by value, as the apiserver stores them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_dra.kube.quantity import parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", "0"),
        ("500m", "0.5"),
        ("0.5", "0.5"),
        ("1", "1"),
        ("1k", "1000"),
        ("1Ki", "1024"),
        ("128Mi", str(128 * 1024**2)),
        ("1Gi", str(1024**3)),
        ("2G", "2000000000"),
        ("1.5Gi", str(3 * 1024**3 // 2)),
        ("100n", "0.0000001"),
        ("250u", "0.00025"),
        ("1E", "1000000000000000000"),
        ("1e3", "1000"),
        ("12E-2", "0.12"),
        ("-1", "-1"),
        (".5", "0.5"),
        ("+2", "2"),
    ],
)
def test_each_suffix_has_its_value(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


def test_equal_quantities_in_other_units_compare_equal() -> None:
    assert parse_quantity("0.5") == parse_quantity("500m")
    assert parse_quantity("1024Mi") == parse_quantity("1Gi")
    assert parse_quantity("1000M") == parse_quantity("1G")


@pytest.mark.parametrize("text", ["", "abc", "1x", "1ki", "Mi", "1 Gi", "1.2.3", "--1", "1e"])
def test_anything_else_is_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


def test_numbers_are_taken_as_they_are() -> None:
    assert parse_quantity(3) == Decimal(3)
    assert parse_quantity(0.25) == Decimal("0.25")
    assert parse_quantity(Decimal("1.5")) == Decimal("1.5")
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(True)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["Ki", "Mi", "Gi", "Ti"]))
def test_binary_suffixes_are_powers_of_1024(count: int, suffix: str) -> None:
    power = ["Ki", "Mi", "Gi", "Ti"].index(suffix) + 1
    assert parse_quantity(f"{count}{suffix}") == Decimal(count) * 1024**power
