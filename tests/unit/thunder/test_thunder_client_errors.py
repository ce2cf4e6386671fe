"""Client failures against httpx.MockTransport: every error class, malformed and oversized
answers, transport errors; and the metrics and spans each request leaves."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.unit.thunder.conftest import MakeClient
from tests.unit.thunder.doubles import API_TOKEN, respond, sequence
from thunder_dra.thunder import (
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServerError,
    ThunderAPIError,
    ThunderClient,
    ThunderResponseError,
    ThunderTransportError,
    Unauthorized,
)

NO_RETRY = RetryPolicy(max_attempts=1)


# Errors


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (422, BadRequest),
        (429, RateLimited),
        (500, ServerError),
        (503, ServerError),
    ],
)
async def test_every_error_class(
    make_client: MakeClient, status: int, expected: type[ThunderAPIError]
) -> None:
    body = {"error": "SomeError", "message": "the server says why"}
    client, _ = make_client(sequence(respond(status, body)), retry=NO_RETRY)
    with pytest.raises(expected) as caught:
        await client.list_hosts("z1")
    error = caught.value
    assert type(error) is expected
    assert (error.method, error.path, error.status) == ("GET", "/api/v1/hosts", status)
    assert "the server says why" in str(error)
    assert "SomeError" in str(error)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list, expected an object"),
        (b"", "body is empty"),
        (b'{"zones": [{"displayName": "a"}]}', "zones.0.zoneId"),
        (b'{"zones": [{"zoneId": 5, "displayName": "a"}]}', "zones.0.zoneId"),
        (b'{"regions": []}', "'zones'"),
    ],
)
async def test_malformed_answers_give_clear_errors(
    make_client: MakeClient, body: bytes, problem: str
) -> None:
    client, _ = make_client(sequence(respond(200, body)))
    with pytest.raises(ThunderResponseError, match=problem) as caught:
        await client.list_zones()
    assert "GET /api/v1/zones" in str(caught.value)


async def test_oversized_declared_body_is_refused(make_client: MakeClient) -> None:
    client, _ = make_client(
        sequence(respond(200, b"{}", headers={"Content-Length": "99999999"})),
        max_response_bytes=1024,
    )
    with pytest.raises(ThunderResponseError, match="exceeds the 1024-byte limit"):
        await client.list_zones()


async def test_endless_body_is_cut_off_not_loaded(make_client: MakeClient) -> None:
    produced = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal produced
        while True:
            produced += 1
            yield b" " * 4096

    client, _ = make_client(
        lambda request: httpx.Response(200, content=endless()), max_response_bytes=64 * 1024
    )
    with pytest.raises(ThunderResponseError, match="limit"):
        await client.list_zones()
    assert produced <= 17


async def test_transport_failures(make_client: MakeClient) -> None:
    refused = httpx.ConnectError("connection refused")
    client, _ = make_client(sequence(refused), retry=NO_RETRY)
    with pytest.raises(ThunderTransportError, match="never left the node") as caught:
        await client.list_zones()
    assert caught.value.request_sent is False

    timeout = httpx.ReadTimeout("read timed out")
    client, _ = make_client(sequence(timeout), retry=NO_RETRY)
    with pytest.raises(ThunderTransportError) as caught:
        await client.unenroll("et-1")
    assert caught.value.request_sent
    assert caught.value.timed_out


# Telemetry


async def test_metrics_and_spans(make_client: MakeClient, registry: CollectorRegistry) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client, _ = make_client(
        sequence(respond(200, {"zones": []}), respond(404, b"")),
        tracer_provider=provider,
        retry=NO_RETRY,
    )
    await client.list_zones()
    await client.unenroll("et-secret-id")

    def count(method: str, endpoint: str, status: str) -> float | None:
        labels = {"method": method, "endpoint": endpoint, "status": status}
        return registry.get_sample_value("thunder_dra_thunder_api_requests_total", labels)

    assert count("GET", "/api/v1/zones", "200") == 1
    template = "/api/v1/enrollment-tokens/{enrollmentTokenId}/node"
    assert count("DELETE", template, "404") == 1
    latency = registry.get_sample_value(
        "thunder_dra_thunder_api_request_duration_seconds_count",
        {"method": "GET", "endpoint": "/api/v1/zones"},
    )
    assert latency == 1

    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["GET /api/v1/zones", f"DELETE {template}"]
    assert spans[0].attributes is not None
    assert spans[0].attributes["http.response.status_code"] == 200
    for span in spans:
        rendered = json.dumps(dict(span.attributes or {}))
        assert "et-secret-id" not in rendered
        assert API_TOKEN not in rendered


def test_two_clients_share_one_registry() -> None:
    shared = CollectorRegistry()
    ThunderClient(api_token="a", component="operator", registry=shared)
    ThunderClient(api_token="b", component="daemon", registry=shared)
