"""The in-process fake's admin surface: faults, the write log, the audit, state and reset."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hack.fake_thunder import AsyncFakeThunderAdmin, FakeAdminError, FakeThunder
from tests.unit.thunder.doubles import API_TOKEN, FakeClock
from thunder_dra.thunder import (
    Forbidden,
    ServerError,
    ThunderClient,
    ThunderError,
    Unauthorized,
)


async def test_one_shot_fault_is_retried_away(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin, clock: FakeClock
) -> None:
    await admin.add_fault("/api/v1/zones", method="GET", status=503, times=1)
    assert await fake_client.list_zones() == []
    assert len(clock.sleeps) == 1
    assert await admin.faults() == []


async def test_repeated_fault_stays_until_cleared(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    await admin.add_fault("/api/v1/hosts", status=500, body={"error": "Internal", "message": "x"})
    with pytest.raises(ServerError, match="Internal"):
        await fake_client.list_hosts()
    assert len(await admin.faults()) == 1
    await admin.clear_faults()
    assert await fake_client.list_hosts() == []


async def test_first_matching_fault_wins(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    await admin.add_fault("/api/v1/*", method="GET", status=401, times=1)
    await admin.add_fault("/api/v1/zones", method="GET", status=500)
    with pytest.raises(Unauthorized):
        await fake_client.list_zones()
    with pytest.raises(ServerError):
        await fake_client.list_zones()
    [remaining] = await admin.faults()
    assert remaining["status"] == 500


async def test_lost_mint_answer_leaks_a_token_the_audit_finds(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    await admin.add_fault("/api/v1/enrollment-tokens", method="POST", status=502, after=True)
    with pytest.raises(ServerError):
        await fake_client.mint_client_token(zone, "H100", 1)
    tokens = await admin.tokens()
    assert len(tokens) == 1, "the mint took effect and was not repeated"
    [leak] = (await admin.audit())["leaks"]
    assert leak["enrollmentTokenId"] == tokens[0]["enrollmentTokenId"]
    assert leak["reason"] == "unspent"
    assert leak["mintedBy"].endswith("(daemon)")
    write = (await admin.writes())[-1]
    assert (write["status"], write["fault"]) == (502, "fault-1")


async def test_lost_exchange_answer_then_retry_meets_a_spent_token(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "H100", 1)
    await admin.add_fault(
        "/api/v1/enrollment-tokens/enroll", status=503, after=True, times=1, latency_ms=5
    )
    with pytest.raises(Forbidden, match="already used"):
        await fake_client.exchange(minted.enrollment_token)
    assert len(await fake_client.list_clients(zone)) == 1
    await fake_client.unenroll(minted.enrollment_token_id)
    assert (await admin.audit())["leaks"] == []


async def test_audit_names_every_kind_of_leak(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    forgotten = await fake_client.mint_client_token(zone, "H100", 1)
    in_use = await fake_client.mint_client_token(zone, "H100", 1)
    await fake_client.exchange(in_use.enrollment_token)
    half_done = await fake_client.mint_client_token(zone, "H100", 1)
    exchanged = await fake_client.exchange(half_done.enrollment_token)
    await fake_client.revoke_client(exchanged.claims.client_id)
    cleaned = await fake_client.mint_client_token(zone, "H100", 1)
    await fake_client.unenroll(cleaned.enrollment_token_id)
    server = await fake_client.mint_server_token(zone)
    host = await admin.register_host(server.enrollment_token.reveal(), "H100", 8)
    live_server = await fake_client.mint_server_token(zone)
    await admin.register_host(live_server.enrollment_token.reveal(), "H100", 8)
    await admin.delete_host(host["hostId"])

    audit = await admin.audit()
    reasons = {leak["enrollmentTokenId"]: leak["reason"] for leak in audit["leaks"]}
    assert reasons == {
        forgotten.enrollment_token_id: "unspent",
        half_done.enrollment_token_id: "client-decommissioned",
        server.enrollment_token_id: "host-removed",
    }
    assert audit["tokensChecked"] == 6


async def test_expired_unrevoked_tokens_still_count_as_leaks(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "H100", 1, expires_in_seconds=5)
    await admin.advance_clock(10)
    [leak] = await admin.leaks()
    assert (leak["enrollmentTokenId"], leak["state"]) == (minted.enrollment_token_id, "expired")


async def test_write_log_records_who_wrote_what_without_secrets(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin, fake: FakeThunder
) -> None:
    zone = await fake_client.ensure_zone("z")
    await fake_client.list_zones()
    minted = await fake_client.mint_client_token(zone, "H100", 2)
    exchanged = await fake_client.exchange(minted.enrollment_token, "pod")
    await admin.add_zone("admin-made")
    writes = await admin.writes()
    assert [(w["method"], w["path"]) for w in writes] == [
        ("POST", "/api/v1/zones/ensure"),
        ("POST", "/api/v1/enrollment-tokens"),
        ("POST", "/api/v1/enrollment-tokens/enroll"),
    ]
    assert [w["credential"] for w in writes] == ["api-token", "api-token", "enrollment-token"]
    assert writes[2]["enrollmentTokenId"] == minted.enrollment_token_id
    assert writes[1]["body"] == {"zoneId": zone, "role": "client", "gpuType": "H100", "gpuCount": 2}
    assert all(w["userAgent"].endswith("(daemon)") for w in writes)
    rendered = json.dumps(writes)
    for secret in (API_TOKEN, minted.enrollment_token.reveal(), exchanged.auth_token.reveal()):
        assert secret not in rendered
    await admin.clear_writes()
    assert await admin.writes() == []


async def test_state_dump_replace_and_reset(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    await admin.add_host(zone, "H100", 8)
    await admin.set_targets(zone, {"H100": 3})
    dumped = await admin.state()
    await admin.set_switches(serverIdSpelling=True)
    await admin.reset()
    assert await fake_client.list_zones() == []
    assert (await admin.switches())["serverIdSpelling"] is False
    await admin.replace_state(dumped)
    assert [z.zone_id for z in await fake_client.list_zones()] == [zone]
    assert (await fake_client.list_hosts(zone))[0].gpu_count == 8
    assert await fake_client.oversubscription_target(zone, "h100") == 3.0


async def test_patch_host_changes_capacity(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone = await fake_client.ensure_zone("z")
    host = await admin.add_host(zone, "H100", 8)
    await admin.patch_host(host["hostId"], {"cordoned": True, "gpuCount": 4})
    [listed] = await fake_client.list_hosts(zone)
    assert (listed.cordoned, listed.gpu_count, listed.adds_capacity) == (True, 4, False)
    await admin.patch_host(host["hostId"], {"cordoned": False, "status": "offline"})
    assert not (await fake_client.list_hosts(zone))[0].adds_capacity


@pytest.mark.parametrize(
    ("call", "status"),
    [
        ("fault-without-effect", 400),
        ("after-without-status", 400),
        ("unknown-switch", 400),
        ("switch-wrong-type", 400),
        ("patch-unknown-field", 400),
        ("host-in-unknown-zone", 404),
        ("spent-server-token", 403),
        ("wrong-zone-name", 400),
    ],
)
async def test_admin_rejects_bad_requests(
    fake_client: ThunderClient, admin: AsyncFakeThunderAdmin, call: str, status: int
) -> None:
    zone = await fake_client.ensure_zone("real-zone")
    host = await admin.add_host(zone, "H100", 1)
    server = (await fake_client.mint_server_token(zone)).enrollment_token.reveal()
    attempts: dict[str, Callable[[], Awaitable[Any]]] = {
        "fault-without-effect": lambda: admin.add_fault("/x"),
        "after-without-status": lambda: admin.add_fault("/x", latency_ms=5, after=True),
        "unknown-switch": lambda: admin.set_switches(noSuchSwitch=True),
        "switch-wrong-type": lambda: admin.set_switches(installerStatus=True),
        "patch-unknown-field": lambda: admin.patch_host(host["hostId"], {"zoneId": "x"}),
        "host-in-unknown-zone": lambda: admin.add_host("zone-none", "H100", 1),
        "spent-server-token": lambda: admin.register_host(server, "H100", 1),
        "wrong-zone-name": lambda: admin.register_host(server, "H100", 1, zone_name="other"),
    }
    if call == "spent-server-token":
        await admin.register_host(server, "H100", 1)
    with pytest.raises(FakeAdminError) as caught:
        await attempts[call]()
    assert caught.value.status == status


async def test_no_token_in_errors_reprs_or_logs(
    fake_client: ThunderClient,
    admin: AsyncFakeThunderAdmin,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Drive failing flows and inspect everything a user could see."""
    caplog.set_level(logging.DEBUG)
    zone = await fake_client.ensure_zone("z")
    minted = await fake_client.mint_client_token(zone, "H100", 1)
    exchanged = await fake_client.exchange(minted.enrollment_token, "pod")
    secrets = [API_TOKEN, minted.enrollment_token.reveal(), exchanged.auth_token.reveal()]
    secrets.append(exchanged.jwt.reveal())
    await admin.add_fault("/api/v1/*", status=429, times=2)
    await admin.add_fault(
        "/api/v1/enrollment-tokens/enroll",
        status=403,
        body={"error": f"bad token {secrets[1]}", "message": secrets[1]},
    )
    seen: list[str] = [repr(minted), repr(exchanged), str(minted), repr(fake_client)]
    for action in (
        lambda: fake_client.list_zones(),
        lambda: fake_client.exchange(minted.enrollment_token),
        lambda: fake_client.exchange(minted.enrollment_token),
    ):
        try:
            await action()
        except ThunderError as error:
            seen += [str(error), repr(error), "".join(traceback.format_exception(error))]
    seen.append(caplog.text)
    seen += [repr(r.__dict__) for r in caplog.records]
    everything = "\n".join(seen)
    assert "bad token" in everything
    for secret in secrets:
        assert secret not in everything
