"""Probes and metrics over HTTP: `/healthz`, `/readyz` and `/metrics`.

- `/healthz` answers 200 while the event loop answers at all: the server runs on the
  operator's own loop, so a blocked loop fails the probe and the kubelet restarts the
  process. kopf's own failures end the process, which the kubelet sees anyway.
- `/readyz` answers 200 once kopf has started (and the webhook server is listening,
  when enabled). A replica paused by peering is ready: it still serves the webhook.
- `/metrics` is the Prometheus text format of the operator's registry.

Health and metrics may share a port; then one server serves all three paths.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

ReadyCheck = Callable[[], tuple[bool, str]]


class HealthServer:
    """The probe and metrics listeners of the operator."""

    def __init__(
        self,
        *,
        host: str,
        health_port: int,
        metrics_port: int,
        registry: CollectorRegistry,
        ready: ReadyCheck,
    ) -> None:
        self._host = host
        self._health_port = health_port
        self._metrics_port = metrics_port
        self._registry = registry
        self._ready = ready
        self._runners: list[web.AppRunner] = []

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, detail = self._ready()
        return web.Response(text=f"{detail}\n", status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        health_routes = [web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)]
        metrics_routes = [web.get("/metrics", self._metrics)]
        if self._health_port == self._metrics_port:
            await self._serve(self._health_port, health_routes + metrics_routes)
            return
        await self._serve(self._health_port, health_routes)
        if self._metrics_port:
            await self._serve(self._metrics_port, metrics_routes)

    async def _serve(self, port: int, routes: list[web.RouteDef]) -> None:
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self._host, port).start()
        self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
