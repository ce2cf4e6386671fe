"""Duration flags: Go syntax in both processes, the daemon's bare seconds still read."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_dra.api.duration import format_duration
from thunder_dra.process.flags import FlagDuration, duration, duration_or_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("15s", timedelta(seconds=15)),
        ("1m30s", timedelta(seconds=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_both_read_go_durations(text: str, value: timedelta) -> None:
    assert duration(text) == value
    assert duration_or_seconds(text) == FlagDuration(value, bare_seconds=False)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30", 30.0), ("0.5", 0.5), ("0.05", 0.05), ("2.0", 2.0), ("1e3", 1000)]
)
def test_the_daemons_bare_seconds_still_read_and_are_marked(text: str, seconds: float) -> None:
    parsed = duration_or_seconds(text)
    assert parsed.bare_seconds
    assert parsed.seconds == seconds


def test_the_operators_flags_never_took_bare_seconds() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        duration("30")


@pytest.mark.parametrize("text", ["0", "0s", "-5s", "-5", "0.0000001", "nan", "inf", "1e400"])
def test_a_daemon_duration_must_be_positive_and_finite(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"positive|not a duration"):
        duration_or_seconds(text)


@pytest.mark.parametrize("text", ["", "30 seconds", "5 m", "1d", "s"])
def test_anything_else_is_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r'as in "60s"'):
        duration_or_seconds(text)


@given(st.integers(min_value=1, max_value=10**12))
def test_bare_seconds_and_their_go_spelling_agree(micros: int) -> None:
    value = timedelta(microseconds=micros)
    go = duration_or_seconds(format_duration(value))
    bare = duration_or_seconds(repr(value.total_seconds()))
    assert go.value == value
    assert abs(bare.value - value) <= timedelta(microseconds=1)
    assert bare.bare_seconds
    assert not go.bare_seconds
