"""The fake Thunder service's in-memory inventory and its JSON form.

The dump (``GET /_admin/state``), the replacement (``PUT /_admin/state``) and the seed file
(``--seed``) share one camelCase format, documented in ``README.md``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

FAKE_ORG_ID = "org-fake-0001"
# The fake signs its JWTs with a fixed key; clients never verify the signature (thunder-api.md 2.9).
_JWT_KEY = b"fake-thunder-signing-key"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def format_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_jwt(payload: dict[str, Any]) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(payload, separators=(",", ":")).encode())
    signature = hmac.new(_JWT_KEY, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


@dataclass
class ApiToken:
    token: str
    # None grants every capability; a list grants exactly those (thunder-api.md 2.10).
    capabilities: list[str] | None = None


@dataclass
class ZoneRec:
    zone_id: str
    display_name: str
    created_at: datetime


@dataclass
class HostRec:
    host_id: str
    zone_id: str
    display_name: str
    hostname: str
    gpu_type: str
    gpu_count: int
    created_at: datetime
    status: str = "active"
    cordoned: bool = False
    thunderd_version: str | None = "fake-thunderd-1.0"
    last_seen_at: datetime | None = None
    ip: str | None = None
    enrollment_token_id: str | None = None


@dataclass
class ClientRec:
    client_id: str
    zone_id: str
    display_name: str | None
    gpu_type: str
    gpu_count: int
    created_at: datetime
    updated_at: datetime
    auth_token: str
    enrollment_token_id: str | None = None
    decommissioned_at: datetime | None = None
    last_seen_at: datetime | None = None


@dataclass
class TokenRec:
    token_id: str
    secret: str
    role: str
    zone_id: str
    created_at: datetime
    gpu_type: str | None = None
    gpu_count: int | None = None
    expires_at: datetime | None = None
    spent_at: datetime | None = None
    revoked_at: datetime | None = None
    client_id: str | None = None
    host_id: str | None = None
    minted_by: str | None = None

    def state(self, now: datetime) -> str:
        """``revoked``, ``spent``, ``expired`` or ``unspent``, in that precedence."""
        if self.revoked_at is not None:
            return "revoked"
        if self.spent_at is not None:
            return "spent"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "unspent"


@dataclass
class TargetsRec:
    items: list[dict[str, Any]] = field(default_factory=list)
    default: float | None = None


@dataclass
class FakeState:
    org_id: str = FAKE_ORG_ID
    api_tokens: dict[str, ApiToken] = field(default_factory=dict)
    zones: dict[str, ZoneRec] = field(default_factory=dict)
    hosts: dict[str, HostRec] = field(default_factory=dict)
    clients: dict[str, ClientRec] = field(default_factory=dict)
    tokens: dict[str, TokenRec] = field(default_factory=dict)
    targets: dict[str, TargetsRec] = field(default_factory=dict)
    # Shifts the fake's clock so tests can expire tokens without waiting.
    clock_offset: timedelta = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.clock_offset

    def token_by_secret(self, secret: str) -> TokenRec | None:
        for token in self.tokens.values():
            if hmac.compare_digest(token.secret.encode(), secret.encode()):
                return token
        return None

    def zones_named(self, display_name: str) -> list[ZoneRec]:
        return sorted(
            (z for z in self.zones.values() if z.display_name == display_name),
            key=lambda z: z.zone_id,
        )

    def add_zone(self, display_name: str, zone_id: str | None = None) -> ZoneRec:
        zone = ZoneRec(zone_id or new_id("zone"), display_name, self.now())
        self.zones[zone.zone_id] = zone
        return zone

    def mint(
        self,
        *,
        role: str,
        zone_id: str,
        gpu_type: str | None,
        gpu_count: int | None,
        expires_in: int | None,
        minted_by: str | None,
    ) -> TokenRec:
        now = self.now()
        token = TokenRec(
            token_id=new_id("et"),
            secret=f"tr_{secrets.token_urlsafe(24)}",
            role=role,
            zone_id=zone_id,
            created_at=now,
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            expires_at=now + timedelta(seconds=expires_in) if expires_in else None,
            minted_by=minted_by,
        )
        self.tokens[token.token_id] = token
        return token

    def dump_host(self, host: HostRec) -> dict[str, Any]:
        return _dump_host(host)

    def dump(self) -> dict[str, Any]:
        return {
            "orgId": self.org_id,
            "apiTokens": [
                {"token": t.token, "capabilities": t.capabilities} for t in self.api_tokens.values()
            ],
            "zones": [
                {
                    "zoneId": z.zone_id,
                    "displayName": z.display_name,
                    "createdAt": format_time(z.created_at),
                }
                for z in self.zones.values()
            ],
            "hosts": [_dump_host(h) for h in self.hosts.values()],
            "clients": [_dump_client(c) for c in self.clients.values()],
            "enrollmentTokens": [_dump_token(t, self.now()) for t in self.tokens.values()],
            "oversubscriptionTargets": {
                zone_id: targets_body(t) for zone_id, t in self.targets.items()
            },
        }

    @classmethod
    def load(cls, data: dict[str, Any], *, keep_api_tokens: dict[str, ApiToken]) -> FakeState:
        """Build a state from the dump format; raises ValueError/KeyError/TypeError if bad."""
        now = datetime.now(UTC)
        state = cls(org_id=str(data.get("orgId") or FAKE_ORG_ID))
        if "apiTokens" in data:
            for item in data["apiTokens"]:
                caps = item.get("capabilities")
                state.api_tokens[item["token"]] = ApiToken(item["token"], caps)
        else:
            state.api_tokens = dict(keep_api_tokens)
        for item in data.get("zones", []):
            when = parse_time(item.get("createdAt")) or now
            zone = ZoneRec(item["zoneId"], item["displayName"], when)
            state.zones[zone.zone_id] = zone
        for item in data.get("hosts", []):
            host = _load_host(item, now)
            state.hosts[host.host_id] = host
        for item in data.get("clients", []):
            client = _load_client(item, now)
            state.clients[client.client_id] = client
        for item in data.get("enrollmentTokens", []):
            token = _load_token(item, now)
            state.tokens[token.token_id] = token
        for zone_id, body in (data.get("oversubscriptionTargets") or {}).items():
            state.targets[zone_id] = TargetsRec(
                list(body.get("oversubscriptionTargets") or []),
                body.get("defaultOversubscriptionTarget"),
            )
        return state


def targets_body(targets: TargetsRec) -> dict[str, Any]:
    body: dict[str, Any] = {"oversubscriptionTargets": list(targets.items)}
    if targets.default is not None:
        body["defaultOversubscriptionTarget"] = targets.default
    return body


def _dump_host(h: HostRec) -> dict[str, Any]:
    return {
        "hostId": h.host_id,
        "zoneId": h.zone_id,
        "displayName": h.display_name,
        "hostname": h.hostname,
        "gpuType": h.gpu_type,
        "gpuCount": h.gpu_count,
        "status": h.status,
        "cordoned": h.cordoned,
        "thunderdVersion": h.thunderd_version,
        "lastSeenAt": format_time(h.last_seen_at),
        "createdAt": format_time(h.created_at),
        "ip": h.ip,
        "enrollmentTokenId": h.enrollment_token_id,
    }


def _load_host(item: dict[str, Any], now: datetime) -> HostRec:
    return HostRec(
        host_id=item.get("hostId") or item["serverId"],
        zone_id=item["zoneId"],
        display_name=item.get("displayName") or item.get("hostname") or "",
        hostname=item.get("hostname") or item.get("displayName") or "",
        gpu_type=item["gpuType"],
        gpu_count=int(item["gpuCount"]),
        created_at=parse_time(item.get("createdAt")) or now,
        status=item.get("status", "active"),
        cordoned=bool(item.get("cordoned", False)),
        thunderd_version=item.get("thunderdVersion"),
        last_seen_at=parse_time(item.get("lastSeenAt")),
        ip=item.get("ip"),
        enrollment_token_id=item.get("enrollmentTokenId"),
    )


def _dump_client(c: ClientRec) -> dict[str, Any]:
    return {
        "clientId": c.client_id,
        "zoneId": c.zone_id,
        "displayName": c.display_name,
        "gpuType": c.gpu_type,
        "gpuCount": c.gpu_count,
        "createdAt": format_time(c.created_at),
        "updatedAt": format_time(c.updated_at),
        "lastSeenAt": format_time(c.last_seen_at),
        "decommissionedAt": format_time(c.decommissioned_at),
        "authToken": c.auth_token,
        "enrollmentTokenId": c.enrollment_token_id,
    }


def _load_client(item: dict[str, Any], now: datetime) -> ClientRec:
    created = parse_time(item.get("createdAt")) or now
    return ClientRec(
        client_id=item["clientId"],
        zone_id=item["zoneId"],
        display_name=item.get("displayName"),
        gpu_type=item["gpuType"],
        gpu_count=int(item["gpuCount"]),
        created_at=created,
        updated_at=parse_time(item.get("updatedAt")) or created,
        auth_token=item.get("authToken") or f"tca_{secrets.token_urlsafe(32)}",
        enrollment_token_id=item.get("enrollmentTokenId"),
        decommissioned_at=parse_time(item.get("decommissionedAt")),
        last_seen_at=parse_time(item.get("lastSeenAt")),
    )


def _dump_token(t: TokenRec, now: datetime) -> dict[str, Any]:
    return {
        "enrollmentTokenId": t.token_id,
        "enrollmentToken": t.secret,
        "role": t.role,
        "zoneId": t.zone_id,
        "gpuType": t.gpu_type,
        "gpuCount": t.gpu_count,
        "state": t.state(now),
        "createdAt": format_time(t.created_at),
        "expiresAt": format_time(t.expires_at),
        "spentAt": format_time(t.spent_at),
        "revokedAt": format_time(t.revoked_at),
        "clientId": t.client_id,
        "hostId": t.host_id,
        "mintedBy": t.minted_by,
    }


def _load_token(item: dict[str, Any], now: datetime) -> TokenRec:
    return TokenRec(
        token_id=item["enrollmentTokenId"],
        secret=item.get("enrollmentToken") or f"tr_{secrets.token_urlsafe(24)}",
        role=item["role"],
        zone_id=item["zoneId"],
        created_at=parse_time(item.get("createdAt")) or now,
        gpu_type=item.get("gpuType"),
        gpu_count=item.get("gpuCount"),
        expires_at=parse_time(item.get("expiresAt")),
        spent_at=parse_time(item.get("spentAt")),
        revoked_at=parse_time(item.get("revokedAt")),
        client_id=item.get("clientId"),
        host_id=item.get("hostId"),
        minted_by=item.get("mintedBy"),
    )


def token_view(t: TokenRec, state: FakeState) -> dict[str, Any]:
    """A token's record without its secret, with what it created (``GET /_admin/tokens``)."""
    view = _dump_token(t, state.now())
    del view["enrollmentToken"]
    client = state.clients.get(t.client_id) if t.client_id else None
    view["client"] = _dump_client(client) | {"authToken": None} if client else None
    host = state.hosts.get(t.host_id) if t.host_id else None
    view["host"] = _dump_host(host) if host else None
    return view
