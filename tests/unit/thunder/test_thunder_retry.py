"""Retries: which calls repeat on what, jittered backoff, attempt caps and time budgets.

A fake clock advances only when the client sleeps (or when a handler says a request took
time), so these tests never wait and never measure wall-clock time.
"""

from __future__ import annotations

import base64
import json
import logging
import random

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.unit.thunder.conftest import MakeClient
from tests.unit.thunder.doubles import API_TOKEN, FakeClock, respond, sequence
from thunder_dra.thunder import (
    EXCHANGE_RETRY,
    BadRequest,
    Forbidden,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServerError,
    ThunderTransportError,
    Unauthorized,
)

MINTED = {"enrollmentTokenId": "et-1", "enrollmentToken": "tr_retry-secret", "role": "client"}
CLAIMS = {"orgId": "o", "clientId": "c", "gpuType": "H100", "gpuCount": 1}
JWT = "h." + base64.urlsafe_b64encode(json.dumps(CLAIMS).encode()).decode().rstrip("=") + ".s"
EXCHANGED = {"authToken": "tca_x", "jwt": JWT}


def ceilings(policy: RetryPolicy, count: int) -> list[float]:
    return [min(policy.max_backoff, policy.initial_backoff * 2**n) for n in range(count)]


def assert_jittered_backoff(sleeps: list[float], policy: RetryPolicy) -> None:
    for wait, ceiling in zip(sleeps, ceilings(policy, len(sleeps)), strict=True):
        assert ceiling / 2 <= wait <= ceiling


async def test_reads_retry_5xx_429_and_transport_errors(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, recorder = make_client(
        sequence(
            respond(503, b"busy"),
            respond(429, b""),
            httpx.ReadTimeout("slow"),
            httpx.ConnectError("refused"),
            respond(200, {"zones": []}),
        )
    )
    assert await client.list_zones() == []
    assert len(recorder.requests) == 5
    assert_jittered_backoff(clock.sleeps, RetryPolicy())


async def test_permanent_errors_are_not_retried(make_client: MakeClient) -> None:
    client, recorder = make_client(sequence(respond(400, b"bad"), respond(200, {"zones": []})))
    with pytest.raises(BadRequest, match="400"):
        await client.list_zones()
    assert len(recorder.requests) == 1


async def test_attempts_are_capped(make_client: MakeClient, clock: FakeClock) -> None:
    client, recorder = make_client(
        sequence(respond(500, b"down")), retry=RetryPolicy(max_attempts=3, budget=600)
    )
    with pytest.raises(ServerError) as caught:
        await client.list_hosts()
    assert len(recorder.requests) == 3
    assert len(clock.sleeps) == 2
    assert any("gave up after 3 attempts" in note for note in caught.value.__notes__)


async def test_budget_stops_retrying(make_client: MakeClient, clock: FakeClock) -> None:
    policy = RetryPolicy(max_attempts=100, initial_backoff=0.5, max_backoff=8, budget=10)
    client, recorder = make_client(sequence(respond(502, b"")), retry=policy)
    with pytest.raises(ServerError) as caught:
        await client.list_clients()
    assert clock.now < 10
    assert 3 <= len(recorder.requests) < 100
    assert any("budget is spent" in note for note in caught.value.__notes__)


async def test_retry_after_is_honoured_up_to_the_cap(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, _ = make_client(
        sequence(
            respond(429, b"", headers={"Retry-After": "3"}),
            respond(429, b"", headers={"Retry-After": "3600"}),
            respond(200, {"zones": []}),
        )
    )
    await client.list_zones()
    assert clock.sleeps[0] >= 3
    assert clock.sleeps[1] == 8


async def test_revocations_retry_like_reads(make_client: MakeClient) -> None:
    client, recorder = make_client(
        sequence(httpx.ReadTimeout("lost"), respond(503, b""), respond(404, b""))
    )
    result = await client.unenroll("et-1")
    assert result.already_gone
    assert len(recorder.requests) == 3


# Mint: only 429, or failures before the request left the node.


@pytest.mark.parametrize(
    "failure",
    [respond(500, b"minted?"), respond(503, b""), httpx.ReadTimeout("lost answer")],
    ids=["500", "503", "read-timeout"],
)
async def test_mint_is_not_repeated_when_the_answer_may_be_lost(
    make_client: MakeClient, failure: httpx.Response | Exception
) -> None:
    client, recorder = make_client(sequence(failure, respond(200, MINTED)))
    with pytest.raises((ServerError, ThunderTransportError)):
        await client.mint_client_token("z", "H100", 1)
    assert len(recorder.requests) == 1


@pytest.mark.parametrize(
    "failure",
    [respond(429, b""), httpx.ConnectError("refused"), httpx.ConnectTimeout("no route")],
    ids=["429", "connect-error", "connect-timeout"],
)
async def test_mint_is_retried_when_nothing_was_minted(
    make_client: MakeClient, failure: httpx.Response | Exception
) -> None:
    client, recorder = make_client(sequence(failure, respond(200, MINTED)))
    minted = await client.mint_server_token("z")
    assert minted.enrollment_token_id == "et-1"
    assert len(recorder.requests) == 2


# Exchange: 429 and 5xx only, 5 attempts, 0.5 s doubling to 8 s, 90 s in all.


def test_exchange_policy_matches_the_contract() -> None:
    assert (
        RetryPolicy(max_attempts=5, initial_backoff=0.5, max_backoff=8.0, budget=90.0)
        == EXCHANGE_RETRY
    )


async def test_exchange_retries_5xx_at_most_five_times(
    make_client: MakeClient, clock: FakeClock
) -> None:
    client, recorder = make_client(sequence(respond(503, b"")))
    with pytest.raises(ServerError) as caught:
        await client.exchange("tr_enrollment")
    assert len(recorder.requests) == 5
    assert_jittered_backoff(clock.sleeps, EXCHANGE_RETRY)
    assert any("5 attempts" in note for note in caught.value.__notes__)


async def test_exchange_retries_429_then_succeeds(make_client: MakeClient) -> None:
    client, recorder = make_client(sequence(respond(429, b""), respond(200, EXCHANGED)))
    assert (await client.exchange("tr_enrollment")).claims.client_id == "c"
    assert len(recorder.requests) == 2


@pytest.mark.parametrize(
    "failure",
    [
        respond(403, {"error": "enrollment token already used"}),
        respond(401, b""),
        respond(404, b""),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("lost"),
    ],
    ids=["403", "401", "404", "connect-error", "read-timeout"],
)
async def test_exchange_does_not_retry_anything_else(
    make_client: MakeClient, failure: httpx.Response | Exception
) -> None:
    client, recorder = make_client(sequence(failure, respond(200, EXCHANGED)))
    with pytest.raises((Forbidden, NotFound, Unauthorized, ThunderTransportError)):
        await client.exchange("tr_enrollment")
    assert len(recorder.requests) == 1


async def test_exchange_stays_within_ninety_seconds(
    make_client: MakeClient, clock: FakeClock
) -> None:
    timeouts: list[float] = []

    def slow_failure(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        clock.now += 40
        return httpx.Response(502)

    client, recorder = make_client(slow_failure)
    with pytest.raises(ServerError):
        await client.exchange("tr_enrollment")
    assert clock.now <= 90 + 40
    assert len(recorder.requests) < 5
    # Each attempt's timeouts shrink to what is left of the budget.
    assert timeouts[0] == 30
    assert all(later <= 90 - 40 * i for i, later in enumerate(timeouts[1:], start=1))


async def test_retries_are_counted_and_logged_without_secrets(
    make_client: MakeClient, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = make_client(sequence(respond(429, b""), respond(200, {"zones": []})))
    with caplog.at_level(logging.WARNING, logger="thunder_dra.thunder"):
        await client.list_zones()
    labels = {"method": "GET", "endpoint": "/api/v1/zones", "reason": "429"}
    assert registry.get_sample_value("thunder_dra_thunder_api_retries_total", labels) == 1
    assert "retrying" in caplog.text
    assert API_TOKEN not in caplog.text
    record = next(r for r in caplog.records if "retrying" in r.getMessage())
    assert record.__dict__["endpoint"] == "/api/v1/zones"


def test_jitter_spreads_clients_apart() -> None:
    policy = RetryPolicy()
    waits = {policy.delay(3, random.Random(seed), None) for seed in range(20)}
    assert len(waits) > 10
    assert all(1.0 <= w <= 2.0 for w in waits)


@pytest.mark.parametrize(
    "arguments",
    [{"max_attempts": 0}, {"initial_backoff": 9, "max_backoff": 8}, {"budget": 0}],
)
def test_policy_validation(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        RetryPolicy(**arguments)  # type: ignore[arg-type]


async def test_rate_limited_error_carries_retry_after(make_client: MakeClient) -> None:
    client, _ = make_client(
        sequence(respond(429, b"", headers={"Retry-After": "7"})), retry=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(RateLimited) as caught:
        await client.list_zones()
    assert caught.value.retry_after == 7
