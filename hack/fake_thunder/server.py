"""Serves a :class:`FakeThunder` over HTTP with aiohttp (concurrent requests, one loop)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from hack.fake_thunder.messages import FakeRequest
from hack.fake_thunder.service import FakeThunder


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass
class RunningServer:
    runner: web.AppRunner
    base_url: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(
    service: FakeThunder,
    host: str,
    port: int,
    tls: tuple[Path, Path] | None = None,
) -> RunningServer:
    """Listen on ``host:port`` (0 = any free port) and return the base URL actually bound.

    With ``tls`` (certificate and key files) it serves https, e.g. to reach it from pods,
    where the driver refuses plain http to anything but loopback."""

    async def handle(request: web.Request) -> web.StreamResponse:
        fake = FakeRequest(
            method=request.method,
            path=request.path,
            query={key: request.query[key] for key in request.query},
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
            base_url=f"{request.scheme}://{request.host}",
        )
        answer = await service.handle(fake)
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    scheme = "https" if context else "http"
    return RunningServer(runner, f"{scheme}://{_url_host(bound_host)}:{bound_port}")
