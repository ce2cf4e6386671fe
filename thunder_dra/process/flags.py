"""Duration flags, read the same way by both processes.

A duration flag takes Go's syntax (`thunder_dra.api.duration`): "15s", "1m30s", "500ms",
as the ThunderCluster's own durations and the Kubernetes tools do. The daemon's flags
took bare seconds ("30", "0.5") before; :func:`duration_or_seconds` still reads those,
marked so the daemon can warn about them once at start: a newer daemon is run by an
older operator, and an older daemon by a newer one, while an upgrade rolls out.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from datetime import timedelta

from thunder_dra.api.duration import parse_duration


def duration(text: str) -> timedelta:
    """An argparse ``type``: a Go duration."""
    try:
        return parse_duration(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class FlagDuration:
    """A positive duration flag's value, and whether it was written in bare seconds."""

    value: timedelta
    bare_seconds: bool = False

    @property
    def seconds(self) -> float:
        return self.value.total_seconds()


def duration_or_seconds(text: str) -> FlagDuration:
    """An argparse ``type``: a positive Go duration ("30s"), or, deprecated, a positive
    number of seconds ("30", "0.5")."""
    try:
        value, bare = parse_duration(text.strip()), False
    except ValueError as exc:
        try:
            seconds = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not math.isfinite(seconds) or abs(seconds) > timedelta.max.total_seconds():
            raise argparse.ArgumentTypeError(f'"{text}" is not a duration') from None
        value, bare = timedelta(seconds=seconds), True
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f'must be positive, got "{text}"')
    return FlagDuration(value, bare)
