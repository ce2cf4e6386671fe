"""How long to wait after failures in a row: exponential, capped and jittered.

Every retry in both processes waits this way (Thunder calls, the operator's reconcile
and reaper loops, the daemon's node enrollment and journal sweep): after the n-th
failure in a row the wait is drawn uniformly from [c/2, c], c = min(cap, base * 2**(n-1)).
The lower bound keeps a fleet from hammering a service that just failed; the spread over
the upper half keeps many daemons (or operator replicas, or loops) that failed together
from retrying in step.
"""

from __future__ import annotations

import math
import random
from typing import Final

_SHARED_RNG: Final = random.Random()  # noqa: S311 - jitter, not a secret


def ceiling(failures: int, *, base: float, cap: float) -> float:
    """The longest wait after ``failures`` failures in a row (1 for the first failure;
    0 or less counts as 1): ``min(cap, base * 2**(failures - 1))``."""
    if base < 0 or cap < 0:
        raise ValueError(f"need base >= 0 and cap >= 0, got base {base:g}, cap {cap:g}")
    try:
        grown = math.ldexp(base, max(failures - 1, 0))
    except OverflowError:  # beyond any float: long past the cap
        return cap
    return min(cap, grown)


def backoff_delay(
    failures: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after ``failures`` failures in a row, drawn uniformly from
    ``[c/2, c]`` with ``c = ceiling(failures, base=base, cap=cap)``.

    ``rng`` is the caller's source of jitter (a seeded one in tests); without one, a
    process-wide generator."""
    top = ceiling(failures, base=base, cap=cap)
    return (rng or _SHARED_RNG).uniform(top / 2, top)
