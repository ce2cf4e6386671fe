"""The Thunder client over real HTTP against the fake service running as a process."""

from __future__ import annotations

import asyncio
import logging
import socket
import traceback

import pytest

from hack.fake_thunder import FakeThunderProcess
from tests.integration.thunder.conftest import API_TOKEN, make_client
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
    ThunderError,
    ThunderResponseError,
    ThunderTransportError,
    Unauthorized,
)

NO_RETRY = RetryPolicy(max_attempts=1)


async def test_every_endpoint_end_to_end(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    admin = fake_thunder.admin
    zone = await client.ensure_zone("us-east")  # thunder-api.md 2.2
    assert await client.resolve_zone("us-east") == zone  # 2.1
    server = await client.mint_server_token(zone)  # thunder-api.md 2.6 (server)
    host = admin.register_host(server.enrollment_token.reveal(), "A6000", 4, zone_name="us-east")
    [listed_host] = await client.list_hosts(zone)  # thunder-api.md 2.3
    assert (listed_host.host_id, listed_host.gpu_type, listed_host.gpu_count) == (
        host["hostId"],
        "A6000",
        4,
    )
    admin.set_targets(zone, {"a6000": 1.5}, default=3)
    assert await client.oversubscription_target(zone, "A6000") == 1.5  # 2.5
    minted = await client.mint_client_token(zone, "A6000", 2)  # thunder-api.md 2.6 (client)
    # thunder-api.md 2.9
    exchanged = await client.exchange(minted.enrollment_token, hostname="pod-a")
    [listed_client] = await client.list_clients(zone)  # thunder-api.md 2.4
    assert listed_client.client_id == exchanged.claims.client_id
    assert listed_client.display_name == "pod-a"
    unenrolled = await client.unenroll(minted.enrollment_token_id)  # thunder-api.md 2.7
    assert unenrolled.node_deleted
    revoked = await client.revoke_client(exchanged.claims.client_id)  # thunder-api.md 2.8
    assert revoked.decommissioned_at is not None
    assert not (await client.list_clients(zone))[0].live
    assert admin.leaks() == []
    written = [(w["method"], w["path"].split("/")[3], w["status"]) for w in admin.writes()]
    assert written == [
        ("POST", "zones", 200),
        ("POST", "enrollment-tokens", 200),
        ("POST", "enrollment-tokens", 200),
        ("POST", "enrollment-tokens", 200),
        ("DELETE", "enrollment-tokens", 200),
        ("POST", "clients", 200),
    ]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (429, RateLimited),
        (500, ServerError),
        (503, ServerError),
    ],
)
async def test_every_error_class_over_http(
    fake_thunder: FakeThunderProcess, status: int, expected: type[ThunderAPIError]
) -> None:
    fake_thunder.admin.add_fault("/api/v1/clients", method="GET", status=status)
    async with make_client(fake_thunder, retry=NO_RETRY) as client:
        with pytest.raises(expected) as caught:
            await client.list_clients()
    assert caught.value.status == status
    assert "injected fault" in str(caught.value)


async def test_real_refusals(client: ThunderClient, fake_thunder: FakeThunderProcess) -> None:
    with pytest.raises(NotFound, match="zone not found"):
        await client.get_oversubscription_targets("zone-missing")
    reader = fake_thunder.admin.add_api_token(capabilities=["zones:read"])
    async with make_client(fake_thunder, token=reader, component="operator") as operator:
        with pytest.raises(Forbidden, match="missing capability"):
            await operator.list_hosts()
    async with make_client(fake_thunder, token="tcapi_nobody") as stranger:
        with pytest.raises(Unauthorized):
            await stranger.list_zones()
    fake_thunder.admin.set_switches(conflictOnEnsure=True, goneOnRevokeUnknown=True)
    zone = await client.ensure_zone("z")
    assert await client.ensure_zone("z") == zone
    assert (await client.unenroll("et-missing")).already_gone
    assert [w["status"] for w in fake_thunder.admin.writes()] == [200, 409, 410]


@pytest.mark.parametrize(
    ("body", "problem"),
    [("{not json", "not valid JSON"), ('{"zones": "many"}', "zones"), ("[]", "JSON list")],
)
async def test_malformed_answers_over_http(
    fake_thunder: FakeThunderProcess, body: str, problem: str
) -> None:
    fake_thunder.admin.add_fault("/api/v1/zones", method="GET", status=200, body=body)
    async with make_client(fake_thunder) as client:
        with pytest.raises(ThunderResponseError, match=problem):
            await client.list_zones()


async def test_unexpected_fields_are_ignored_over_http(fake_thunder: FakeThunderProcess) -> None:
    body = {"zones": [{"zoneId": "z1", "displayName": "a", "brandNew": {"x": [1]}}], "page": 1}
    fake_thunder.admin.add_fault("/api/v1/zones", method="GET", status=200, body=body)
    async with make_client(fake_thunder) as client:
        assert [z.zone_id for z in await client.list_zones()] == ["z1"]


async def test_oversized_answer_is_cut_off(fake_thunder: FakeThunderProcess) -> None:
    fake_thunder.admin.add_fault("/api/v1/zones", status=200, body={"zones": [], "pad": "x" * 4096})
    async with make_client(fake_thunder, max_response_bytes=1024) as client:
        with pytest.raises(ThunderResponseError, match="1024-byte limit"):
            await client.list_zones()


async def test_one_shot_and_repeated_faults(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    fake_thunder.admin.add_fault("/api/v1/zones", method="GET", status=503, times=2)
    assert await client.list_zones() == []
    assert fake_thunder.admin.faults() == []
    fake_thunder.admin.add_fault("/api/v1/zones", method="GET", status=503)
    with pytest.raises(ServerError) as caught:
        await client.list_zones()
    assert any("gave up after 4 attempts" in n for n in caught.value.__notes__)
    assert len(fake_thunder.admin.faults()) == 1


async def test_mint_whose_answer_is_lost_is_not_repeated_and_is_audited(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    zone = await client.ensure_zone("z")
    fake_thunder.admin.add_fault("/api/v1/enrollment-tokens", method="POST", status=500, after=True)
    with pytest.raises(ServerError):
        await client.mint_client_token(zone, "H100", 1)
    [leak] = fake_thunder.admin.leaks()
    assert leak["reason"] == "unspent"
    assert len(fake_thunder.admin.tokens()) == 1


async def test_audit_finds_an_enrollment_leaked_on_purpose(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    zone = await client.ensure_zone("z")
    kept = await client.mint_client_token(zone, "H100", 1)
    await client.exchange(kept.enrollment_token, "pod-ok")
    leaked = await client.mint_client_token(zone, "H100", 1)
    [leak] = fake_thunder.admin.leaks()
    assert leak["enrollmentTokenId"] == leaked.enrollment_token_id
    await client.unenroll(leaked.enrollment_token_id)
    assert fake_thunder.admin.leaks() == []


async def test_rate_limited_mint_is_retried(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    zone = await client.ensure_zone("z")
    fake_thunder.admin.add_fault(
        "/api/v1/enrollment-tokens",
        method="POST",
        status=429,
        times=1,
        headers={"Retry-After": "0"},
    )
    minted = await client.mint_client_token(zone, "H100", 1)
    assert fake_thunder.admin.token(minted.enrollment_token_id)["state"] == "unspent"


async def test_transport_errors(fake_thunder: FakeThunderProcess) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with ThunderClient(
        api_token=API_TOKEN,
        component="daemon",
        base_url=f"http://127.0.0.1:{closed_port}",
        retry=RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01),
    ) as nowhere:
        with pytest.raises(ThunderTransportError) as caught:
            await nowhere.mint_server_token("z")
    assert caught.value.request_sent is False

    fake_thunder.admin.add_fault("/api/v1/hosts", latency_ms=2000)
    async with make_client(fake_thunder, timeout=0.2, retry=NO_RETRY) as impatient:
        with pytest.raises(ThunderTransportError) as timed_out:
            await impatient.list_hosts()
    assert timed_out.value.timed_out


async def test_concurrent_clients_against_the_process(
    client: ThunderClient, fake_thunder: FakeThunderProcess
) -> None:
    zone = await client.ensure_zone("busy")

    async def enroll(index: int) -> str:
        minted = await client.mint_client_token(zone, "H100", 1)
        return (await client.exchange(minted.enrollment_token, f"pod-{index}")).claims.client_id

    ids = await asyncio.gather(*(enroll(i) for i in range(25)))
    assert len(set(ids)) == 25
    assert len(await client.list_clients(zone)) == 25


async def test_writes_are_attributed_by_user_agent(fake_thunder: FakeThunderProcess) -> None:
    async with make_client(fake_thunder, component="daemon") as daemon:
        zone = await daemon.ensure_zone("z")
        minted = await daemon.mint_client_token(zone, "H100", 1)
    async with make_client(fake_thunder, component="operator") as operator:
        await operator.list_zones()
        await operator.unenroll(minted.enrollment_token_id)
    agents = [(w["path"].split("/")[-1], w["userAgent"]) for w in fake_thunder.admin.writes()]
    assert [a.split("(")[-1] for _, a in agents] == ["daemon)", "daemon)", "operator)"]


async def test_no_secret_reaches_errors_or_logs(
    client: ThunderClient, fake_thunder: FakeThunderProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    zone = await client.ensure_zone("z")
    minted = await client.mint_client_token(zone, "H100", 1)
    token = minted.enrollment_token.reveal()
    fake_thunder.admin.add_fault(
        "/api/v1/enrollment-tokens/enroll", status=500, times=1, body=f"echo {token} {API_TOKEN}"
    )
    exchanged = await client.exchange(minted.enrollment_token)
    texts = [caplog.text, repr(minted), repr(exchanged)]
    try:
        await client.exchange(minted.enrollment_token)
    except ThunderError as error:
        texts += [str(error), "".join(traceback.format_exception(error))]
    everything = "\n".join(texts)
    assert "already used" in everything
    for secret in (API_TOKEN, token, exchanged.auth_token.reveal(), exchanged.jwt.reveal()):
        assert secret not in everything
    assert API_TOKEN not in fake_thunder.log_text()
