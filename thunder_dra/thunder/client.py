"""The async Thunder API client (thunder-api.md section 2)."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry

from thunder_dra.thunder.aiotransport import AiohttpTransport
from thunder_dra.thunder.claims import JwtClaimsError, decode_jwt_claims
from thunder_dra.thunder.errors import (
    Conflict,
    Gone,
    NotFound,
    ThunderError,
    ThunderResponseError,
)
from thunder_dra.thunder.models import (
    ClientList,
    ClientRecord,
    ClientRevocation,
    EnrollmentExchange,
    ExchangeResponse,
    Host,
    HostList,
    MintedToken,
    UnenrollResult,
    Zone,
    ZoneList,
    smallest_zone_id,
)
from thunder_dra.thunder.redact import Secret
from thunder_dra.thunder.retry import (
    DEFAULT_RETRY,
    EXCHANGE_RETRY,
    Clock,
    RetryOn,
    RetryPolicy,
    SystemClock,
    retry_reason,
    run_with_retry,
)
from thunder_dra.thunder.targets import NEUTRAL_TARGET, OversubscriptionTargets
from thunder_dra.thunder.telemetry import metrics_for, tracer_for
from thunder_dra.thunder.wire import Endpoint, Wire, WireResponse
from thunder_dra.version import user_agent

DEFAULT_API_URL = "https://registry.thundercompute.com"
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_RESPONSE_BYTES = 10 * 1024 * 1024

ZONES = Endpoint("GET", "/api/v1/zones", RetryOn.IDEMPOTENT)
ENSURE_ZONE = Endpoint("POST", "/api/v1/zones/ensure", RetryOn.IDEMPOTENT)
HOSTS = Endpoint("GET", "/api/v1/hosts", RetryOn.IDEMPOTENT)
CLIENTS = Endpoint("GET", "/api/v1/clients", RetryOn.IDEMPOTENT)
TARGETS = Endpoint("GET", "/api/v1/zones/{zoneId}/oversubscription-targets", RetryOn.IDEMPOTENT)
MINT = Endpoint("POST", "/api/v1/enrollment-tokens", RetryOn.MINT)
UNENROLL = Endpoint(
    "DELETE", "/api/v1/enrollment-tokens/{enrollmentTokenId}/node", RetryOn.IDEMPOTENT
)
REVOKE_CLIENT = Endpoint("POST", "/api/v1/clients/{clientId}/revoke", RetryOn.IDEMPOTENT)
EXCHANGE = Endpoint("POST", "/api/v1/enrollment-tokens/enroll", RetryOn.EXCHANGE)

_log = logging.getLogger(__name__)


def normalize_base_url(url: str) -> str:
    """The API base URL with surrounding whitespace and trailing ``/`` removed."""
    trimmed = url.strip().rstrip("/")
    if not trimmed.startswith(("https://", "http://")):
        raise ValueError(f"Thunder API URL must start with https:// or http://, got {trimmed!r}")
    return trimmed


class ThunderClient:
    """Typed access to every endpoint of the contract, with its retry and error rules.

    ``transport`` (default: an :class:`AiohttpTransport`) carries every request and is
    closed with this object; ``clock`` and ``rng`` make retries testable;
    ``registry`` keeps metrics of separate clients apart; ``tracer_provider`` defaults to
    the global one.

    The thunder-api.md 2.2 path has an older spelling (``POST /api/v1/zones``) that is
    deliberately not used as a fallback: 2.2 is confirmed, and a 404 there more likely
    means a wrong base URL, which a fallback would hide behind a second, unconfirmed write.
    """

    def __init__(
        self,
        *,
        api_token: Secret | str,
        component: str,
        base_url: str = DEFAULT_API_URL,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        connect_timeout: float | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retry: RetryPolicy = DEFAULT_RETRY,
        exchange_retry: RetryPolicy = EXCHANGE_RETRY,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        token = Secret.of(api_token).stripped()
        if not token:
            raise ValueError("the Thunder API token is empty")
        self._api_token = token
        self.base_url = normalize_base_url(base_url)
        self._transport = transport if transport is not None else AiohttpTransport()
        self._retry = retry
        self._exchange_retry = exchange_retry
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()  # noqa: S311 - backoff jitter
        self._metrics = metrics_for(registry)
        self._wire = Wire(
            transport=self._transport,
            base_url=self.base_url,
            user_agent=user_agent(component),
            timeout=httpx.Timeout(timeout, connect=connect_timeout or timeout),
            max_response_bytes=max_response_bytes,
            metrics=self._metrics,
            tracer=tracer_for(tracer_provider),
            secrets=[token],
        )

    def __repr__(self) -> str:
        return f"ThunderClient(base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> ThunderClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _call(
        self,
        endpoint: Endpoint,
        path: str | None = None,
        *,
        bearer: Secret | None = None,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        policy: RetryPolicy | None = None,
    ) -> WireResponse:
        target = path if path is not None else endpoint.template
        credential = bearer if bearer is not None else self._api_token

        async def attempt(number: int, remaining: float) -> WireResponse:
            return await self._wire.send(
                endpoint,
                target,
                bearer=credential,
                body=body,
                params=params,
                attempt=number,
                time_cap=remaining,
            )

        def on_retry(error: ThunderError, number: int, wait: float) -> None:
            reason = retry_reason(error)
            self._metrics.retries.labels(endpoint.method, endpoint.template, reason).inc()
            _log.warning(
                "thunder request failed, retrying",
                extra={
                    "method": endpoint.method,
                    "endpoint": endpoint.template,
                    "attempt": number,
                    "retry_in_s": round(wait, 3),
                    "reason": reason,
                    "error": str(error),
                },
            )

        return await run_with_retry(
            attempt,
            policy=policy or self._retry,
            retry_on=endpoint.retry_on,
            clock=self._clock,
            rng=self._rng,
            on_retry=on_retry,
        )

    # Zones (thunder-api.md 2.1, 2.2)

    async def list_zones(self) -> list[Zone]:
        return (await self._call(ZONES)).parse(ZoneList).zones

    async def resolve_zone(self, display_name: str) -> str | None:
        """The ID of the zone named ``display_name`` (smallest among duplicates), or None."""
        return smallest_zone_id(await self.list_zones(), display_name)

    async def ensure_zone(self, display_name: str) -> str:
        """Create the zone if needed and return its ID as the zone list resolves it.

        The ID in the ensure answer is ignored: with duplicate names the list decides.
        """
        if not display_name:
            raise ValueError("a zone display name must not be empty")
        try:
            await self._call(ENSURE_ZONE, body={"displayName": display_name})
        except Conflict:
            _log.info("thunder zone already exists", extra={"zone": display_name})
        zone_id = await self.resolve_zone(display_name)
        if zone_id is None:
            raise ThunderResponseError(
                method=ENSURE_ZONE.method,
                path=ENSURE_ZONE.template,
                status=None,
                problem=f"zone {display_name!r} was ensured but is not in the zone list",
            )
        return zone_id

    # Inventory (thunder-api.md 2.3, 2.4, 2.5)

    async def list_hosts(self, zone_id: str | None = None) -> list[Host]:
        """Hosts, of one zone if given (filtered here too: the query may be ignored)."""
        params = {"zoneId": zone_id} if zone_id else None
        hosts = (await self._call(HOSTS, params=params)).parse(HostList).hosts
        return [h for h in hosts if not zone_id or h.zone_id == zone_id]

    async def list_clients(self, zone_id: str | None = None) -> list[ClientRecord]:
        """Clients, of one zone if given; decommissioned ones included (see ``live``)."""
        params = {"zoneId": zone_id} if zone_id else None
        clients = (await self._call(CLIENTS, params=params)).parse(ClientList).clients
        return [c for c in clients if not zone_id or c.zone_id == zone_id]

    async def get_oversubscription_targets(self, zone_id: str) -> OversubscriptionTargets:
        return (await self._call(TARGETS, TARGETS.path(zoneId=zone_id))).parse(
            OversubscriptionTargets
        )

    async def oversubscription_target(self, zone_id: str, gpu_type: str) -> float:
        """The target for one model; a failure to read the targets means 1x (thunder-api.md 2.5)."""
        try:
            targets = await self.get_oversubscription_targets(zone_id)
        except ThunderError as exc:
            _log.warning(
                "thunder oversubscription targets unreadable, using 1x",
                extra={"zone_id": zone_id, "gpu_type": gpu_type, "error": str(exc)},
            )
            return NEUTRAL_TARGET
        return targets.target_for(gpu_type)

    # Enrollment (thunder-api.md 2.6 - 2.9)

    async def mint_client_token(
        self,
        zone_id: str,
        gpu_type: str,
        gpu_count: int,
        *,
        expires_in_seconds: int | None = None,
    ) -> MintedToken:
        """Mint a single-use client enrollment token. ``gpu_type`` as Thunder spells it."""
        if not gpu_type:
            raise ValueError("gpu_type must not be empty")
        if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1:
            raise ValueError(f"gpu_count must be a positive int, got {gpu_count!r}")
        body: dict[str, Any] = {"zoneId": zone_id, "role": "client"}
        body.update(gpuType=gpu_type, gpuCount=gpu_count)
        return await self._mint(body, expires_in_seconds)

    async def mint_server_token(
        self, zone_id: str, *, expires_in_seconds: int | None = None
    ) -> MintedToken:
        """Mint a single-use server enrollment token for a host's installer."""
        return await self._mint({"zoneId": zone_id, "role": "server"}, expires_in_seconds)

    async def _mint(self, body: dict[str, Any], expires_in_seconds: int | None) -> MintedToken:
        if not body["zoneId"]:
            raise ValueError("zone_id must not be empty")
        if expires_in_seconds is not None:
            body["expiresInSeconds"] = expires_in_seconds
        response = await self._call(MINT, body=body)
        data = response.json_object()
        try:
            return response.parse(MintedToken, data)
        except ThunderResponseError as exc:
            token_id = (data or {}).get("enrollmentTokenId")
            if isinstance(token_id, str) and token_id:
                exc.created_id = token_id
                exc.add_note(f"Thunder minted enrollment token {token_id}; revoke it")
            raise

    async def unenroll(self, enrollment_token_id: str) -> UnenrollResult:
        """Revoke an enrollment token and delete what it was exchanged for; 404/410 = done."""
        path = UNENROLL.path(enrollmentTokenId=enrollment_token_id)
        try:
            response = await self._call(UNENROLL, path)
        except (NotFound, Gone):
            return UnenrollResult(enrollment_token_id=enrollment_token_id, already_gone=True)
        data = dict(response.json_object() or {})
        data.pop("alreadyGone", None)
        if not data.get("enrollmentTokenId"):
            data["enrollmentTokenId"] = enrollment_token_id
        return response.parse(UnenrollResult, data)

    async def revoke_client(self, client_id: str) -> ClientRevocation:
        """Decommission a client (it stays listed); 404/410 = already gone."""
        path = REVOKE_CLIENT.path(clientId=client_id)
        try:
            response = await self._call(REVOKE_CLIENT, path)
        except (NotFound, Gone):
            return ClientRevocation(client_id=client_id, already_gone=True)
        data = dict(response.json_object() or {})
        data.pop("alreadyGone", None)
        if not data.get("clientId"):
            data["clientId"] = client_id
        return response.parse(ClientRevocation, data)

    async def exchange(
        self, enrollment_token: Secret | str, hostname: str | None = None
    ) -> EnrollmentExchange:
        """Spend a client enrollment token for the client's credential (thunder-api.md 2.9).

        Authenticates with the enrollment token, not the API token. A payload without
        ``orgId``, ``clientId``, ``gpuType`` or a positive ``gpuCount`` is a failure.
        """
        token = Secret.of(enrollment_token).stripped()
        if not token:
            raise ValueError("the enrollment token is empty")
        body = {"hostname": hostname} if hostname else {}
        response = await self._call(EXCHANGE, bearer=token, body=body, policy=self._exchange_retry)
        wire = response.parse(ExchangeResponse)
        try:
            claims = decode_jwt_claims(wire.jwt)
        except JwtClaimsError as exc:
            raise response.unusable(str(exc)) from None
        return EnrollmentExchange(auth_token=wire.auth_token, jwt=wire.jwt, claims=claims)
