"""The one backoff of both processes: bounds, cap, growth, jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_dra.backoff import backoff_delay, ceiling

failures = st.integers(min_value=-5, max_value=5000)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
seeds = st.integers(min_value=0, max_value=2**32)


@given(failures, seconds, seconds, seeds)
def test_a_wait_is_in_the_upper_half_of_its_ceiling(
    failures: int, base: float, cap: float, seed: int
) -> None:
    top = ceiling(failures, base=base, cap=cap)
    wait = backoff_delay(failures, base=base, cap=cap, rng=random.Random(seed))
    assert top / 2 <= wait <= top


@given(failures, seconds, seconds)
def test_the_ceiling_never_passes_the_cap(failures: int, base: float, cap: float) -> None:
    assert ceiling(failures, base=base, cap=cap) <= cap


@given(st.integers(min_value=1, max_value=5000), seconds, seconds)
def test_the_ceiling_doubles_until_the_cap(failures: int, base: float, cap: float) -> None:
    now = ceiling(failures, base=base, cap=cap)
    after = ceiling(failures + 1, base=base, cap=cap)
    assert after == min(cap, 2 * now) or now == cap
    assert after >= now


@given(seconds, seconds)
def test_the_first_failure_waits_at_most_the_base(base: float, cap: float) -> None:
    assert ceiling(1, base=base, cap=cap) == min(base, cap)
    # No failure yet counts as the first: a caller's zeroed counter never waits less.
    assert ceiling(0, base=base, cap=cap) == ceiling(1, base=base, cap=cap)


def test_each_callers_numbers() -> None:
    """The sequences the loops and clients wait through (their ceilings, seconds)."""
    operator_loop = [ceiling(n, base=1.0, cap=60.0) for n in range(1, 9)]
    assert operator_loop == [1, 2, 4, 8, 16, 32, 60, 60]
    thunder_calls = [ceiling(n, base=0.5, cap=8.0) for n in range(1, 7)]
    assert thunder_calls == [0.5, 1, 2, 4, 8, 8]
    sweep = [ceiling(n, base=2 * 30.0, cap=8 * 30.0) for n in range(1, 5)]
    assert sweep == [60, 120, 240, 240]


def test_jitter_spreads_callers_apart() -> None:
    waits = {backoff_delay(3, base=1.0, cap=60.0, rng=random.Random(seed)) for seed in range(20)}
    assert len(waits) > 10
    assert all(2.0 <= wait <= 4.0 for wait in waits)


def test_without_an_rng_the_process_wide_one_jitters() -> None:
    assert 4.0 <= backoff_delay(4, base=1.0, cap=60.0) <= 8.0


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 1.0), (1.0, -1.0)])
def test_negative_numbers_are_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="need base >= 0"):
        backoff_delay(1, base=base, cap=cap)
