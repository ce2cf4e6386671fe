"""The Thunder client over `AiohttpTransport` against a loopback aiohttp server: answers,
headers and kept-alive connections; HTTP errors, oversized bodies, refused connections
and slow answers fail as they do over httpx's own transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from thunder_dra.thunder import (
    RetryPolicy,
    ServerError,
    ThunderClient,
    ThunderResponseError,
    ThunderTransportError,
)
from thunder_dra.thunder.aiotransport import AiohttpTransport

pytestmark = pytest.mark.unit

TOKEN = "tcapi_transport-test-token-0000"
NO_RETRY = RetryPolicy(max_attempts=1)
ZONES = {"zones": [{"zoneId": "z-1", "displayName": "one"}]}


class Server:
    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""
        # A slow answer waits for this, set when the server stops (never answered in time).
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            self.peers.append((peer[0], peer[1]))
        self.headers.append(dict(request.headers))
        if request.path == "/api/v1/zones":
            # A cookie, as a load balancer in front of Thunder may set one.
            return web.json_response(ZONES, headers={"Set-Cookie": "lb=node-2; Path=/"})
        if request.path == "/api/v1/hosts":
            return web.json_response({"hosts": [], "pad": "x" * 4096})
        if request.path == "/api/v1/clients":
            await self.release.wait()
            return web.json_response({"clients": []})
        return web.json_response({"error": "boom"}, status=503, reason="Overloaded")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    yield state
    state.release.set()
    await runner.cleanup()


def _client(url: str, **options: object) -> ThunderClient:
    return ThunderClient(
        api_token=TOKEN,
        component="operator",
        base_url=url,
        transport=AiohttpTransport(pool_size=2),
        retry=NO_RETRY,
        registry=CollectorRegistry(),
        **options,  # type: ignore[arg-type]
    )


async def test_answers_arrive_with_the_client_headers_over_one_kept_alive_connection(
    server: Server,
) -> None:
    async with _client(server.url) as client:
        for _ in range(5):
            zones = await client.list_zones()
            assert [z.zone_id for z in zones] == ["z-1"]
    assert len(server.peers) == 5
    assert len(set(server.peers)) == 1
    headers = server.headers[0]
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["User-Agent"].startswith("thunder-device-plugin/")
    assert headers["Accept"] == "application/json"


async def test_a_cookie_an_answer_sets_is_never_sent_back(server: Server) -> None:
    # By a host name: a cookie jar takes no cookie from an IP address (docs/thunder-api.md
    # section 1, "Cookies").
    async with _client(server.url.replace("127.0.0.1", "localhost")) as client:
        for _ in range(3):
            await client.list_zones()
    assert [headers.get("Cookie") for headers in server.headers] == [None, None, None]


async def test_an_error_status_is_the_api_error_with_its_status(server: Server) -> None:
    async with _client(server.url) as client:
        with pytest.raises(ServerError) as caught:
            await client.get_oversubscription_targets("z-1")
    assert caught.value.status == 503


async def test_an_oversized_body_is_refused_and_the_connection_not_reused(
    server: Server,
) -> None:
    async with _client(server.url, max_response_bytes=1024) as client:
        with pytest.raises(ThunderResponseError, match="exceeds the 1024-byte limit"):
            await client.list_hosts("z-1")
        assert [z.zone_id for z in await client.list_zones()] == ["z-1"]


async def test_a_refused_connection_never_left_the_node() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with _client(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(ThunderTransportError) as caught:
            await client.list_zones()
    assert caught.value.request_sent is False
    assert caught.value.timed_out is False


async def test_a_slow_answer_times_out(server: Server) -> None:
    async with _client(server.url, timeout=0.3) as client:
        with pytest.raises(ThunderTransportError) as caught:
            await client.list_clients("z-1")
    assert caught.value.timed_out is True
    assert caught.value.request_sent is True


def test_the_pool_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        AiohttpTransport(pool_size=0)
