"""Every endpoint of the client against httpx.MockTransport: requests sent, answers parsed,
errors raised."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.unit.thunder.conftest import MakeClient
from tests.unit.thunder.doubles import API_TOKEN, respond, sequence
from thunder_dra.thunder import (
    Forbidden,
    RetryPolicy,
    Secret,
    ThunderAPIError,
    ThunderClient,
    ThunderResponseError,
)
from thunder_dra.version import user_agent

ENROLLMENT_TOKEN = "tr_unit-enrollment-Secret-0002"
AUTH_TOKEN = "tca_unit-auth-Secret-0003"
NO_RETRY = RetryPolicy(max_attempts=1)
CLAIMS = {"orgId": "org-1", "clientId": "cl-1", "gpuType": "H100", "gpuCount": 2}


def jwt_for(payload: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJIUzI1NiJ9.{body}.c2ln"


def by_path(routes: dict[tuple[str, str], httpx.Response]) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        return routes.get((request.method, request.url.path), httpx.Response(404))

    return answer


async def test_headers_auth_and_user_agent(make_client: MakeClient) -> None:
    client, recorder = make_client(
        sequence(respond(200, {"zones": []})), api_token=f"  {API_TOKEN}\n", component="operator"
    )
    await client.list_zones()
    request = recorder.last
    assert request.headers["authorization"] == f"Bearer {API_TOKEN}"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"] == user_agent("operator")
    assert "content-type" not in request.headers
    assert str(request.url) == "https://thunder.test/api/v1/zones"


async def test_the_answer_sets_no_state_and_moves_no_request(make_client: MakeClient) -> None:
    """Each request carries exactly what the client sets: a cookie Thunder (or anything
    in the middle) sets is not sent back, and a redirect is an error, never followed."""
    client, recorder = make_client(
        sequence(
            respond(200, {"zones": []}, headers={"set-cookie": "session=abc; Path=/"}),
            respond(200, {"zones": []}),
            respond(307, b"", headers={"location": "https://elsewhere.test/api/v1/zones"}),
        )
    )
    await client.list_zones()
    await client.list_zones()
    assert "cookie" not in recorder.last.headers
    with pytest.raises(ThunderAPIError):
        await client.list_zones()
    assert {str(r.url) for r in recorder.requests} == {"https://thunder.test/api/v1/zones"}


async def test_bodies_are_json_with_content_type(make_client: MakeClient) -> None:
    client, recorder = make_client(
        sequence(respond(200, {}), respond(200, {"zones": [{"zoneId": "z", "displayName": "a"}]}))
    )
    await client.ensure_zone("a")
    ensure = recorder.requests[0]
    assert ensure.method == "POST"
    assert ensure.url.path == "/api/v1/zones/ensure"
    assert ensure.headers["content-type"] == "application/json"
    assert json.loads(ensure.content) == {"displayName": "a"}


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="empty"):
        ThunderClient(api_token=" \n", component="daemon")
    with pytest.raises(ValueError, match="https://"):
        ThunderClient(api_token="t", component="daemon", base_url="registry.thundercompute.com")
    client = ThunderClient(
        api_token="t", component="daemon", base_url="https://x.test//", registry=CollectorRegistry()
    )
    assert client.base_url == "https://x.test"
    assert "t" not in repr(client).replace("https://x.test", "").replace("ThunderClient", "")


# Zones (thunder-api.md 2.1, 2.2)

ZONES = {
    "zones": [
        {"zoneId": "zone-b", "displayName": "us-east", "nodeCount": 1, "unknown": {"x": 1}},
        {"zoneId": "zone-a", "displayName": "us-east", "createdAt": "2025-01-01T00:00:00Z"},
        {"zoneId": "zone-0", "displayName": "US-EAST"},
    ]
}


async def test_list_and_resolve_zones(make_client: MakeClient) -> None:
    client, _ = make_client(sequence(respond(200, ZONES)))
    zones = await client.list_zones()
    assert [z.zone_id for z in zones] == ["zone-b", "zone-a", "zone-0"]
    assert zones[0].node_count == 1
    assert await client.resolve_zone("us-east") == "zone-a"
    assert await client.resolve_zone("eu-west") is None


@pytest.mark.parametrize(
    "ensure_answer",
    [
        respond(200, {"zoneId": "zone-b", "displayName": "us-east", "orgId": "o"}),
        respond(201, {"zoneId": "zone-b", "displayName": "us-east"}),
        respond(409, {"error": "Conflict", "message": "zone already exists"}),
        respond(200, b""),
    ],
)
async def test_ensure_zone_trusts_the_list_not_the_answer(
    make_client: MakeClient, ensure_answer: httpx.Response
) -> None:
    client, recorder = make_client(
        by_path(
            {
                ("POST", "/api/v1/zones/ensure"): ensure_answer,
                ("GET", "/api/v1/zones"): respond(200, ZONES),
            }
        )
    )
    assert await client.ensure_zone("us-east") == "zone-a"
    assert [r.url.path for r in recorder.requests] == ["/api/v1/zones/ensure", "/api/v1/zones"]


async def test_ensure_zone_missing_from_the_list_is_an_error(make_client: MakeClient) -> None:
    client, _ = make_client(
        by_path(
            {
                ("POST", "/api/v1/zones/ensure"): respond(200, {"zoneId": "z"}),
                ("GET", "/api/v1/zones"): respond(200, {"zones": []}),
            }
        )
    )
    with pytest.raises(ThunderResponseError, match="not in the zone list"):
        await client.ensure_zone("us-east")
    with pytest.raises(ValueError, match="empty"):
        await client.ensure_zone("")


# Hosts and clients (thunder-api.md 2.3, 2.4)


async def test_hosts_are_queried_and_filtered_by_zone(make_client: MakeClient) -> None:
    hosts = {
        "hosts": [
            {"hostId": "h1", "zoneId": "z1", "gpuType": "A6000", "gpuCount": 4, "status": "active"},
            {"serverId": "h2", "zoneId": "z2", "gpuType": "H100", "gpuCount": 8, "status": None},
        ]
    }
    client, recorder = make_client(sequence(respond(200, hosts)))
    only = await client.list_hosts("z1")
    assert recorder.last.url.params["zoneId"] == "z1"
    assert [h.host_id for h in only] == ["h1"]
    every = await client.list_hosts()
    assert "zoneId" not in recorder.last.url.params
    assert [h.host_id for h in every] == ["h1", "h2"]


async def test_clients_are_queried_and_filtered_by_zone(make_client: MakeClient) -> None:
    clients = {
        "clients": [
            {"clientId": "c1", "zoneId": "z1", "decommissionedAt": None},
            {"clientId": "c2", "zoneId": "z1", "decommissionedAt": "2025-01-01T00:00:00Z"},
            {"clientId": "c3", "zoneId": "z2"},
        ]
    }
    client, recorder = make_client(sequence(respond(200, clients)))
    listed = await client.list_clients("z1")
    assert recorder.last.url.params["zoneId"] == "z1"
    assert [(c.client_id, c.live) for c in listed] == [("c1", True), ("c2", False)]


# Targets (thunder-api.md 2.5)


async def test_targets_and_the_one_x_fallback(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "oversubscriptionTargets": [{"gpuType": "H100", "oversubscriptionTarget": 1.5}],
        "defaultOversubscriptionTarget": 2,
    }
    client, recorder = make_client(sequence(respond(200, body)))
    assert await client.oversubscription_target("zone/1", "h100") == 1.5
    assert recorder.last.url.raw_path == b"/api/v1/zones/zone%2F1/oversubscription-targets"
    assert await client.oversubscription_target("z", "A6000") == 2.0

    failing, _ = make_client(sequence(respond(500, b"boom")), retry=NO_RETRY)
    with caplog.at_level(logging.WARNING):
        assert await failing.oversubscription_target("z", "H100") == 1.0
    assert "using 1x" in caplog.text


# Mint (thunder-api.md 2.6)

MINTED = {
    "enrollmentTokenId": "et-1",
    "enrollmentToken": ENROLLMENT_TOKEN,
    "role": "client",
    "expiresAt": None,
    "futureField": [1, 2],
}


async def test_mint_client_and_server_tokens(make_client: MakeClient) -> None:
    client, recorder = make_client(sequence(respond(201, MINTED)))
    minted = await client.mint_client_token("z1", "nvidia-L4", 2)
    assert recorder.last_json() == {
        "zoneId": "z1",
        "role": "client",
        "gpuType": "nvidia-L4",
        "gpuCount": 2,
    }
    assert minted.enrollment_token_id == "et-1"
    assert minted.enrollment_token.reveal() == ENROLLMENT_TOKEN
    await client.mint_server_token("z1", expires_in_seconds=600)
    assert recorder.last_json() == {"zoneId": "z1", "role": "server", "expiresInSeconds": 600}


@pytest.mark.parametrize(("gpu_type", "gpu_count"), [("", 1), ("H100", 0), ("H100", True)])
async def test_mint_rejects_bad_arguments_before_sending(
    make_client: MakeClient, gpu_type: str, gpu_count: int
) -> None:
    client, recorder = make_client(sequence(respond(200, MINTED)))
    with pytest.raises(ValueError, match="gpu_"):
        await client.mint_client_token("z1", gpu_type, gpu_count)
    with pytest.raises(ValueError, match="zone_id"):
        await client.mint_server_token("")
    assert recorder.requests == []


async def test_unusable_mint_answer_still_names_the_token_to_revoke(
    make_client: MakeClient,
) -> None:
    client, _ = make_client(sequence(respond(200, {"enrollmentTokenId": "et-9", "role": "client"})))
    with pytest.raises(ThunderResponseError, match="enrollmentToken") as caught:
        await client.mint_client_token("z1", "H100", 1)
    assert caught.value.created_id == "et-9"


# Unenroll (thunder-api.md 2.7) and client revocation (thunder-api.md 2.8)


async def test_unenroll(make_client: MakeClient) -> None:
    body = {"enrollmentTokenId": "et/1", "nodeDeleted": True, "serverId": "h1", "extra": 1}
    client, recorder = make_client(sequence(respond(200, body)))
    result = await client.unenroll("et/1")
    assert recorder.last.method == "DELETE"
    assert recorder.last.url.raw_path == b"/api/v1/enrollment-tokens/et%2F1/node"
    assert result.node_deleted
    assert result.host_id == "h1"
    assert not result.already_gone


@pytest.mark.parametrize("answer", [respond(204), respond(200, b""), respond(200, {})])
async def test_unenroll_tolerates_empty_answers(
    make_client: MakeClient, answer: httpx.Response
) -> None:
    client, _ = make_client(sequence(answer))
    result = await client.unenroll("et-1")
    assert result.enrollment_token_id == "et-1"
    assert not result.node_deleted


@pytest.mark.parametrize("status", [404, 410])
async def test_gone_is_success_for_revocations(make_client: MakeClient, status: int) -> None:
    client, _ = make_client(sequence(respond(status, {"error": "NotFound"})))
    unenrolled = await client.unenroll("et-1")
    assert unenrolled.already_gone
    assert unenrolled.enrollment_token_id == "et-1"
    revoked = await client.revoke_client("cl-1")
    assert revoked.already_gone
    assert revoked.client_id == "cl-1"


async def test_revoke_client(make_client: MakeClient) -> None:
    body = {"clientId": "cl-1", "decommissionedAt": "2025-05-05T05:05:05Z"}
    client, recorder = make_client(sequence(respond(200, body)))
    result = await client.revoke_client("cl-1")
    assert recorder.last.method == "POST"
    assert recorder.last.url.path == "/api/v1/clients/cl-1/revoke"
    assert recorder.last.content == b""
    assert result.decommissioned_at is not None
    assert not result.already_gone


# Exchange (thunder-api.md 2.9)


async def test_exchange_authenticates_with_the_enrollment_token(make_client: MakeClient) -> None:
    answer = {"authToken": AUTH_TOKEN, "jwt": jwt_for(CLAIMS), "more": True}
    client, recorder = make_client(sequence(respond(200, answer)))
    result = await client.exchange(Secret(f"{ENROLLMENT_TOKEN}\n"), hostname="pod-a")
    assert recorder.last.headers["authorization"] == f"Bearer {ENROLLMENT_TOKEN}"
    assert recorder.last_json() == {"hostname": "pod-a"}
    assert result.auth_token.reveal() == AUTH_TOKEN
    assert result.claims.client_id == "cl-1"
    assert result.claims.gpu_count == 2
    await client.exchange(ENROLLMENT_TOKEN)
    assert recorder.last_json() == {}
    with pytest.raises(ValueError, match="empty"):
        await client.exchange("  ")


async def test_spent_token_text_reaches_the_error(make_client: MakeClient) -> None:
    client, _ = make_client(sequence(respond(403, {"error": "enrollment token already used"})))
    with pytest.raises(Forbidden, match="enrollment token already used") as caught:
        await client.exchange(ENROLLMENT_TOKEN)
    assert ENROLLMENT_TOKEN not in str(caught.value)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"authToken": AUTH_TOKEN}, "jwt"),
        ({"authToken": "", "jwt": jwt_for(CLAIMS)}, "auth_token|authToken"),
        ({"authToken": AUTH_TOKEN, "jwt": "only.two"}, "parts"),
        ({"authToken": AUTH_TOKEN, "jwt": jwt_for(CLAIMS | {"gpuCount": 0})}, "gpuCount"),
        ({"authToken": AUTH_TOKEN, "jwt": jwt_for({"orgId": "o"})}, "clientId"),
    ],
)
async def test_unusable_exchange_answers(
    make_client: MakeClient, answer: dict[str, Any], problem: str
) -> None:
    client, _ = make_client(sequence(respond(200, answer)))
    with pytest.raises(ThunderResponseError, match=problem) as caught:
        await client.exchange(ENROLLMENT_TOKEN)
    assert AUTH_TOKEN not in str(caught.value)
