"""The JWT an exchange returns (thunder-api.md 2.9): decode and check its payload.

The signature is not verified (the client cannot: Thunder holds the key). A payload that
lacks a field, or has one of the wrong type, means the exchange failed.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from thunder_dra.thunder.redact import Secret


class JwtClaimsError(ValueError):
    """The JWT is not three dot-separated parts with a valid payload. Never holds the JWT."""


class JwtClaims(BaseModel):
    """The payload fields this project relies on; they also go into ``config.json``."""

    model_config = ConfigDict(extra="ignore", frozen=True, validate_by_alias=True)

    org_id: StrictStr = Field(alias="orgId", min_length=1)
    client_id: StrictStr = Field(alias="clientId", min_length=1)
    gpu_type: StrictStr = Field(alias="gpuType", min_length=1)
    gpu_count: Annotated[StrictInt, Field(alias="gpuCount", gt=0)]


def _b64url_decode(part: str) -> bytes:
    padded = part + "=" * (-len(part) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def decode_jwt_claims(jwt: Secret | str) -> JwtClaims:
    """Decode the payload of ``jwt`` and check the fields of thunder-api.md 2.9.

    Raises :class:`JwtClaimsError` naming the problem (never the token's content).
    """
    text = jwt.reveal() if isinstance(jwt, Secret) else jwt
    parts = text.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        raise JwtClaimsError(f"jwt has {len(parts)} dot-separated parts, expected 3")
    try:
        payload = json.loads(_b64url_decode(parts[1]))
    except (binascii.Error, ValueError, UnicodeError) as exc:
        problem = type(exc).__name__
        raise JwtClaimsError(f"jwt payload is not base64url-encoded JSON: {problem}") from None
    if not isinstance(payload, dict):
        raise JwtClaimsError(f"jwt payload is a JSON {type(payload).__name__}, expected an object")
    try:
        return JwtClaims.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise JwtClaimsError(f"jwt payload is invalid: {problems}") from None
