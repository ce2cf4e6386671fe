"""`/healthz`, `/readyz` and `/metrics` over HTTP, the same for the operator and the daemon.

- `/healthz` (liveness): 200 `ok` while the event loop is responsive. The server runs on
  the process's own loop and a heartbeat task stamps the time every second; a loop that
  was blocked for more than `HEARTBEAT_STALE` seconds answers 503, and one that is
  blocked does not answer at all, so the kubelet restarts the process either way.
- `/readyz` (readiness): 200 `ok` when the process's readiness check reports nothing
  missing, else 503 `not ready: <what is missing>; ...`.
- `/metrics`: the process's registry in the Prometheus text format.

The probes and the metrics share one listener unless a separate metrics port is given.
Port 0 picks a free port; `port` and `metrics_port` say which once started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

from aiohttp import web
from prometheus_client import CollectorRegistry

from thunder_dra.process.metrics import exposition

HEARTBEAT_INTERVAL: Final = 1.0
HEARTBEAT_STALE: Final = 10.0
HEALTHZ: Final = "/healthz"
READYZ: Final = "/readyz"
METRICS: Final = "/metrics"

# What is missing before the process is ready; empty when ready.
Readiness = Callable[[], Sequence[str]]

_log = logging.getLogger(__name__)


class HealthServer:
    """The probe and metrics listeners of one process."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        readiness: Readiness,
        metrics_port: int | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._metrics_port = None if metrics_port == port else metrics_port
        self._registry = registry
        self._readiness = readiness
        self._beat = time.monotonic()
        self._runners: list[web.AppRunner] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None

    async def start(self) -> None:
        probes = [web.get(HEALTHZ, self._healthz), web.get(READYZ, self._readyz)]
        metrics = [web.get(METRICS, self._metrics)]
        self._beat = time.monotonic()
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="health-heartbeat")
        if self._metrics_port is None:
            self.port = self.metrics_port = await self._serve(self._port, probes + metrics)
        else:
            self.port = await self._serve(self._port, probes)
            self.metrics_port = await self._serve(self._metrics_port, metrics)
        _log.info(
            "health server listening",
            extra={"address": self._host, "port": self.port, "metrics_port": self.metrics_port},
        )

    async def _serve(self, port: int, routes: Sequence[web.RouteDef]) -> int:
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self._host, port)
        await site.start()
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                return int(address[1])
        return port

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_INTERVAL)

    async def _healthz(self, request: web.Request) -> web.Response:
        lag = time.monotonic() - self._beat
        if lag > HEARTBEAT_STALE:
            return web.Response(status=503, text=f"event loop stalled for {lag:.1f}s\n")
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            missing = list(self._readiness())
        except Exception as exc:
            missing = [f"readiness check failed: {type(exc).__name__}: {exc}"]
        if missing:
            return web.Response(status=503, text="not ready: " + "; ".join(missing) + "\n")
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = exposition(self._registry)
        return web.Response(body=body, headers={"Content-Type": content_type})
