"""The pause in the kubelet's calls that bookkeeping waits for (thunder_dra/plugin/state/locks.py,
CallLull): counted calls, the lull after the last one, the longest deferral, shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from thunder_dra.plugin.state.locks import CallLull

pytestmark = pytest.mark.unit


async def _waiting(lull: CallLull, since: float | None = None) -> asyncio.Task[None]:
    task = asyncio.create_task(lull.wait(time.monotonic() if since is None else since))
    await asyncio.sleep(0)
    return task


async def test_without_calls_nothing_waits() -> None:
    lull = CallLull(lull=60, longest=60)
    await asyncio.wait_for(lull.wait(time.monotonic()), 5)
    assert lull.calls == 0


async def test_work_waits_through_the_calls_and_their_lull() -> None:
    lull = CallLull(lull=0.3, longest=60)
    async with lull.call():
        task = await _waiting(lull)
        async with lull.call():  # calls overlap: counted, not nested state
            assert lull.calls == 2
        await asyncio.sleep(0.4)  # one call still in flight: past the lull, still waiting
        assert not task.done()
    assert lull.calls == 0
    await asyncio.sleep(0)
    assert not task.done()  # the lull has only begun
    await asyncio.wait_for(task, 5)


async def test_a_call_within_the_lull_starts_it_again() -> None:
    lull = CallLull(lull=0.2, longest=60)
    async with lull.call():
        task = await _waiting(lull)
    async with lull.call():
        await asyncio.sleep(0.3)  # longer than the lull, but a call is in flight
        assert not task.done()
    await asyncio.wait_for(task, 5)


async def test_calls_that_never_pause_hold_work_back_at_most_the_longest_deferral() -> None:
    lull = CallLull(lull=0.01, longest=0.2)
    async with lull.call():
        task = await _waiting(lull)
        await asyncio.wait_for(task, 5)
        assert lull.calls == 1
        # Work handed over longer ago than that does not wait at all.
        await asyncio.wait_for(lull.wait(time.monotonic() - 1), 0.5)


async def test_opened_nothing_waits_any_more() -> None:
    lull = CallLull(lull=60, longest=60)
    async with lull.call():
        task = await _waiting(lull)
        lull.open()
        await asyncio.wait_for(task, 5)
        async with lull.call():
            await asyncio.wait_for(lull.wait(time.monotonic()), 5)


@pytest.mark.parametrize(("lull", "longest"), [(-1.0, 1.0), (1.0, -0.5)])
def test_a_negative_time_is_refused(lull: float, longest: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        CallLull(lull=lull, longest=longest)
