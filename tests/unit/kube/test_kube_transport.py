"""The aiohttp transport against an HTTP server on loopback: what goes on the wire, the
credentials it sends, timeouts, refused connections and closing."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes.aio.client import Configuration
from kubernetes.aio.config import ConfigException

from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import NotFound, Timeout, Unavailable
from thunder_dra.kube.resources import CLIENTS, RESOURCE_SLICES
from thunder_dra.kube.transport import AiohttpTransport, build_client, load_configuration

TOKEN = "token-under-test"


@dataclass
class Seen:
    requests: list[dict[str, object]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, Seen]]:
    seen = Seen()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.requests.append(
            {
                "method": request.method,
                "path": request.raw_path,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        if request.path.endswith("/slow"):
            await seen.release.wait()
        if request.path.endswith("/missing"):
            status = {
                "kind": "Status",
                "reason": "NotFound",
                "message": 'nodes "missing" not found',
            }
            return web.json_response(status, status=404)
        # A cookie, as a load balancer in front of the API server may set one.
        return web.json_response(
            {"kind": "Thing", "metadata": {"name": "x"}}, headers={"Set-Cookie": "lb=a; Path=/"}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        seen.release.set()
        await runner.cleanup()


def _configuration(host: str) -> Configuration:
    configuration = Configuration()
    configuration.host = host
    configuration.api_key["BearerToken"] = TOKEN
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    return configuration


def _kube(host: str, timeout: float = 20.0) -> KubeClient:
    transport = AiohttpTransport(configuration=_configuration(host), user_agent="thunder-test/1")
    return KubeClient(transport, timeout=timeout)


async def test_requests_carry_the_token_user_agent_query_and_body(
    apiserver: tuple[str, Seen],
) -> None:
    host, seen = apiserver
    async with _kube(host) as kube:
        await kube.list_pages(
            RESOURCE_SLICES.collection(), label_selector="a=b,c!=d", limit=5
        ).__anext__()
        await kube.merge_patch(CLIENTS.item("c 1", "ns", "status"), {"status": {"x": 1}})
    listing, patch = seen.requests
    assert listing["method"] == "GET"
    assert listing["path"] == (
        "/apis/resource.k8s.io/v1/resourceslices?limit=5&labelSelector=a%3Db%2Cc%21%3Dd"
    )
    headers = listing["headers"]
    assert isinstance(headers, dict)
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["User-Agent"] == "thunder-test/1"
    assert headers["Accept"] == "application/json"
    assert "Content-Type" not in headers
    assert patch["path"] == "/apis/thundercompute.com/v1alpha1/namespaces/ns/clients/c%201/status"
    patch_headers = patch["headers"]
    assert isinstance(patch_headers, dict)
    assert patch_headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch["body"]) == {"status": {"x": 1}}  # type: ignore[arg-type]


async def test_a_cookie_an_answer_sets_is_never_sent_back(apiserver: tuple[str, Seen]) -> None:
    host, seen = apiserver
    # By a host name: a cookie jar takes no cookie from an IP address.
    async with _kube(host.replace("127.0.0.1", "localhost")) as kube:
        for _ in range(3):
            await kube.get(CLIENTS.item("c", "ns"))
    headers = [r["headers"] for r in seen.requests]
    assert [h.get("Cookie") for h in headers if isinstance(h, dict)] == [None, None, None]


async def test_the_apiservers_answer_becomes_the_error_without_the_token(
    apiserver: tuple[str, Seen],
) -> None:
    host, _seen = apiserver
    async with _kube(host) as kube:
        with pytest.raises(NotFound) as caught:
            await kube.get("/api/v1/nodes/missing")
    assert caught.value.message == 'nodes "missing" not found'
    assert TOKEN not in str(caught.value)
    assert TOKEN not in repr(caught.value)


async def test_a_slow_answer_times_out_and_the_client_still_works(
    apiserver: tuple[str, Seen],
) -> None:
    host, _seen = apiserver
    async with _kube(host, timeout=0.2) as kube:
        with pytest.raises(Timeout):
            await kube.get("/api/v1/nodes/slow")
        assert (await kube.get("/api/v1/nodes/fast"))["kind"] == "Thing"


async def test_cancelling_a_call_in_flight_cancels_it(apiserver: tuple[str, Seen]) -> None:
    host, seen = apiserver
    async with _kube(host, timeout=3600) as kube:
        task = asyncio.create_task(kube.get("/api/v1/nodes/slow"))
        while not seen.requests:  # noqa: ASYNC110 - the server is in this loop
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await kube.get("/api/v1/nodes/fast"))["kind"] == "Thing"


async def test_a_refused_connection_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with _kube(f"http://127.0.0.1:{port}") as kube:
        with pytest.raises(Unavailable) as caught:
            await kube.get("/api/v1/nodes/n")
    assert caught.value.status is None
    assert caught.value.retryable


async def test_closing_releases_the_session_and_refuses_further_calls(
    apiserver: tuple[str, Seen],
) -> None:
    host, _seen = apiserver
    transport = AiohttpTransport(configuration=_configuration(host), user_agent="t")
    kube = KubeClient(transport)
    await kube.get("/api/v1/nodes/fast")
    session = transport._session
    assert session is not None
    await kube.close()
    assert session.closed
    with pytest.raises(Unavailable, match="closed"):
        await kube.get("/api/v1/nodes/fast")


async def test_a_kubeconfig_is_loaded_on_open_and_a_bad_one_fails_there(
    apiserver: tuple[str, Seen], tmp_path: Path
) -> None:
    host, seen = apiserver
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": host}}],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    configuration = await load_configuration(kubeconfig)
    assert configuration.host == host
    async with build_client(kubeconfig, user_agent="t", timeout=5) as kube:
        await kube.open()
        await kube.get("/api/v1/nodes/fast")
    headers = seen.requests[0]["headers"]
    assert isinstance(headers, dict)
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\n")
    async with build_client(broken, user_agent="t") as kube:
        with pytest.raises(ConfigException, match="current-context"):
            await kube.open()
