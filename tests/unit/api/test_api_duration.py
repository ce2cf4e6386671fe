"""Go-style durations: what users write in the ThunderCluster spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from thunder_dra.api.duration import Duration, DurationRange, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("60s", timedelta(seconds=60)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("300ms", timedelta(milliseconds=300)),
        ("1h0m0s", timedelta(hours=1)),
        (".5s", timedelta(milliseconds=500)),
        ("2us", timedelta(microseconds=2)),
        ("1500ns", timedelta(microseconds=1)),
        ("0", timedelta(0)),
        ("-5s", timedelta(seconds=-5)),
        ("+10m", timedelta(minutes=10)),
    ],
)
def test_parses_go_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "1d", "s", "1 h", "1h 30m", "one second", ".s", "1e3s"])
def test_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(seconds=60), "1m"),
        (timedelta(hours=25), "25h"),
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=-5), "-5s"),
    ],
)
def test_formats_compactly(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@settings(max_examples=200)
@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_format_then_parse_round_trips(micros: int) -> None:
    value = timedelta(microseconds=micros)
    assert parse_duration(format_duration(value)) == value


class _Bounded(BaseModel):
    interval: Annotated[Duration, DurationRange("5s", "24h")] = Duration("60s")


def test_duration_keeps_the_users_text_and_parses_on_demand() -> None:
    model = _Bounded.model_validate({"interval": "90s"})
    assert model.interval == "90s"
    assert model.interval.to_timedelta() == timedelta(seconds=90)
    assert model.interval.total_seconds() == 90.0
    assert model.model_dump(mode="json") == {"interval": "90s"}


@pytest.mark.parametrize("text", ["0s", "4.999s", "24h1ns1us", "-1m", "25h"])
def test_range_is_enforced_with_a_readable_message(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _Bounded.model_validate({"interval": text})
    assert caught.value.errors()[0]["msg"] == f'must be between 5s and 24h, got "{text}"'


@pytest.mark.parametrize("text", ["5s", "24h", "1h30m"])
def test_range_includes_both_ends(text: str) -> None:
    assert _Bounded.model_validate({"interval": text}).interval == text
