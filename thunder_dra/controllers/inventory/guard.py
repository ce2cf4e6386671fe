"""When a shrinking Thunder answer is trusted (`spec.operator.inventoryProtection`).

A vendor answer that would withdraw published devices may be a vendor bug (an empty
zone list with HTTP 200, a zone or host briefly missing) rather than a real change,
and withdrawing devices is the one write a cluster notices. So, per published pool,
the answer is suspect when:

- Thunder listed no zones at all;
- the pool's zone is no longer listed;
- the pool is no longer reported (its zone is listed, the model is gone);
- the pool would lose more than `max_shrink_percent` of its published devices.

A suspect pool keeps its published devices until the same answer (the same device
count for that pool) has come `confirm_passes` consecutive passes; on that pass it is
applied. Meanwhile the devices the answer would withdraw are tainted (held, not
withdrawn: see taints.py and the inventory pass). Pools of zones that could not be read
are not judged here: the inventory pass keeps them anyway. The streaks live in the
operator process, so a restarted operator counts again from one, which only ever keeps
devices longer.

`judge` is a pure function of the published pools, the answer and the previous
streaks, so the same inputs always give the same decision.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PublishedPool:
    """A pool as it is published now."""

    name: str
    zone: str
    devices: int


@dataclass(frozen=True, slots=True)
class SuspectPool:
    """A published pool the answer would shrink suspiciously."""

    name: str
    zone: str
    published: int
    answered: int
    reason: str
    passes: int
    """Consecutive passes with this same answer, this one included."""

    def describe(self, confirm_passes: int) -> str:
        return (
            f"{self.name} {self.published}->{self.answered} ({self.reason}; "
            f"{self.passes}/{confirm_passes})"
        )


Streaks = Mapping[str, tuple[int, int]]
"""Pool name -> (answered device count, consecutive passes it was answered)."""


@dataclass(frozen=True, slots=True)
class GuardDecision:
    held: tuple[SuspectPool, ...] = ()
    """Kept as published this pass."""
    confirmed: tuple[SuspectPool, ...] = ()
    """Repeated `confirm_passes` times: applied this pass."""
    streaks: dict[str, tuple[int, int]] = field(default_factory=dict)
    """For the next pass."""

    @property
    def held_names(self) -> frozenset[str]:
        return frozenset(pool.name for pool in self.held)

    @property
    def held_zones(self) -> tuple[str, ...]:
        return tuple(sorted({pool.zone for pool in self.held}))


def suspect_reason(
    pool: PublishedPool,
    answered: int,
    listed_zones: Collection[str],
    max_shrink_percent: int,
) -> str | None:
    """Why the answer for `pool` is suspect, or None when it may be applied at once."""
    if answered >= pool.devices:
        # Nothing would be withdrawn (e.g. a pool kept for its claims in a vanished zone).
        return None
    if not listed_zones:
        return "Thunder listed no zones"
    if pool.zone not in listed_zones:
        return f"zone {pool.zone!r} is no longer listed"
    if answered <= 0 < pool.devices:
        return "the pool is no longer reported"
    lost = pool.devices - answered
    if lost > 0 and lost * 100 > pool.devices * max_shrink_percent:
        return f"it would lose {lost * 100 // pool.devices}% of its devices"
    return None


def judge(
    published: Collection[PublishedPool],
    answered: Mapping[str, int],
    *,
    listed_zones: Collection[str],
    unreadable_zones: Collection[str],
    max_shrink_percent: int,
    confirm_passes: int,
    streaks: Streaks,
) -> GuardDecision:
    """Which published pools to keep as they are this pass, and which to apply.

    `answered` is the device count each pool would publish (absent: none).
    """
    held: list[SuspectPool] = []
    confirmed: list[SuspectPool] = []
    following: dict[str, tuple[int, int]] = {}
    for pool in sorted(published, key=lambda p: p.name):
        if pool.zone in unreadable_zones or pool.devices <= 0:
            continue
        count = answered.get(pool.name, 0)
        reason = suspect_reason(pool, count, listed_zones, max_shrink_percent)
        if reason is None:
            continue
        previous = streaks.get(pool.name)
        passes = previous[1] + 1 if previous is not None and previous[0] == count else 1
        suspect = SuspectPool(pool.name, pool.zone, pool.devices, count, reason, passes)
        if passes >= confirm_passes:
            confirmed.append(suspect)
        else:
            held.append(suspect)
            following[pool.name] = (count, passes)
    return GuardDecision(tuple(held), tuple(confirmed), following)
