"""The journal sweep's wait: the interval after a clean pass, the one backoff after failed
passes (twice the interval doubling, at most 8 intervals, jittered 50-100%)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_dra.plugin.claims.recovery import SWEEP_MAX_BACKOFF_INTERVALS, sweep_delay

pytestmark = pytest.mark.unit


@given(st.floats(min_value=0.01, max_value=3600), st.integers(max_value=0))
def test_after_a_clean_pass_the_interval_exactly(interval: float, failures: int) -> None:
    assert sweep_delay(interval, failures) == interval


@given(
    st.floats(min_value=0.01, max_value=3600),
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=0, max_value=2**32),
)
def test_after_failed_passes_doubling_jittered_and_capped(
    interval: float, failures: int, seed: int
) -> None:
    ceiling = min(2 * interval * 2 ** min(failures - 1, 10), SWEEP_MAX_BACKOFF_INTERVALS * interval)
    wait = sweep_delay(interval, failures, random.Random(seed))
    assert ceiling / 2 <= wait <= ceiling
    # A failed pass never brings the next one sooner than a clean pass would.
    assert wait >= interval
