"""Helpers shared by the plugin building-block tests."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class PlainSecret:
    value: str

    def reveal(self) -> str:
        return self.value


@dataclass(frozen=True)
class Identity:
    org_id: str
    client_id: str
    gpu_type: str
    gpu_count: int


@dataclass(frozen=True)
class Exchange:
    """Shaped like the Thunder client's EnrollmentExchange."""

    auth_token: PlainSecret
    jwt: PlainSecret
    claims: Identity


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def build_exchange(auth_token: str = "tcat_auth_secret", **payload: Any) -> Exchange:
    """An exchange answer: the auth token, a JWT and its decoded payload."""
    claims: dict[str, Any] = {
        "orgId": "org-1",
        "clientId": "client-1",
        "gpuType": "A6000",
        "gpuCount": 2,
    }
    claims.update(payload)
    jwt = ".".join((_b64(b'{"alg":"HS256"}'), _b64(json.dumps(claims).encode()), _b64(b"sig")))
    identity = Identity(
        org_id=claims["orgId"],
        client_id=claims["clientId"],
        gpu_type=claims["gpuType"],
        gpu_count=claims["gpuCount"],
    )
    return Exchange(auth_token=PlainSecret(auth_token), jwt=PlainSecret(jwt), claims=identity)


@pytest.fixture
def make_exchange() -> Callable[..., Exchange]:
    return build_exchange
