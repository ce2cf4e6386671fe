"""The shared probe and metrics server, as the operator and the daemon run it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import pytest
from prometheus_client import Counter

from hack.cluster.launcher import free_port
from thunder_dra.process import health
from thunder_dra.process.health import HealthServer
from thunder_dra.process.metrics import process_registry


async def get(port: int | None, path: str) -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text(), response.headers.get("Content-Type", "")


@pytest.fixture
async def servers() -> AsyncIterator[list[HealthServer]]:
    started: list[HealthServer] = []
    yield started
    for server in started:
        await server.stop()


async def start(
    servers: list[HealthServer],
    missing: Callable[[], Sequence[str]] = list,
    metrics_port: int | None = None,
) -> HealthServer:
    registry = process_registry()
    Counter("thunder_dra_daemon_test_things", "Things.", registry=registry).inc()
    server = HealthServer(
        host="127.0.0.1", port=0, registry=registry, readiness=missing, metrics_port=metrics_port
    )
    await server.start()
    servers.append(server)
    return server


async def test_probes_and_metrics_on_one_port(servers: list[HealthServer]) -> None:
    server = await start(servers)
    assert server.port
    assert server.port == server.metrics_port
    assert (await get(server.port, "/healthz"))[:2] == (200, "ok\n")
    assert (await get(server.port, "/readyz"))[:2] == (200, "ok\n")
    status, body, content_type = await get(server.port, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    assert "thunder_dra_daemon_test_things_total 1.0" in body
    assert "process_resident_memory_bytes" in body


async def test_readiness_names_what_is_missing(servers: list[HealthServer]) -> None:
    missing = ["not registered with the kubelet", "node not enrolled with Thunder"]
    server = await start(servers, lambda: missing)
    status, body, _ = await get(server.port, "/readyz")
    assert (status, body) == (
        503,
        "not ready: not registered with the kubelet; node not enrolled with Thunder\n",
    )
    missing.clear()
    assert (await get(server.port, "/readyz"))[0] == 200


async def test_a_failing_readiness_check_is_not_ready(servers: list[HealthServer]) -> None:
    def broken() -> list[str]:
        raise KeyError("webhook")

    server = await start(servers, broken)
    status, body, _ = await get(server.port, "/readyz")
    assert status == 503
    assert "readiness check failed: KeyError" in body


async def test_a_separate_metrics_port_serves_only_metrics(servers: list[HealthServer]) -> None:
    server = await start(servers, metrics_port=free_port())
    assert server.metrics_port
    assert server.metrics_port != server.port
    assert (await get(server.metrics_port, "/metrics"))[0] == 200
    assert (await get(server.metrics_port, "/healthz"))[0] == 404
    assert (await get(server.port, "/metrics"))[0] == 404
    assert (await get(server.port, "/healthz"))[0] == 200


async def test_liveness_fails_once_the_heartbeat_is_stale(
    servers: list[HealthServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The heartbeat stamps once at start and not again; anything older than "stale" fails.
    monkeypatch.setattr(health, "HEARTBEAT_INTERVAL", 3600.0)
    server = await start(servers)
    assert (await get(server.port, "/healthz"))[0] == 200
    monkeypatch.setattr(health, "HEARTBEAT_STALE", -1.0)
    status, body, _ = await get(server.port, "/healthz")
    assert status == 503
    assert body.startswith("event loop stalled for ")


async def test_stop_closes_the_listener(servers: list[HealthServer]) -> None:
    server = await start(servers)
    port = server.port
    await server.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(port, "/healthz")
