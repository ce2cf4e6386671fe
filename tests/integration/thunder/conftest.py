"""Fixtures starting the fake Thunder service as a real process (OS-chosen port), shared by
a module and reset before every test, plus clients and fake host directories."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hack.fake_host import FakeHost
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from thunder_dra.thunder import RetryPolicy, ThunderClient

API_TOKEN = "tcapi_it_Process-Secret-API-token-0001"
# Quick retries: these tests talk to a local process and never assert durations.
FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, budget=10)


@pytest.fixture(scope="module")
def fake_thunder_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeThunderProcess]:
    log_path = tmp_path_factory.mktemp("fake-thunder") / "fake-thunder.log"
    with start_fake_thunder(tokens=[API_TOKEN], log_path=log_path) as process:
        yield process


@pytest.fixture
def fake_thunder(fake_thunder_process: FakeThunderProcess) -> FakeThunderProcess:
    fake_thunder_process.admin.reset()
    return fake_thunder_process


def make_client(
    fake: FakeThunderProcess,
    *,
    component: str = "daemon",
    token: str = API_TOKEN,
    **options: object,
) -> ThunderClient:
    options.setdefault("retry", FAST_RETRY)
    options.setdefault("exchange_retry", FAST_RETRY)
    return ThunderClient(
        api_token=token,
        component=component,
        base_url=fake.base_url,
        registry=CollectorRegistry(),
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
async def client(fake_thunder: FakeThunderProcess) -> AsyncIterator[ThunderClient]:
    async with make_client(fake_thunder) as thunder:
        yield thunder


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    host = FakeHost(tmp_path / "node-a")
    host.root.mkdir()
    return host
