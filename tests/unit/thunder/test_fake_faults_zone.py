"""The fake Thunder's zone-bound faults (``zoneId``): a rule matches only requests whose
JSON body names its zone (one zone's mints), and a bad ``zoneId`` is refused naming the
field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hack.fake_thunder import AsyncFakeThunderAdmin, FakeAdminError, FakeThunder
from hack.fake_thunder.faults import FaultBook
from hack.fake_thunder.messages import FakeRequest, HttpError
from hack.fake_thunder.service import _body_zone
from thunder_dra.thunder import ServerError, ThunderClient

pytestmark = pytest.mark.unit

MINTS = "/api/v1/enrollment-tokens"


def _request(body: bytes, method: str = "POST", path: str = MINTS) -> FakeRequest:
    return FakeRequest(
        method=method,
        path=path,
        query={},
        headers={"content-type": "application/json"},
        body=body,
        base_url="http://fake-thunder",
    )


@pytest.mark.parametrize(
    ("body", "zone"),
    [
        (b'{"zoneId": "z-a", "role": "client"}', "z-a"),
        (b'  \n{"role": "server", "zoneId": "z-b"}', "z-b"),
        (b'{"role": "client"}', None),
        (b'{"zoneId": 7}', None),
        (b'{"zoneId": null}', None),
        (b"", None),
        (b"[1, 2]", None),
        (b'"z-a"', None),
        (b"{not json", None),
        (b"{\xff\xfe}", None),
    ],
)
def test_the_zone_a_request_names_is_read_from_its_json_body(body: bytes, zone: str | None) -> None:
    assert _body_zone(_request(body)) == zone


def test_a_zone_bound_rule_matches_only_that_zones_requests() -> None:
    book = FaultBook()
    rule = book.add({"path": MINTS, "method": "POST", "status": 503, "zoneId": "z-a"})
    assert book.take("POST", MINTS, "z-b") is None
    assert book.take("POST", MINTS, None) is None
    assert book.take("POST", MINTS) is None
    assert book.take("POST", MINTS, "z-a") is rule
    assert book.take("POST", MINTS, "z-a") is rule, "no times: stays until cleared"
    assert book.take("GET", MINTS, "z-a") is None, "the method still has to match"
    assert book.to_json()[0]["zoneId"] == "z-a"


def test_a_one_shot_zone_rule_is_used_up_only_by_its_zone() -> None:
    book = FaultBook()
    book.add({"path": "/api/v1/*", "status": 500, "zoneId": "z-a", "times": 1})
    other = book.add({"path": "/api/v1/*", "status": 502})
    assert book.take("POST", MINTS, "z-b") is other
    assert book.take("POST", MINTS, "z-a") is not other
    assert book.take("POST", MINTS, "z-a") is other
    assert [r["zoneId"] for r in book.to_json()] == [None]


def test_a_rule_without_a_zone_matches_every_zone_and_none() -> None:
    book = FaultBook()
    rule = book.add({"path": MINTS, "status": 503})
    assert rule.zone_id is None
    assert all(book.take("POST", MINTS, zone) is rule for zone in ("z-a", "z-b", None))


@pytest.mark.parametrize("zone", ["", 7, ["z-a"], {"id": "z-a"}, True])
def test_a_bad_zone_id_is_refused_naming_the_field(zone: Any) -> None:
    book = FaultBook()
    with pytest.raises(HttpError) as caught:
        book.add({"path": MINTS, "status": 503, "zoneId": zone})
    assert caught.value.status == 400
    assert "zoneId" in str(caught.value.message)
    assert book.to_json() == []


async def test_mints_fail_in_the_faulted_zone_only(
    fake: FakeThunder, fake_client: ThunderClient, admin: AsyncFakeThunderAdmin
) -> None:
    zone_a = await fake_client.ensure_zone("zone-a")
    zone_b = await fake_client.ensure_zone("zone-b")
    await admin.add_fault(MINTS, method="POST", status=500, zone_id=zone_a)
    minted = await fake_client.mint_client_token(zone_b, "H100", 1)
    assert minted.enrollment_token_id
    with pytest.raises(ServerError):
        await fake_client.mint_client_token(zone_a, "H100", 1)
    [rule] = await admin.faults()
    assert rule["zoneId"] == zone_a
    mints = [w for w in await admin.writes() if w["path"] == MINTS]
    assert [(w["body"]["zoneId"], w["status"], w["fault"]) for w in mints] == [
        (zone_b, 200, None),
        (zone_a, 500, "fault-1"),
    ], "one refused mint in zone A, not retried"


async def test_the_admin_api_refuses_a_bad_zone_id_with_400(
    fake: FakeThunder, admin: AsyncFakeThunderAdmin
) -> None:
    with pytest.raises(FakeAdminError) as caught:
        await admin.add_fault(MINTS, status=503, zone_id="")
    assert caught.value.status == 400
    assert "zoneId" in str(caught.value)
    answer = await fake.handle(
        _request(
            json.dumps({"path": MINTS, "status": 503, "zoneId": 7}).encode(),
            path="/_admin/faults",
        )
    )
    assert answer.status == 400
    assert "zoneId must be a string" in json.loads(answer.body)["message"]
    assert await admin.faults() == []
