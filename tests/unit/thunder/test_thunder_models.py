"""Parsing Thunder's answers: uncertain spellings, nulls, unknown fields, JWT claims and
oversubscription targets."""

from __future__ import annotations

import base64
import contextlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from thunder_dra.thunder import (
    ClientRecord,
    Host,
    JwtClaimsError,
    MintedToken,
    OversubscriptionTargets,
    Zone,
    decode_jwt_claims,
    oversubscription_target,
    smallest_zone_id,
    zones_by_name,
)
from thunder_dra.thunder.models import ClientList, HostList, ZoneList

# Deterministic and without per-example deadlines: CI machines may be busy.
relaxed = settings(deadline=None, derandomize=True)
TIME = "2025-03-01T12:00:00Z"
text = st.text(min_size=1, max_size=20)
absent_or_null = st.sampled_from(["absent", "null"])
junk = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.booleans(), st.lists(st.integers())
)
# Numbers are not junk for a time: pydantic reads them as Unix timestamps.
not_a_time = st.one_of(
    st.booleans(), st.lists(st.integers(), min_size=1), st.text("xyz:-", max_size=6)
)


def _jwt(payload: Any, parts: int = 3) -> str:
    encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return ".".join(["eyJhbGciOiJIUzI1NiJ9", encoded, "sig"][:parts])


@relaxed
@given(
    host_id=text,
    id_key=st.sampled_from(["hostId", "serverId"]),
    gpu_type=text,
    gpu_count=st.integers(min_value=0, max_value=10_000),
    status=st.one_of(st.none(), st.sampled_from(["active", "ONLINE", " ready ", "", "offline"])),
    optional=absent_or_null,
    extra=st.dictionaries(st.text(min_size=1, max_size=8).map(lambda s: "x_" + s), junk),
)
def test_host_tolerates_uncertain_spellings(
    host_id: str,
    id_key: str,
    gpu_type: str,
    gpu_count: int,
    status: str | None,
    optional: str,
    extra: dict[str, Any],
) -> None:
    item: dict[str, Any] = extra | {
        id_key: host_id,
        "zoneId": "z1",
        "gpuType": gpu_type,
        "gpuCount": gpu_count,
        "status": status,
    }
    if optional == "null":
        item |= {"thunderdVersion": None, "lastSeenAt": None, "configurations": None}
    host = Host.model_validate(item)
    assert host.host_id == host_id
    assert host.gpu_type == gpu_type  # never normalised: it goes back to Thunder verbatim
    assert host.healthy == ((status or "").strip().lower() != "offline")
    assert host.adds_capacity == host.healthy
    assert host.thunderd_version is None
    assert host.last_seen_at is None


@relaxed
@given(last_seen=not_a_time, version=junk, configurations=junk)
def test_uncertain_host_fields_of_the_wrong_shape_read_as_absent(
    last_seen: Any, version: Any, configurations: Any
) -> None:
    host = Host.model_validate(
        {
            "hostId": "h",
            "zoneId": "z",
            "gpuType": "A6000",
            "gpuCount": 2,
            "lastSeenAt": last_seen,
            "thunderdVersion": version,
            "configurations": configurations,
        }
    )
    assert host.last_seen_at is None
    assert host.thunderd_version in (None, version)
    assert host.cordoned is False


def test_cordoned_or_unhealthy_hosts_add_no_capacity() -> None:
    base = {"hostId": "h", "zoneId": "z", "gpuType": "H100", "gpuCount": 8}
    assert Host.model_validate(base).adds_capacity
    assert not Host.model_validate(base | {"configurations": {"cordoned": True}}).adds_capacity
    assert not Host.model_validate(base | {"status": "offline"}).adds_capacity


@pytest.mark.parametrize(
    "broken",
    [
        {"zoneId": "z", "gpuType": "H100", "gpuCount": 1},
        {"hostId": "h", "gpuType": "H100", "gpuCount": 1},
        {"hostId": "h", "zoneId": "z", "gpuCount": 1},
        {"hostId": "h", "zoneId": "z", "gpuType": "H100", "gpuCount": -1},
        {"hostId": "h", "zoneId": "z", "gpuType": "H100", "gpuCount": "many"},
    ],
)
def test_confirmed_host_fields_are_required(broken: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Host.model_validate(broken)


@relaxed
@given(
    decommissioned=st.one_of(st.just("absent"), st.none(), st.just(TIME)),
    extra=st.dictionaries(st.text(min_size=1, max_size=8).map(lambda s: "y_" + s), junk),
    display_name=junk,
    gpu_count=junk,
)
def test_client_liveness_and_lenient_fields(
    decommissioned: str | None, extra: dict[str, Any], display_name: Any, gpu_count: Any
) -> None:
    item: dict[str, Any] = extra | {
        "clientId": "c",
        "zoneId": "z",
        "displayName": display_name,
        "gpuCount": gpu_count,
    }
    if decommissioned != "absent":
        item["decommissionedAt"] = decommissioned
    client = ClientRecord.model_validate(item)
    assert client.live == (decommissioned in ("absent", None))
    assert client.display_name in (None, display_name)


def test_client_decommission_time_is_confirmed_and_strict() -> None:
    with pytest.raises(ValidationError):
        ClientRecord.model_validate({"clientId": "c", "zoneId": "z", "decommissionedAt": "never"})


@relaxed
@given(zones=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), text), max_size=12))
def test_a_name_resolves_to_the_smallest_id(zones: list[tuple[str, str]]) -> None:
    parsed = [Zone.model_validate({"zoneId": zid, "displayName": name}) for name, zid in zones]
    for name in ("a", "b", "c"):
        ids = [zid for n, zid in zones if n == name]
        assert smallest_zone_id(parsed, name) == (min(ids) if ids else None)
        grouped = zones_by_name(parsed).get(name, [])
        assert [z.zone_id for z in grouped] == sorted(ids)


def test_lists_accept_null_and_ignore_unknown_fields() -> None:
    assert ZoneList.model_validate({"zones": None}).zones == []
    assert HostList.model_validate({"hosts": [], "nextPage": None}).hosts == []
    assert ClientList.model_validate({"clients": [{"clientId": "c", "zoneId": "z", "new": 1}]})
    with pytest.raises(ValidationError):
        ZoneList.model_validate({"items": []})


def test_minted_token_requires_id_and_secret() -> None:
    minted = MintedToken.model_validate(
        {"enrollmentTokenId": "et", "enrollmentToken": "tr_x", "role": "client", "new": True}
    )
    assert minted.enrollment_token.reveal() == "tr_x"
    assert "tr_x" not in repr(minted)
    for missing in ("enrollmentTokenId", "enrollmentToken", "role"):
        body = {"enrollmentTokenId": "et", "enrollmentToken": "tr_x", "role": "client"}
        del body[missing]
        with pytest.raises(ValidationError):
            MintedToken.model_validate(body)
    with pytest.raises(ValidationError):
        MintedToken.model_validate({"enrollmentTokenId": "et", "enrollmentToken": "", "role": "c"})


# JWT claims (thunder-api.md 2.9)


@relaxed
@given(
    org=text,
    client=text,
    gpu_type=text,
    count=st.integers(min_value=1, max_value=1 << 20),
    extra=st.dictionaries(st.text(min_size=1, max_size=5).map(lambda s: "z" + s), junk),
)
def test_valid_jwt_payloads_decode(
    org: str, client: str, gpu_type: str, count: int, extra: dict[str, Any]
) -> None:
    payload = extra | {"orgId": org, "clientId": client, "gpuType": gpu_type, "gpuCount": count}
    claims = decode_jwt_claims(_jwt(payload))
    assert (claims.org_id, claims.client_id, claims.gpu_type, claims.gpu_count) == (
        org,
        client,
        gpu_type,
        count,
    )


GOOD = {"orgId": "o", "clientId": "c", "gpuType": "H100", "gpuCount": 2}


@pytest.mark.parametrize(
    ("jwt", "problem"),
    [
        (_jwt(GOOD, parts=2), "parts"),
        (_jwt(GOOD) + ".extra", "parts"),
        ("a.!!!.c", "base64url"),
        ("a." + base64.urlsafe_b64encode(b"not json").decode() + ".c", "base64url"),
        (_jwt([1, 2]), "JSON list"),
        (_jwt(GOOD | {"gpuCount": 0}), "gpuCount"),
        (_jwt(GOOD | {"gpuCount": "2"}), "gpuCount"),
        (_jwt(GOOD | {"gpuCount": True}), "gpuCount"),
        (_jwt(GOOD | {"gpuCount": 1.5}), "gpuCount"),
        (_jwt({k: v for k, v in GOOD.items() if k != "clientId"}), "clientId"),
        (_jwt(GOOD | {"orgId": 7}), "orgId"),
    ],
)
def test_invalid_jwt_payloads_fail_clearly(jwt: str, problem: str) -> None:
    with pytest.raises(JwtClaimsError, match=problem) as caught:
        decode_jwt_claims(jwt)
    assert jwt not in str(caught.value)


@relaxed
@given(payload=st.dictionaries(st.text(max_size=8), junk, max_size=6))
def test_arbitrary_payloads_never_crash_the_decoder(payload: dict[str, Any]) -> None:
    with contextlib.suppress(JwtClaimsError):
        decode_jwt_claims(_jwt(payload))


# Oversubscription targets (thunder-api.md 2.5)


def test_target_rules() -> None:
    targets = OversubscriptionTargets.model_validate(
        {
            "oversubscriptionTargets": [
                {"gpuType": "H100", "oversubscriptionTarget": 1.5},
                {"gpuType": "A6000", "oversubscriptionTarget": 0},
                {"gpuType": "L4", "oversubscriptionTarget": -2},
                {"gpuType": "nvidia-l40", "oversubscriptionTarget": None},
                "not-an-item",
                {"oversubscriptionTarget": 9},
            ],
            "defaultOversubscriptionTarget": 2,
        }
    )
    assert targets.target_for("h100") == 1.5
    assert targets.target_for("A6000") == 2.0
    assert targets.target_for("L4") == 2.0
    assert targets.target_for("NVIDIA-L40") == 2.0
    assert targets.target_for("B200") == 2.0
    no_default = OversubscriptionTargets.model_validate({"oversubscriptionTargets": []})
    assert no_default.target_for("H100") == 1.0
    assert oversubscription_target(None, "H100") == 1.0


def test_target_item_key_spellings() -> None:
    targets = OversubscriptionTargets.model_validate(
        {
            "oversubscriptionTargets": [{"model": "h100", "target": 3}],
            "defaultOversubscriptionTarget": 0,
        }
    )
    assert targets.target_for("H100") == 3.0
    assert targets.target_for("A100") == 1.0


@relaxed
@given(
    items=st.lists(
        st.fixed_dictionaries(
            {
                "gpuType": st.sampled_from(["H100", "h100", "A6000", None]),
                "oversubscriptionTarget": junk | st.floats(),
            }
        ),
        max_size=5,
    ),
    default=junk | st.floats(),
    model=st.sampled_from(["H100", "A6000", "L4"]),
)
def test_target_is_always_positive_and_finite(
    items: list[dict[str, Any]], default: Any, model: str
) -> None:
    try:
        targets = OversubscriptionTargets.model_validate(
            {"oversubscriptionTargets": items, "defaultOversubscriptionTarget": default}
        )
    except ValidationError:
        pytest.fail("targets of any shape must parse")
    value = targets.target_for(model)
    assert value > 0
    assert math.isfinite(value)
