"""``/healthz``, ``/readyz`` and ``/metrics`` over HTTP (aiohttp), for probes and Prometheus.

- ``/healthz``: the process is alive and its event loop responsive (a heartbeat task
  must have run recently: a loop blocked by a stuck call fails the probe);
- ``/readyz``: registered with the kubelet and, on a serving node, enrolled with
  Thunder with thunderd healthy; the body says what is missing;
- ``/metrics``: the daemon's registry in the Prometheus text format.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_STALE = 10.0

log = logging.getLogger(__name__)


class HealthServer:
    def __init__(
        self,
        *,
        address: str,
        port: int,
        registry: CollectorRegistry,
        readiness: Callable[[], list[str]],
    ) -> None:
        self._address = address
        self._port = port
        self._registry = registry
        self._readiness = readiness
        self._beat = time.monotonic()
        self._runner: web.AppRunner | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._address, self._port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="health-heartbeat")
        log.info("health server listening", extra={"address": self._address, "port": self.port})

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

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
        missing = self._readiness()
        if missing:
            return web.Response(status=503, text="not ready: " + "; ".join(missing) + "\n")
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response
