"""Leader election through a `coordination.k8s.io/v1` Lease, the way client-go does it.

Every operator replica runs a `LeaderElector`. A candidate reads the Lease every
`retry_period` (with jitter); it takes the Lease when it is absent, has no holder, or
has not changed for `leaseDurationSeconds` as measured on this replica's own monotonic
clock (never by comparing the apiserver's timestamps with ours, so clock skew between
nodes does not matter). Every write carries the `resourceVersion` it read, so of two
candidates racing for a free Lease exactly one wins; the other gets a conflict and
stays a standby. `leaseTransitions` counts the acquisitions after the first, as
client-go counts them (a release followed by a new holder is one transition).

The leader renews every `retry_period`. When no renewal has succeeded for
`renew_deadline` (which is shorter than the lease duration), or the Lease shows another
holder, the term ends at once: `Term.lost` is set and the reconcile loops are cancelled
before any standby may take over. The elector then campaigns again as a standby.

A standby reads the Lease at least every `retry_period * 2.2` and retries the moment the
holder's lease lapses, so after a leader dies outright a standby takes over at most
`lease_duration + retry_period * 2.2` after the dead leader's last renewal.

On a graceful stop the leader releases the Lease (holder emptied, duration 1 s), so a
standby takes it on its next retry instead of waiting for the lease to expire. The stop
first cancels the renewal loop and waits for it, so the two never write at once; but a
renewal cut off mid-request may still have reached the apiserver, and then the release
(written at the version read before it) conflicts. A conflicting release reads the Lease
again and releases it at the new version while it is still this replica's term (same
holder identity, acquire time and transition count), up to `RELEASE_ATTEMPTS` writes; a
Lease another candidate holds, or a later term's, is never emptied. An acquisition cut
off the same way is released too if it landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Final

from thunder_dra.controllers.process.lease import (
    LeaseConflict,
    LeaseRecord,
    LeaseStore,
    LeaseUnavailable,
    micro_time,
)
from thunder_dra.controllers.process.options import ElectionTimings

_log = logging.getLogger(__name__)

JITTER_FACTOR: Final = 1.2
"""A standby waits retry_period to retry_period * (1 + JITTER_FACTOR), as client-go does."""
RELEASE_TIMEOUT: Final = 5.0
"""For the whole release, every read and write of it."""
RELEASE_ATTEMPTS: Final = 3
"""Release writes at most, each after a conflict read the Lease again."""
RELEASED_LEASE_DURATION: Final = 1


def candidate_identity(environ: dict[str, str] | None = None) -> str:
    """The pod name (or host name) and a random suffix: unique even across restarts of
    one pod, so a restarted process never mistakes its predecessor's Lease for its own."""
    env = os.environ if environ is None else environ
    base = env.get("POD_ID") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:10]}"


# -- the elector --------------------------------------------------------------------------


class Term:
    """One stretch of leadership; `lost` is set when it ends for any reason."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.lost = asyncio.Event()


Sleep = Callable[[float], Awaitable[None]]
LeadershipListener = Callable[[bool], None]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    """Campaign for one Lease; lead while it is renewed; release it on `stop()`."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timings: ElectionTimings,
        *,
        on_change: LeadershipListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utcnow,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.store = store
        self.identity = identity
        self.timings = timings
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._terms = 0
        self._term: Term | None = None
        self._leading = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reported_holder: str | None = None
        self._term_lease: LeaseRecord | None = None
        self._writing: LeaseRecord | None = None
        self._stopping = asyncio.Lock()

    # -- what the operator asks --------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._term is not None

    @property
    def leader(self) -> str:
        """The holder this replica last saw in the Lease ("" if none)."""
        return self._observed.holder if self._observed is not None else ""

    @property
    def observed(self) -> LeaseRecord | None:
        return self._observed

    async def wait_for_term(self) -> Term:
        """Until this replica leads; the current term."""
        while self._term is None:
            await self._leading.wait()
        return self._term

    # -- running -----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="leader election")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; as the leader (or with an acquisition that the stop cut off
        on its way to the apiserver), end the term and release the Lease.

        Call it after the reconcile loops have stopped: a released Lease is taken by a
        standby within its retry period. The elector's task has ended (and can write no
        more) before the release begins; concurrent calls release once.
        """
        async with self._stopping:
            task, self._task = self._task, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # A write that the cancellation cut off may have landed: hold on to what it
            # wrote, so an acquisition that did land is released too.
            claim = self._term_lease if self._term is not None else self._writing
            self._writing = None
            self._end_term("stopping")
            if release and claim is not None:
                await self._release(claim)

    async def run(self) -> None:
        """Campaign and lead, forever: a lost term is followed by a new campaign."""
        while True:
            await self._acquire()
            self._begin_term()
            reason = await self._renew()
            self._end_term(reason)

    async def _acquire(self) -> None:
        timings = self.timings
        while True:
            started = self._clock()
            if await self._attempt(budget=timings.renew_deadline):
                self._renewed_at = started
                return
            delay = timings.retry_period * (1 + random.uniform(0, JITTER_FACTOR))  # noqa: S311
            expires_in = self._expires_in()
            if expires_in is not None and 0 < expires_in < delay:
                # Try again the moment the holder's lease lapses, not up to a retry later.
                delay = expires_in
            await self._sleep(delay)

    async def _renew(self) -> str:
        """Renew until that fails for renew_deadline or another holder appears; the reason."""
        timings = self.timings
        while True:
            await self._sleep(timings.retry_period)
            while True:
                remaining = self._renewed_at + timings.renew_deadline - self._clock()
                if remaining <= 0:
                    return f"no renewal succeeded for {timings.renew_deadline:g}s"
                started = self._clock()
                if await self._attempt(budget=remaining):
                    self._renewed_at = started
                    break
                holder = self.leader
                if holder and holder != self.identity:
                    return f"the Lease is held by {holder}"
                remaining = self._renewed_at + timings.renew_deadline - self._clock()
                await self._sleep(max(0.0, min(timings.retry_period, remaining)))

    async def _attempt(self, *, budget: float) -> bool:
        try:
            async with asyncio.timeout(budget):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            _log.warning(
                "Lease request timed out",
                extra={"lease": self._lease_name(), "timeout": round(budget, 2)},
            )
        except LeaseUnavailable as exc:
            _log.warning("Lease request failed", extra={"error": str(exc)})
        except Exception:
            # An answer of a shape nobody expected: a failed attempt like any other, so
            # the renew deadline still ends the term; never a dead elector that leads on.
            _log.exception("Lease request failed unexpectedly")
        return False

    async def _try_acquire_or_renew(self) -> bool:
        current = await self.store.get()
        self._writing = None  # what an earlier, timed-out write did is in `current`
        now = micro_time(self._wall())
        duration = int(self.timings.lease_duration)
        if current is None:
            mine = LeaseRecord(self.identity, duration, now, now, 0)
            try:
                created = await self._write(self.store.create, mine)
            except LeaseConflict:
                return False
            self._observe(created)
            return True
        self._observe(current)
        if current.holder and current.holder != self.identity and not self._expired(current):
            return False
        if current.holder == self.identity:
            wanted = replace(current, lease_duration_seconds=duration, renew_time=now)
        else:
            wanted = replace(
                current,
                holder=self.identity,
                lease_duration_seconds=duration,
                acquire_time=now,
                renew_time=now,
                transitions=current.transitions + 1,
            )
        try:
            updated = await self._write(self.store.update, wanted)
        except LeaseConflict:
            return False
        self._observe(updated)
        return True

    async def _write(
        self, write: Callable[[LeaseRecord], Awaitable[LeaseRecord]], record: LeaseRecord
    ) -> LeaseRecord:
        """`write(record)`, remembered while in flight: a request cancelled on its way
        (by a timeout or by `stop()`) may still reach the apiserver and name this holder."""
        self._writing = record
        try:
            written = await write(record)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._writing = None  # answered: it did not land
            raise
        self._writing = None
        return written

    def _expires_in(self) -> float | None:
        """Seconds until another holder's lease lapses as this replica sees it, if held."""
        record = self._observed
        if record is None or not record.holder or record.holder == self.identity:
            return None
        return self._observed_at + max(record.lease_duration_seconds, 0) - self._clock()

    def _expired(self, record: LeaseRecord) -> bool:
        """Unchanged, as this replica saw it, for the holder's own lease duration."""
        return self._observed_at + max(record.lease_duration_seconds, 0) <= self._clock()

    def _observe(self, record: LeaseRecord) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        if record.holder != self._reported_holder:
            self._reported_holder = record.holder
            if record.holder != self.identity:
                _log.info(
                    "the Lease has a new holder",
                    extra={
                        "lease": self._lease_name(),
                        "leader": record.holder or None,
                        "transitions": record.transitions,
                    },
                )

    def _lease_name(self) -> str:
        return str(getattr(self.store, "name", "lease"))

    def _begin_term(self) -> None:
        self._terms += 1
        self._term = Term(self._terms)
        self._term_lease = self._observed
        self._leading.set()
        observed = self._observed
        _log.info(
            "became the leader",
            extra={
                "lease": self._lease_name(),
                "identity": self.identity,
                "transitions": observed.transitions if observed else None,
            },
        )
        if self._on_change is not None:
            self._on_change(True)

    def _end_term(self, reason: str) -> None:
        term, self._term = self._term, None
        if term is None:
            return
        self._leading.clear()
        term.lost.set()
        _log.warning(
            "stopped leading",
            extra={"lease": self._lease_name(), "identity": self.identity, "reason": reason},
        )
        if self._on_change is not None:
            self._on_change(False)

    def _holds(self, record: LeaseRecord | None, claim: LeaseRecord) -> bool:
        """The Lease still names this replica, in the term `claim` was written in."""
        return (
            record is not None
            and record.holder == self.identity
            and (record.acquire_time, record.transitions) == (claim.acquire_time, claim.transitions)
        )

    async def _release(self, claim: LeaseRecord) -> None:
        """Empty the holder, so a standby need not wait for the lease to expire; only
        while the Lease is still this replica's in the term of `claim`."""
        lease = self._lease_name()
        now = micro_time(self._wall())
        writes = 0
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                record = self._observed
                if not self._holds(record, claim):
                    record = await self.store.get()  # the last write's answer never came
                while True:
                    if writes and record and not record.holder and record.renew_time == now:
                        break  # our own release, whose answer was lost
                    if record is None or not self._holds(record, claim):
                        _log.info(
                            "not releasing the Lease: no longer held in this term",
                            extra={
                                "lease": lease,
                                "identity": self.identity,
                                "leader": (record.holder or None) if record else None,
                            },
                        )
                        self._observed = record
                        return
                    writes += 1
                    released = replace(
                        record,
                        holder="",
                        lease_duration_seconds=RELEASED_LEASE_DURATION,
                        acquire_time=now,
                        renew_time=now,
                    )
                    try:
                        self._observed = await self.store.update(released)
                        break
                    except LeaseConflict:
                        if writes >= RELEASE_ATTEMPTS:
                            raise
                    # Most likely the renewal the stop cancelled, which landed anyway.
                    _log.info(
                        "the Lease changed while releasing it, reading it again",
                        extra={"lease": lease, "attempt": writes},
                    )
                    record = await self.store.get()
        except (LeaseConflict, LeaseUnavailable, TimeoutError) as exc:
            # The apiserver is away, or the Lease kept changing: it expires on its own.
            _log.warning(
                "could not release the Lease",
                extra={
                    "lease": lease,
                    "error": str(exc) or type(exc).__name__,
                    "attempts": writes,
                },
            )
            return
        _log.info("released the Lease", extra={"lease": lease, "attempts": writes})
