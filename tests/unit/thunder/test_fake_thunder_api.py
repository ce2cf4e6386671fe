"""The client against the in-process fake Thunder: the stateful behaviour of thunder-api.md 6.1."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from hack.fake_thunder import FAKE_ORG_ID, AsyncFakeThunderAdmin, FakeThunder
from tests.unit.thunder.doubles import API_TOKEN
from thunder_dra.thunder import (
    Forbidden,
    NotFound,
    Secret,
    ThunderClient,
    Unauthorized,
)

BASE = "http://fake-thunder"


async def raw(fake: FakeThunder, method: str, path: str, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(transport=fake.transport(), base_url=BASE) as http:
        return await http.request(method, path, **kwargs)  # type: ignore[arg-type]


async def test_zone_ensure_is_idempotent_and_resolves_duplicates(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    first = await fake_client.ensure_zone("us-east")
    assert await fake_client.ensure_zone("us-east") == first
    await admin.add_zone("us-east", zone_id="zone-0000")
    await admin.add_zone("us-east", zone_id="zone-zzzz")
    assert await fake_client.ensure_zone("us-east") == "zone-0000"
    await admin.set_switches(conflictOnEnsure=True, created201=True)
    assert await fake_client.ensure_zone("us-east") == "zone-0000"
    assert (await fake_client.ensure_zone("eu-west")).startswith("zone-")
    statuses = [w["status"] for w in await admin.writes()]
    assert statuses == [200, 200, 200, 409, 201]


async def test_hosts_and_clients_lists_follow_writes(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin, fake: FakeThunder
) -> None:
    zone_a = await fake_client.ensure_zone("a")
    zone_b = await fake_client.ensure_zone("b")
    await admin.add_host(zone_a, "A6000", 4, hostname="gpu-1")
    await admin.add_host(zone_b, "H100", 8, status="offline")
    hosts_a = await fake_client.list_hosts(zone_a)
    assert [(h.gpu_type, h.gpu_count, h.healthy) for h in hosts_a] == [("A6000", 4, True)]
    assert len(await fake_client.list_hosts()) == 2

    await admin.set_switches(ignoreZoneQuery=True, serverIdSpelling=True)
    answer = await raw(
        fake,
        "GET",
        "/api/v1/hosts",
        params={"zoneId": zone_a},
        headers={"Authorization": f"Bearer {API_TOKEN}"},
    )
    assert len(answer.json()["hosts"]) == 2
    assert "serverId" in answer.json()["hosts"][0]
    hosts_a = await fake_client.list_hosts(zone_a)
    assert [h.zone_id for h in hosts_a] == [zone_a]

    minted = await fake_client.mint_client_token(zone_b, "H100", 1)
    await fake_client.exchange(minted.enrollment_token)
    assert await fake_client.list_clients(zone_a) == []
    assert [c.zone_id for c in await fake_client.list_clients(zone_b)] == [zone_b]
    zones = {z.display_name: z for z in await fake_client.list_zones()}
    assert (zones["b"].node_count, zones["b"].client_count) == (1, 1)


async def test_exchange_consumes_the_token_and_creates_a_client(
    fake_client: ThunderClient,
) -> None:
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "nvidia-L4", 3)
    result = await fake_client.exchange(minted.enrollment_token, hostname="pod-7")
    assert result.claims.org_id == FAKE_ORG_ID
    assert (result.claims.gpu_type, result.claims.gpu_count) == ("nvidia-L4", 3)
    header = json.loads(base64.urlsafe_b64decode(result.jwt.reveal().split(".")[0] + "=="))
    assert header["alg"] == "HS256"
    [client] = await fake_client.list_clients(zone)
    assert client.client_id == result.claims.client_id
    assert (client.display_name, client.gpu_type, client.gpu_count) == ("pod-7", "nvidia-L4", 3)
    assert client.live
    assert client.created_at is not None

    with pytest.raises(Forbidden, match="enrollment token already used"):
        await fake_client.exchange(minted.enrollment_token)


@pytest.mark.parametrize("case", ["revoked", "expired", "unknown", "server", "api-token"])
async def test_exchange_refuses_unusable_tokens(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin, case: str
) -> None:
    zone = await fake_client.ensure_zone("z")
    if case == "server":
        token = (await fake_client.mint_server_token(zone)).enrollment_token
    elif case == "unknown":
        token = Secret("tr_never-minted")
    elif case == "api-token":
        token = Secret(API_TOKEN)
    else:
        expiry = 60 if case == "expired" else None
        minted = await fake_client.mint_client_token(zone, "H100", 1, expires_in_seconds=expiry)
        token = minted.enrollment_token
        if case == "revoked":
            await fake_client.unenroll(minted.enrollment_token_id)
        else:
            await admin.advance_clock(61)
    with pytest.raises(Forbidden) as caught:
        await fake_client.exchange(token)
    assert token.reveal() not in str(caught.value)


async def test_exchange_without_credentials_is_401(fake: FakeThunder) -> None:
    answer = await raw(fake, "POST", "/api/v1/enrollment-tokens/enroll", json={})
    assert answer.status_code == 401


async def test_unenroll_and_revoke_client(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "H100", 1)
    exchanged = await fake_client.exchange(minted.enrollment_token, "pod")
    result = await fake_client.unenroll(minted.enrollment_token_id)
    assert result.node_deleted
    assert result.client_id == exchanged.claims.client_id
    [client] = await fake_client.list_clients(zone)
    assert not client.live
    again = await fake_client.unenroll(minted.enrollment_token_id)
    assert again.already_gone

    revoked = await fake_client.revoke_client(client.client_id)
    repeated = await fake_client.revoke_client(client.client_id)
    assert revoked.decommissioned_at == repeated.decommissioned_at == client.decommissioned_at
    assert (await fake_client.revoke_client("cl-unknown")).already_gone

    await admin.set_switches(goneOnRevokeUnknown=True)
    assert (await fake_client.unenroll("et-unknown")).already_gone
    assert (await fake_client.revoke_client("cl-unknown")).already_gone
    codes = [
        w["status"] for w in await admin.writes() if "revoke" in w["path"] or "node" in w["path"]
    ]
    assert codes == [200, 404, 200, 200, 404, 410, 410]


async def test_unenroll_may_keep_the_client_alive(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    await admin.set_switches(keepClientOnUnenroll=True)
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "H100", 1)
    exchanged = await fake_client.exchange(minted.enrollment_token)
    result = await fake_client.unenroll(minted.enrollment_token_id)
    assert not result.node_deleted
    assert result.client_id == exchanged.claims.client_id
    assert (await fake_client.list_clients(zone))[0].live
    audit = await admin.audit()
    assert audit["leaks"] == []
    assert [o["clientId"] for o in audit["orphanClients"]] == [result.client_id]
    await fake_client.revoke_client(exchanged.claims.client_id)
    assert (await admin.audit())["orphanClients"] == []


async def test_server_tokens_register_hosts_and_unenroll_removes_them(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("gpu-zone")
    minted = await fake_client.mint_server_token(zone)
    host = await admin.register_host(
        minted.enrollment_token.reveal(), "A6000", 2, zone_name="gpu-zone", hostname="node-1"
    )
    assert host["enrollmentTokenId"] == minted.enrollment_token_id
    assert [h.hostname for h in await fake_client.list_hosts(zone)] == ["node-1"]
    token = await admin.token(minted.enrollment_token_id)
    assert token["state"] == "spent"
    assert token["host"]["hostId"] == host["hostId"]
    assert "enrollmentToken" not in token
    result = await fake_client.unenroll(minted.enrollment_token_id)
    assert result.host_id == host["hostId"]
    assert result.node_deleted
    assert await fake_client.list_hosts(zone) == []


async def test_auth_rules(fake: FakeThunder, admin: AsyncFakeThunderAdmin) -> None:
    reader = await admin.add_api_token(capabilities=["zones:read", "hosts:read"])
    async with ThunderClient(
        api_token=reader, component="operator", base_url=BASE, transport=fake.transport()
    ) as operator:
        assert await operator.list_zones() == []
        with pytest.raises(Forbidden, match="missing capability"):
            await operator.list_clients()
        with pytest.raises(Forbidden, match="forbidden"):
            await operator.ensure_zone("z")
    async with ThunderClient(
        api_token="tcapi_unknown", component="operator", base_url=BASE, transport=fake.transport()
    ) as stranger:
        with pytest.raises(Unauthorized):
            await stranger.list_zones()
    answer = await raw(fake, "GET", "/api/v1/zones")
    assert answer.status_code == 401


async def test_targets(fake_client: ThunderClient, admin: AsyncFakeThunderAdmin) -> None:
    zone = await fake_client.ensure_zone("z")
    empty = await fake_client.get_oversubscription_targets(zone)
    assert empty.targets == []
    assert await fake_client.oversubscription_target(zone, "H100") == 1.0
    await admin.set_targets(zone, {"H100": 1.5, "A6000": 0}, default=2)
    assert await fake_client.oversubscription_target(zone, "h100") == 1.5
    assert await fake_client.oversubscription_target(zone, "A6000") == 2.0
    with pytest.raises(NotFound):
        await fake_client.get_oversubscription_targets("zone-unknown")
    assert await fake_client.oversubscription_target("zone-unknown", "H100") == 1.0


async def test_mint_validation(fake: FakeThunder) -> None:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    for body, status in [
        ({"zoneId": "nope", "role": "client", "gpuType": "H100", "gpuCount": 1}, 404),
        ({"role": "admin"}, 400),
    ]:
        answer = await raw(fake, "POST", "/api/v1/enrollment-tokens", json=body, headers=headers)
        assert answer.status_code == status
    unknown = await raw(fake, "GET", "/api/v1/nowhere", headers=headers)
    assert unknown.status_code == 404
    wrong_method = await raw(fake, "DELETE", "/api/v1/zones", headers=headers)
    assert wrong_method.status_code == 405


async def test_concurrent_enrollments(fake_client: ThunderClient) -> None:
    zone = await fake_client.ensure_zone("busy")

    async def enroll(index: int) -> str:
        minted = await fake_client.mint_client_token(zone, "H100", 1)
        exchanged = await fake_client.exchange(minted.enrollment_token, f"pod-{index}")
        return exchanged.claims.client_id

    client_ids = await asyncio.gather(*(enroll(i) for i in range(20)))
    assert len(set(client_ids)) == 20
    assert len(await fake_client.list_clients(zone)) == 20
