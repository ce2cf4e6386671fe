"""Serves a :class:`FakeThunder` over HTTP with aiohttp (concurrent requests, one loop)."""

from __future__ import annotations

from dataclasses import dataclass

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


async def start_server(service: FakeThunder, host: str, port: int) -> RunningServer:
    """Listen on ``host:port`` (0 = any free port) and return the base URL actually bound."""

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
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return RunningServer(runner, f"http://{_url_host(bound_host)}:{bound_port}")
