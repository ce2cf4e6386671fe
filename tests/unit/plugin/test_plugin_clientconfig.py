"""config.json: exactly the installer's keys, from the exchange, written safely, never logged."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from thunder_dra.plugin.files import clientconfig as cc

AUTH_TOKEN = "tcat_auth_5ecret_value"
KEYS = {
    "deviceId",
    "clientId",
    "orgId",
    "gpuType",
    "gpuCount",
    "centralApiUrl",
    "authToken",
    "claims",
    "enableGrpcTls",
    "thunderdDiscoveryEnabled",
    "telemetryCollector",
}
MakeExchange = Callable[..., Any]


def test_config_from_exchange(make_exchange: MakeExchange) -> None:
    exchange = make_exchange(AUTH_TOKEN, clientId="client-42", gpuType="nvidia-l4", gpuCount=3)
    config = cc.client_config_from_exchange(
        exchange, central_api_url="https://registry.thundercompute.com/"
    )
    data = json.loads(config.to_json())
    assert set(data) == KEYS
    assert data == {
        "deviceId": "client-42",
        "clientId": "client-42",
        "orgId": "org-1",
        "gpuType": "nvidia-l4",
        "gpuCount": 3,
        "centralApiUrl": "https://registry.thundercompute.com",
        "authToken": AUTH_TOKEN,
        "claims": exchange.jwt.reveal(),
        "enableGrpcTls": False,
        "thunderdDiscoveryEnabled": True,
        "telemetryCollector": "https://telemetry.thundercompute.com:2096",
    }


def test_the_thunder_clients_exchange_result_fits(make_exchange: MakeExchange) -> None:
    from thunder_dra.thunder.claims import decode_jwt_claims
    from thunder_dra.thunder.models import EnrollmentExchange
    from thunder_dra.thunder.redact import Secret

    jwt = Secret(make_exchange().jwt.reveal())
    exchange = EnrollmentExchange(
        auth_token=Secret(AUTH_TOKEN), jwt=jwt, claims=decode_jwt_claims(jwt)
    )
    config = cc.client_config_from_exchange(exchange, central_api_url="https://a")
    assert config.auth_token == AUTH_TOKEN
    assert config.claims == jwt.reveal()
    assert config.device_id == config.client_id == "client-1"


def test_secrets_stay_out_of_repr_and_errors(make_exchange: MakeExchange) -> None:
    exchange = make_exchange(AUTH_TOKEN)
    jwt = exchange.jwt.reveal()
    config = cc.client_config_from_exchange(exchange, central_api_url="https://api.example")
    for text in (repr(config), str(config)):
        assert AUTH_TOKEN not in text
        assert jwt not in text
    with pytest.raises(cc.ClientConfigError) as info:
        cc.client_config_from_exchange(make_exchange(""), central_api_url="https://a")
    assert "authToken" in str(info.value)
    bad = make_exchange(AUTH_TOKEN, gpuCount=0)
    with pytest.raises(cc.ClientConfigError, match="gpuCount") as info:
        cc.client_config_from_exchange(bad, central_api_url="https://a")
    assert AUTH_TOKEN not in str(info.value)
    assert bad.jwt.reveal() not in str(info.value)
    assert info.value.__cause__ is None


def test_device_id_must_be_the_client_id(make_exchange: MakeExchange) -> None:
    config = cc.client_config_from_exchange(make_exchange(), central_api_url="https://a")
    data = json.loads(config.to_json())
    data["deviceId"] = "someone-else"
    with pytest.raises(ValueError, match="deviceId"):
        cc.ClientConfig.model_validate(data)
    data["deviceId"] = data["clientId"]
    data["extra"] = 1
    with pytest.raises(ValueError, match="Extra inputs"):
        cc.ClientConfig.model_validate(data)


async def test_write_read_and_remove(tmp_path: Path, make_exchange: MakeExchange) -> None:
    config = cc.client_config_from_exchange(make_exchange(AUTH_TOKEN), central_api_url="https://a")
    directory = cc.claim_dir(tmp_path / "claims", "5d0c8f6e-3a1b-4c2d-9e8f-0a1b2c3d4e5f")
    path = await cc.write_client_config(directory, config)
    assert path == directory / "config.json"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert await cc.read_client_config(directory) == config
    assert await cc.write_client_config(directory, config) == path
    assert [p.name for p in directory.iterdir()] == ["config.json"]
    assert await cc.remove_claim_dir(directory) is True
    assert await cc.remove_claim_dir(directory) is False


async def test_a_damaged_config_is_reported_without_its_content(tmp_path: Path) -> None:
    tmp_path.joinpath("config.json").write_text(json.dumps({"authToken": AUTH_TOKEN}))
    with pytest.raises(cc.ClientConfigError, match="deviceId") as info:
        await cc.read_client_config(tmp_path)
    assert AUTH_TOKEN not in str(info.value)


@pytest.mark.parametrize("uid", ["", "..", "../etc", "a/b", ".hidden"])
def test_claim_dir_rejects_unsafe_uids(tmp_path: Path, uid: str) -> None:
    with pytest.raises(cc.ClientConfigError):
        cc.claim_dir(tmp_path, uid)
