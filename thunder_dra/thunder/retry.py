"""Which Thunder calls may be repeated, when, and how long to wait between attempts.

Three rules, one per kind of call (thunder-api.md 1.3):

- ``IDEMPOTENT``: reads (thunder-api.md 2.1, 2.3, 2.4, 2.5), the zone ensure
  (thunder-api.md 2.2: idempotent by display name, and the ID is re-listed anyway) and
  revocations (thunder-api.md 2.7, 2.8: a repeat answers 404/410, which is success).
  Repeating them cannot create anything, so 429, 5xx and every transport error (timeouts
  included) are retried.
- ``MINT`` (thunder-api.md 2.6): only 429 (Thunder refused before acting) and transport
  errors where the request provably never left the node (connect failures, no pooled
  connection). A 5xx, a read timeout or a dropped connection may come *after* Thunder
  minted a token; its ID never reached us, the API cannot list tokens, so that enrollment
  cannot be revoked, and a retry would mint a second one. Those failures go to the caller,
  whose mint journal handles them.
- ``EXCHANGE`` (thunder-api.md 2.9): exactly as the contract says, 429 and 5xx only.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from thunder_dra.backoff import backoff_delay
from thunder_dra.thunder.errors import (
    ArtifactError,
    RateLimited,
    ServerError,
    ThunderError,
    ThunderTransportError,
)

_T = TypeVar("_T")


class Clock(Protocol):
    """Time source of the retry loop; tests pass one that advances without waiting."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class RetryOn(enum.Enum):
    IDEMPOTENT = "idempotent"
    MINT = "mint"
    EXCHANGE = "exchange"


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_attempts`` attempts, all within ``budget`` seconds.

    The n-th wait is :func:`thunder_dra.backoff.backoff_delay` of n, from
    ``initial_backoff`` up to ``max_backoff``: drawn uniformly from [c/2, c] with
    c = min(max_backoff, initial_backoff * 2**(n-1)), so that many daemons failing
    together do not retry in lockstep.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    budget: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError("need 0 <= initial_backoff <= max_backoff")
        if self.budget <= 0:
            raise ValueError("budget must be positive")

    def delay(self, retry_number: int, rng: random.Random, retry_after: float | None) -> float:
        wait = backoff_delay(retry_number, base=self.initial_backoff, cap=self.max_backoff, rng=rng)
        if retry_after is not None and retry_after > 0:
            # Honour the server's hint, but never beyond the policy's cap.
            wait = max(wait, min(retry_after, self.max_backoff))
        return wait


DEFAULT_RETRY = RetryPolicy()
# thunder-api.md 2.9: at most 5 attempts, backoff from 0.5 s capped at 8 s, 90 s in all.
EXCHANGE_RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.5, max_backoff=8.0, budget=90.0)


def is_retryable(error: ThunderError, retry_on: RetryOn) -> bool:
    if isinstance(error, ArtifactError):
        # Artifact downloads are plain GETs; only the host's own trouble is worth a repeat.
        status = error.status
        return (
            retry_on is RetryOn.IDEMPOTENT
            and status is not None
            and (status == 429 or status >= 500)
        )
    if isinstance(error, RateLimited):
        return True
    if isinstance(error, ServerError):
        return retry_on in (RetryOn.IDEMPOTENT, RetryOn.EXCHANGE)
    if isinstance(error, ThunderTransportError):
        if retry_on is RetryOn.IDEMPOTENT:
            return True
        if retry_on is RetryOn.MINT:
            return not error.request_sent
    return False


def retry_reason(error: ThunderError) -> str:
    """A short, bounded label for metrics and logs."""
    if isinstance(error, ThunderTransportError):
        return "timeout" if error.timed_out else "transport"
    status = getattr(error, "status", None)
    return str(status) if status is not None else type(error).__name__


async def run_with_retry(
    attempt: Callable[[int, float], Awaitable[_T]],
    *,
    policy: RetryPolicy,
    retry_on: RetryOn,
    clock: Clock,
    rng: random.Random,
    on_retry: Callable[[ThunderError, int, float], None] | None = None,
) -> _T:
    """Run ``attempt(number, remaining_budget)`` until it succeeds or may not be repeated.

    The last error is raised as is, with a note saying why retrying stopped.
    """
    started = clock.monotonic()
    number = 0
    while True:
        number += 1
        remaining = policy.budget - (clock.monotonic() - started)
        try:
            return await attempt(number, remaining)
        except ThunderError as error:
            if not is_retryable(error, retry_on):
                raise
            if number >= policy.max_attempts:
                error.add_note(f"gave up after {number} attempts (the policy's maximum)")
                raise
            wait = policy.delay(number, rng, getattr(error, "retry_after", None))
            remaining = policy.budget - (clock.monotonic() - started)
            if wait >= remaining:
                error.add_note(
                    f"gave up after {number} attempts: the {policy.budget:g} s budget is spent"
                )
                raise
            if on_retry is not None:
                on_retry(error, number, wait)
            await clock.sleep(wait)
