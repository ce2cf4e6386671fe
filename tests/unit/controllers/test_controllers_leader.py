"""The Lease elector against an in-memory Lease with resourceVersion checks, on a virtual
clock: acquisition, renewal, conflicts, apiserver errors, lost and released leases."""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_dra.controllers.process.leader import (
    RELEASE_ATTEMPTS,
    LeaderElector,
    candidate_identity,
)
from thunder_dra.controllers.process.lease import LeaseConflict, LeaseRecord, LeaseUnavailable
from thunder_dra.controllers.process.options import ElectionTimings, parse_options

pytestmark = pytest.mark.unit

TIMINGS = ElectionTimings(lease_duration=15, renew_deadline=10, retry_period=2)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class VirtualTime:
    """A monotonic clock and a sleep that only advance when the test steps them."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def clock(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self.now + max(seconds, 0.0), self._seq, future))
        await future

    @staticmethod
    async def settle() -> None:
        for _ in range(30):
            await asyncio.sleep(0)

    async def step(self) -> None:
        """Let every runnable task run, then wake the earliest sleeper."""
        await self.settle()
        while self._sleepers:
            wake, _seq, future = heapq.heappop(self._sleepers)
            if future.done():
                continue
            self.now = max(self.now, wake)
            future.set_result(None)
            break
        await self.settle()

    async def advance(self, seconds: float, check: Callable[[], None] = lambda: None) -> None:
        end = self.now + seconds
        while True:
            await self.settle()
            check()
            pending = [s for s in self._sleepers if not s[2].done()]
            if not pending or min(pending)[0] > end:
                break
            await self.step()
        self.now = end
        await self.settle()
        check()

    async def until(self, predicate: Callable[[], bool], limit: float) -> float:
        """Step until `predicate`; the virtual time that took."""
        start = self.now
        while True:
            await self.settle()
            if predicate():
                return self.now - start
            assert self.now - start <= limit, f"not within {limit}s of virtual time"
            waiting = any(not f.done() for *_, f in self._sleepers)
            assert waiting, "no task left to wake: the awaited state can never come"
            await self.step()


class FakeLeases:
    """One Lease, with the apiserver's optimistic concurrency and injectable failures."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.failing: Callable[[str], Exception | None] = lambda _op: None
        self.calls: list[str] = []

    def _enter(self, op: str) -> None:
        self.calls.append(op)
        failure = self.failing(op)
        if failure is not None:
            raise failure

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, resource_version=str(self.version))
        return self.record

    async def get(self) -> LeaseRecord | None:
        self._enter("get")
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        self._enter("create")
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        self._enter("update")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("changed")
        return self._store(record)

    def overwrite(self, **fields: object) -> None:
        """Another writer (kubectl, a replica with a stale view) changes the Lease."""
        assert self.record is not None
        self._store(replace(self.record, **fields))  # type: ignore[arg-type]


def elector(
    store: FakeLeases,
    time: VirtualTime,
    name: str,
    timings: ElectionTimings = TIMINGS,
    changes: list[bool] | None = None,
) -> LeaderElector:
    return LeaderElector(
        store,
        name,
        timings,
        on_change=changes.append if changes is not None else None,
        clock=time.clock,
        wall=time.wall,
        sleep=time.sleep,
    )


# -- timings ---------------------------------------------------------------------------


@given(
    lease=st.integers(min_value=1, max_value=120),
    renew=st.floats(min_value=0.001, max_value=130, allow_nan=False),
    retry=st.floats(min_value=0.001, max_value=130, allow_nan=False),
)
def test_timings_are_accepted_exactly_when_retry_lt_renew_lt_lease(
    lease: int, renew: float, retry: float
) -> None:
    if retry < renew < lease:
        timings = ElectionTimings(lease, renew, retry)
        assert timings.lease_duration == lease
        return
    with pytest.raises(ValueError, match="--leader-election-"):
        ElectionTimings(lease, renew, retry)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--leader-election-renew-deadline", "15s"], "--leader-election-renew-deadline"),
        (["--leader-election-retry-period", "10s"], "--leader-election-retry-period"),
        (["--leader-election-lease-duration", "1500ms"], "whole seconds"),
        (["--leader-election-retry-period", "0s"], "positive"),
    ],
)
def test_bad_timing_flags_are_refused_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_options(argv, environ={})
    assert named in capsys.readouterr().err


def test_timing_flags_and_their_environment() -> None:
    options = parse_options(
        ["--leader-election-retry-period", "500ms"],
        environ={
            "THUNDER_LEADER_ELECTION_LEASE": "release-x",
            "THUNDER_LEADER_ELECTION_LEASE_DURATION": "4s",
            "THUNDER_LEADER_ELECTION_RENEW_DEADLINE": "3s",
        },
    )
    assert options.lease_name == "release-x"
    assert options.election == ElectionTimings(4, 3, 0.5)
    assert parse_options([], environ={}).election == ElectionTimings(15, 10, 2)


def test_identities_are_the_pod_name_and_unique() -> None:
    first = candidate_identity({"POD_ID": "op-7d9f-abc"})
    second = candidate_identity({"POD_ID": "op-7d9f-abc"})
    assert first.startswith("op-7d9f-abc_")
    assert second.startswith("op-7d9f-abc_")
    assert first != second


# -- acquiring -----------------------------------------------------------------------------


async def test_the_first_candidate_creates_the_lease_and_leads() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    assert store.record is not None
    assert (store.record.holder, store.record.lease_duration_seconds) == ("a", 15)
    assert store.record.transitions == 0
    assert store.record.acquire_time == store.record.renew_time == "2026-01-01T00:00:00.000000Z"
    assert changes == [True]
    term = await a.wait_for_term()
    assert not term.lost.is_set()
    await a.stop(release=False)


async def test_of_two_candidates_exactly_one_leads_and_keeps_renewing() -> None:
    time, store = VirtualTime(), FakeLeases()
    a, b = elector(store, time, "a"), elector(store, time, "b")
    a.start()
    b.start()

    def one_leader() -> None:
        assert [a.is_leader, b.is_leader].count(True) <= 1

    await time.until(lambda: a.is_leader or b.is_leader, limit=5)
    leader, standby = (a, b) if a.is_leader else (b, a)
    renewals = store.version
    await time.advance(120, one_leader)
    assert leader.is_leader
    assert not standby.is_leader
    assert store.record is not None
    assert store.record.holder == leader.identity
    assert store.record.transitions == 0
    # Renewed about every retry period for 120 s.
    assert store.version - renewals >= 120 / TIMINGS.retry_period - 2
    assert standby.leader == leader.identity
    await a.stop(release=False)
    await b.stop(release=False)


async def test_a_standby_takes_over_a_lease_left_unrenewed_after_the_lease_duration() -> None:
    time, store = VirtualTime(), FakeLeases()
    a, b = elector(store, time, "a"), elector(store, time, "b")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    b.start()
    await time.advance(30)
    assert not b.is_leader
    # The leader dies without a word (SIGKILL): no release.
    await a.stop(release=False)
    assert store.record is not None
    assert store.record.holder == "a"
    died = time.now
    waited = await time.until(lambda: b.is_leader, limit=60)
    # Not before the lease lapsed as b saw it, and within one more retry (with jitter).
    assert TIMINGS.lease_duration - TIMINGS.retry_period <= waited
    assert waited <= TIMINGS.lease_duration + TIMINGS.retry_period * 2.2 + 0.001
    assert time.now > died
    assert store.record.holder == "b"
    assert store.record.transitions == 1
    await b.stop(release=False)


async def test_release_empties_the_holder_and_the_standby_takes_over_on_its_next_retry() -> None:
    time, store = VirtualTime(), FakeLeases()
    a, b = elector(store, time, "a"), elector(store, time, "b")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    b.start()
    await time.advance(20)
    term = await a.wait_for_term()
    await a.stop(release=True)
    assert term.lost.is_set()
    assert store.record is not None
    assert (store.record.holder, store.record.lease_duration_seconds) == ("", 1)
    waited = await time.until(lambda: b.is_leader, limit=10)
    assert waited <= TIMINGS.retry_period * 2.2 + 0.001
    assert store.record.holder == "b"
    assert store.record.transitions == 1
    await b.stop(release=True)


async def test_a_released_lease_is_not_released_again_by_a_former_holder() -> None:
    time, store = VirtualTime(), FakeLeases()
    a = elector(store, time, "a")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    store.overwrite(holder="b")  # taken while a still thought it led
    await a.stop(release=True)
    assert store.record is not None
    assert store.record.holder == "b"


class LostAnswers:
    """Writes the apiserver applies but whose answer never reaches the elector: the
    request is still in flight when `stop()` cancels it (a renewal racing a SIGTERM)."""

    def __init__(self, store: FakeLeases, op: str = "update") -> None:
        self.landed = asyncio.Event()
        self._store = store
        self._op = op
        self._write = getattr(store, op)
        setattr(store, op, self._applied_then_lost)

    async def _applied_then_lost(self, record: LeaseRecord) -> LeaseRecord:
        if self.landed.is_set():
            return await self._write(record)  # type: ignore[no-any-return]
        await self._write(record)
        self.landed.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_release_racing_the_last_renewal_still_releases_the_lease() -> None:
    time, store = VirtualTime(), FakeLeases()
    a, b = elector(store, time, "a"), elector(store, time, "b")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    b.start()
    await time.advance(10)
    lost = LostAnswers(store)
    await time.until(lost.landed.is_set, limit=TIMINGS.retry_period + 0.001)
    assert store.record is not None
    renewed = store.record.resource_version
    assert a.observed is not None
    assert a.observed.resource_version != renewed  # a never read its last renewal
    await a.stop(release=True)
    assert (store.record.holder, store.record.lease_duration_seconds) == ("", 1)
    # The first release conflicted with the renewal; the Lease was read again and
    # released at the version the renewal left.
    assert store.calls[-3:] == ["update", "get", "update"]
    waited = await time.until(lambda: b.is_leader, limit=10)
    assert waited <= TIMINGS.retry_period * 2.2 + 0.001
    assert store.record.transitions == 1
    await b.stop(release=False)


async def test_an_acquisition_cut_off_by_stop_is_released_if_it_landed() -> None:
    time, store = VirtualTime(), FakeLeases()
    lost = LostAnswers(store, "create")
    a = elector(store, time, "a")
    a.start()
    await time.until(lost.landed.is_set, limit=1)
    assert not a.is_leader
    assert store.record is not None
    assert store.record.holder == "a"
    await a.stop(release=True)
    assert (store.record.holder, store.record.lease_duration_seconds) == ("", 1)


@pytest.mark.parametrize(
    "taken",
    [
        {"holder": "b", "transitions": 1},
        {"holder": "", "lease_duration_seconds": 1},
        {"acquire_time": "2026-01-01T00:05:00.000000Z", "transitions": 2},
    ],
    ids=["another-holder", "released-by-another-writer", "a-later-term-of-this-identity"],
)
async def test_a_release_that_conflicts_never_empties_a_lease_that_is_no_longer_this_term(
    taken: dict[str, object],
) -> None:
    time, store = VirtualTime(), FakeLeases()
    a = elector(store, time, "a")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    await time.advance(5)

    left: list[LeaseRecord | None] = []

    def taken_during_release(op: str) -> Exception | None:
        if op == "update" and not a.is_leader:
            store.failing = lambda _op: None
            store.overwrite(**taken)
            left.append(store.record)
            return LeaseConflict("changed")
        return None

    store.failing = taken_during_release
    await a.stop(release=True)
    # Read again after the conflict, and left exactly as the other writer left it.
    assert store.calls[-2:] == ["update", "get"]
    assert left == [store.record]


async def test_a_release_conflicting_every_time_gives_up_after_a_bounded_number_of_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time, store = VirtualTime(), FakeLeases()
    a = elector(store, time, "a")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    await time.advance(5)

    def busy(op: str) -> Exception | None:
        if op == "update" and not a.is_leader:
            store.overwrite()  # another writer bumps the version, holder unchanged
            return LeaseConflict("changed")
        return None

    store.failing = busy
    calls = len(store.calls)
    await a.stop(release=True)
    assert store.record is not None
    assert store.record.holder == "a"  # it expires on its own
    releases = ["update", "get"] * (RELEASE_ATTEMPTS - 1) + ["update"]
    assert store.calls[calls:] == releases
    assert "could not release the Lease" in caplog.text


async def test_concurrent_stops_release_once() -> None:
    time, store = VirtualTime(), FakeLeases()
    a = elector(store, time, "a")
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    await asyncio.gather(a.stop(release=True), a.stop(release=True))
    assert store.record is not None
    assert store.record.holder == ""
    assert store.calls.count("update") == 1


# -- conflicts and errors -------------------------------------------------------------------


async def test_a_conflict_on_renew_with_this_holder_is_retried_and_leadership_kept() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    term = await a.wait_for_term()
    conflicts = 0

    def once(op: str) -> Exception | None:
        nonlocal conflicts
        if op == "update" and conflicts < 2:
            conflicts += 1
            # Someone bumped the resourceVersion between our read and our write.
            store.overwrite()
            return LeaseConflict("changed")
        return None

    store.failing = once
    await time.advance(30)
    assert conflicts == 2
    assert a.is_leader
    assert not term.lost.is_set()
    assert changes == [True]
    await a.stop(release=False)


async def test_a_lease_taken_by_another_holder_ends_the_term_at_once() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    term = await a.wait_for_term()
    store.overwrite(holder="intruder", transitions=1)
    taken = time.now
    await time.until(lambda: term.lost.is_set(), limit=TIMINGS.retry_period + 0.001)
    assert time.now - taken <= TIMINGS.retry_period
    assert not a.is_leader
    assert changes == [True, False]
    assert a.leader == "intruder"
    await a.stop(release=True)
    assert store.record is not None
    assert store.record.holder == "intruder"


async def test_a_standby_keeps_trying_through_apiserver_errors() -> None:
    time, store = VirtualTime(), FakeLeases()
    failures = 0

    def down(op: str) -> Exception | None:
        nonlocal failures
        if failures < 20:
            failures += 1
            return LeaseUnavailable("HTTP 503 Service Unavailable")
        return None

    store.failing = down
    a = elector(store, time, "a")
    a.start()
    await time.advance(20)
    assert not a.is_leader
    await time.until(lambda: a.is_leader, limit=200)
    assert failures == 20
    assert store.record is not None
    assert store.record.holder == "a"
    await a.stop(release=False)


async def test_errors_shorter_than_the_renew_deadline_keep_leadership() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    store.failing = lambda op: LeaseUnavailable("HTTP 500")
    await time.advance(TIMINGS.renew_deadline - TIMINGS.retry_period - 0.5)
    store.failing = lambda op: None
    await time.advance(30)
    assert a.is_leader
    assert changes == [True]
    await a.stop(release=False)


async def test_no_renewal_for_the_renew_deadline_loses_leadership_before_the_lease_lapses() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    await time.advance(9)
    term = await a.wait_for_term()
    assert store.record is not None
    last_write = store.record.renew_time
    store.failing = lambda op: LeaseUnavailable("connection refused")
    outage = time.now
    await time.until(lambda: term.lost.is_set(), limit=TIMINGS.lease_duration)
    assert store.record.renew_time == last_write
    # Stopped leading within renew_deadline of the last successful renewal, which came at
    # most one retry period before the outage: before any standby could take over.
    assert time.now - outage <= TIMINGS.renew_deadline
    assert changes == [True, False]
    # The apiserver comes back and nobody else took the Lease: a new term begins.
    store.failing = lambda op: None
    await time.until(lambda: a.is_leader, limit=10)
    second = await a.wait_for_term()
    assert second.number == term.number + 1
    assert store.record.holder == "a"
    await a.stop(release=False)


async def test_an_unexpected_error_is_a_failed_attempt_not_a_dead_elector() -> None:
    time, store, changes = VirtualTime(), FakeLeases(), list[bool]()
    a = elector(store, time, "a", changes=changes)
    a.start()
    await time.until(lambda: a.is_leader, limit=1)
    term = await a.wait_for_term()
    store.failing = lambda op: KeyError("spec")
    await time.until(lambda: term.lost.is_set(), limit=TIMINGS.renew_deadline + 0.001)
    assert changes == [True, False]
    store.failing = lambda op: None
    await time.until(lambda: a.is_leader, limit=10)
    await a.stop(release=True)
    assert store.record is not None
    assert store.record.holder == ""


async def test_a_hung_request_cannot_extend_the_term() -> None:
    # Real seconds here: the per-request bound is an asyncio timeout.
    timings = ElectionTimings(lease_duration=1, renew_deadline=0.4, retry_period=0.1)
    store = FakeLeases()
    a = LeaderElector(store, "a", timings)
    a.start()
    term = await asyncio.wait_for(a.wait_for_term(), 2)
    hang = asyncio.Event()

    async def hung_get() -> LeaseRecord | None:
        await hang.wait()
        return store.record

    store.get = hung_get  # type: ignore[method-assign]
    await asyncio.wait_for(term.lost.wait(), 2)
    assert not a.is_leader
    await a.stop(release=False)


@pytest.mark.parametrize("seed", range(6))
async def test_never_two_leaders_under_random_errors_conflicts_and_deaths(seed: int) -> None:
    rng = random.Random(seed)
    time, store = VirtualTime(), FakeLeases()

    def chaos(op: str) -> Exception | None:
        roll = rng.random()
        if roll < 0.15:
            return LeaseUnavailable("HTTP 503")
        if roll < 0.2 and op == "update" and store.record is not None:
            store.overwrite()
            return LeaseConflict("changed")
        return None

    store.failing = chaos
    candidates = [elector(store, time, name) for name in "abc"]
    for candidate in candidates:
        candidate.start()
    leaders_seen: set[str] = set()

    def at_most_one() -> None:
        leading = [c.identity for c in candidates if c.is_leader]
        assert len(leading) <= 1, leading
        leaders_seen.update(leading)

    for _round in range(6):
        await time.advance(40, at_most_one)
        # Kill the leader outright and bring it back as a new candidate.
        for index, candidate in enumerate(candidates):
            if candidate.is_leader:
                await candidate.stop(release=rng.random() < 0.5)
                candidates[index] = elector(store, time, f"{candidate.identity}'")
                candidates[index].start()
    assert leaders_seen
    for candidate in candidates:
        await candidate.stop(release=False)
