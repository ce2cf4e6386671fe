"""Fixtures for the Thunder client's unit tests: a fake clock, recorded mock transports,
clients wired to them, and an in-process fake Thunder service."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from hack.fake_thunder import AsyncFakeThunderAdmin, FakeThunder
from tests.unit.thunder.doubles import API_TOKEN, BASE_URL, FakeClock, Recorder
from thunder_dra.thunder import RetryPolicy, ThunderClient

MakeClient = Callable[..., tuple[ThunderClient, Recorder]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def make_client(clock: FakeClock, registry: CollectorRegistry) -> AsyncIterator[MakeClient]:
    """``make_client(answer, **options)`` -> (client, recorder); clients closed afterwards."""
    made: list[ThunderClient] = []

    def make(
        answer: Callable[[httpx.Request], httpx.Response], **options: Any
    ) -> tuple[ThunderClient, Recorder]:
        recorder = Recorder(answer)
        options.setdefault("retry", RetryPolicy(max_attempts=5, budget=60.0))
        client = ThunderClient(
            api_token=options.pop("api_token", API_TOKEN),
            component=options.pop("component", "daemon"),
            base_url=options.pop("base_url", BASE_URL),
            transport=httpx.MockTransport(recorder),
            clock=clock,
            rng=random.Random(7),
            registry=registry,
            **options,
        )
        made.append(client)
        return client, recorder

    yield make
    for client in made:
        await client.aclose()


@pytest.fixture
def fake() -> FakeThunder:
    return FakeThunder(api_tokens=[API_TOKEN])


@pytest.fixture
async def fake_client(
    fake: FakeThunder, clock: FakeClock, registry: CollectorRegistry
) -> AsyncIterator[ThunderClient]:
    async with ThunderClient(
        api_token=API_TOKEN,
        component="daemon",
        base_url="http://fake-thunder",
        transport=fake.transport(),
        clock=clock,
        rng=random.Random(7),
        registry=registry,
    ) as client:
        yield client


@pytest.fixture
async def admin(fake: FakeThunder) -> AsyncIterator[AsyncFakeThunderAdmin]:
    client = AsyncFakeThunderAdmin("http://fake-thunder", transport=fake.transport())
    yield client
    await client.aclose()
