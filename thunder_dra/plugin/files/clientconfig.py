"""A claim's ``config.json``: what libthunder reads at ``/etc/thunder/config.json``.

Exactly the keys the Thunder installer writes (thunder-api.md 4), built from the result
of exchanging the claim's enrollment token (the Thunder client's ``EnrollmentExchange``,
taken structurally): the JWT payload names the client, and the ``authToken`` is the
long-lived client credential the library presents. The file therefore necessarily holds
that credential (never the enrollment token); it lives in the claim's root-only directory
(mode 0700) and is readable (0644) only through the container's bind mount. The model
keeps ``authToken`` and the raw JWT out of ``repr`` and out of validation errors, so
neither reaches a log.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Protocol

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from thunder_dra import fsutil
from thunder_dra.spans import step_span

CONFIG_FILE_NAME = "config.json"
_tracer = trace.get_tracer(__name__)
DEFAULT_TELEMETRY_COLLECTOR = "https://telemetry.thundercompute.com:2096"
CLAIM_DIR_MODE = 0o700
CONFIG_FILE_MODE = 0o644
_CLAIM_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ClientConfigError(ValueError):
    """The exchange result cannot make a valid config (the message never holds a secret)."""


class Revealable(Protocol):
    """A masked secret (``thunder_dra.thunder.redact.Secret``)."""

    def reveal(self) -> str: ...


class ClientIdentity(Protocol):
    """The exchange JWT's payload, decoded (``thunder_dra.thunder.claims.JwtClaims``)."""

    @property
    def org_id(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...


class ExchangeResult(Protocol):
    """A completed exchange (``thunder_dra.thunder.models.EnrollmentExchange``)."""

    @property
    def auth_token(self) -> Revealable: ...
    @property
    def jwt(self) -> Revealable: ...
    @property
    def claims(self) -> ClientIdentity: ...


class ClientConfig(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    device_id: str = Field(alias="deviceId", min_length=1)
    client_id: str = Field(alias="clientId", min_length=1)
    org_id: str = Field(alias="orgId", min_length=1)
    gpu_type: str = Field(alias="gpuType", min_length=1)
    gpu_count: int = Field(alias="gpuCount", gt=0)
    central_api_url: str = Field(alias="centralApiUrl", min_length=1)
    auth_token: str = Field(alias="authToken", min_length=1, repr=False)
    claims: str = Field(min_length=1, repr=False)  # the raw JWT
    enable_grpc_tls: bool = Field(default=False, alias="enableGrpcTls")
    thunderd_discovery_enabled: bool = Field(default=True, alias="thunderdDiscoveryEnabled")
    telemetry_collector: str = Field(
        default=DEFAULT_TELEMETRY_COLLECTOR, alias="telemetryCollector"
    )

    @model_validator(mode="after")
    def _device_is_client(self) -> ClientConfig:
        if self.device_id != self.client_id:
            raise ValueError("deviceId must equal clientId")
        return self

    def to_json(self) -> bytes:
        return (self.model_dump_json(by_alias=True, indent=2) + "\n").encode()


def _fields(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors(include_input=False)
    )


def client_config_from_exchange(
    exchange: ExchangeResult,
    *,
    central_api_url: str,
    telemetry_collector: str = DEFAULT_TELEMETRY_COLLECTOR,
) -> ClientConfig:
    """The ``config.json`` for a completed exchange (its JWT payload already checked)."""
    identity = exchange.claims
    try:
        # By the file's key names, so an error names the key as it appears in config.json.
        return ClientConfig.model_validate(
            {
                "deviceId": identity.client_id,
                "clientId": identity.client_id,
                "orgId": identity.org_id,
                "gpuType": identity.gpu_type,
                "gpuCount": identity.gpu_count,
                "centralApiUrl": central_api_url.rstrip("/"),
                "authToken": exchange.auth_token.reveal(),
                "claims": exchange.jwt.reveal(),
                "telemetryCollector": telemetry_collector,
            }
        )
    except ValidationError as err:
        raise ClientConfigError(f"client config: {_fields(err)}") from None


def claim_dir(root: Path, claim_uid: str) -> Path:
    """The claim's directory under ``root`` (one path component named by the UID)."""
    if not _CLAIM_UID.match(claim_uid):
        raise ClientConfigError(f"claim UID {claim_uid!r} is not a safe directory name")
    return root / claim_uid


def _write_sync(directory: Path, content: bytes) -> Path:
    fsutil.ensure_dir(directory, CLAIM_DIR_MODE)
    path = directory / CONFIG_FILE_NAME
    fsutil.write_atomic(path, content, mode=CONFIG_FILE_MODE)
    return path


async def write_client_config(directory: Path, config: ClientConfig) -> Path:
    """Write ``config.json`` atomically into the claim's directory; returns its path.

    Its span names the file, never what it holds (the client's credential)."""
    path = directory / CONFIG_FILE_NAME
    with step_span(_tracer, "thunder_dra.client_config.write", attributes={"file.path": str(path)}):
        return await asyncio.to_thread(_write_sync, directory, config.to_json())


async def read_client_config(directory: Path) -> ClientConfig:
    """The claim's current ``config.json`` (to rebuild CDI specs after a reboot)."""
    data = await fsutil.read_bytes_async(directory / CONFIG_FILE_NAME)
    try:
        return ClientConfig.model_validate_json(data)
    except ValidationError as err:
        raise ClientConfigError(f"{directory / CONFIG_FILE_NAME}: {_fields(err)}") from None


def _remove_dir_sync(directory: Path, durable: bool = True) -> bool:
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    if durable:
        fsutil.fsync_dir(directory.parent)
    return True


async def remove_claim_dir(directory: Path, *, durable: bool = True) -> bool:
    """Delete the claim's directory and its files; a missing one is done already.

    ``durable=False``: on the event loop (a few unlinks of the claim's own files, cheaper
    than a thread hand-off), without the fsync of the parent directory; the caller fsyncs
    it before it relies on the removal surviving a power loss."""
    with step_span(
        _tracer, "thunder_dra.claim_dir.remove", attributes={"file.path": str(directory)}
    ):
        if not durable:
            return _remove_dir_sync(directory, durable=False)
        return await asyncio.to_thread(_remove_dir_sync, directory)
