"""The public Thunder API of the fake service (thunder-api.md 2 and 6.1), stateful and in memory.

Capabilities guarding each endpoint (the real mapping is unknown, thunder-api.md 2.10; a token
without a capability list has them all):

- GET zones, GET oversubscription-targets: ``zones:read``; ensure: ``zones:create``
- GET hosts: ``hosts:read``; GET clients: ``clients:read``
- mint: ``client_enrollment_tokens:create`` or ``server_enrollment_tokens:create`` by role
- unenroll (thunder-api.md 2.7): ``clients:revoke`` for client tokens, ``hosts:revoke``
  for server tokens
- revoke client (thunder-api.md 2.8): ``clients:revoke``
- exchange (thunder-api.md 2.9) takes a client enrollment token, never an API token.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from hack.fake_thunder.messages import FakeRequest, FakeResponse, HttpError, json_response
from hack.fake_thunder.routing import Route, route
from hack.fake_thunder.state import (
    ApiToken,
    ClientRec,
    FakeState,
    HostRec,
    TokenRec,
    format_time,
    new_id,
    sign_jwt,
    targets_body,
)

if TYPE_CHECKING:
    from hack.fake_thunder.service import FakeThunder


_MINT_CAPABILITIES = ("client_enrollment_tokens:create", "server_enrollment_tokens:create")


def _positive_int(value: Any) -> bool:
    return type(value) is int and value > 0


def spendable_token(state: FakeState, secret: str | None, role: str) -> TokenRec:
    """The unspent token of ``role`` behind ``secret``, else 403 saying why."""
    token = state.token_by_secret(secret) if secret else None
    if token is None:
        raise HttpError(403, "invalid enrollment token")
    if token.role != role:
        raise HttpError(403, f"not a {role} enrollment token")
    condition = token.state(state.now())
    if condition == "spent":
        raise HttpError(403, "enrollment token already used")
    if condition != "unspent":
        raise HttpError(403, f"enrollment token {condition}")
    return token


class PublicApi:
    def __init__(self, service: FakeThunder) -> None:
        self._service = service

    def routes(self) -> list[Route]:
        return [
            route("GET", "/api/v1/zones", self.list_zones),
            route("POST", "/api/v1/zones/ensure", self.ensure_zone),
            route("GET", "/api/v1/hosts", self.list_hosts),
            route("GET", "/api/v1/clients", self.list_clients),
            route("GET", "/api/v1/zones/{zoneId}/oversubscription-targets", self.targets),
            route("POST", "/api/v1/enrollment-tokens", self.mint),
            route("POST", "/api/v1/enrollment-tokens/enroll", self.exchange),
            route("DELETE", "/api/v1/enrollment-tokens/{tokenId}/node", self.unenroll),
            route("POST", "/api/v1/clients/{clientId}/revoke", self.revoke_client),
        ]

    def _require(self, request: FakeRequest, *capabilities: str) -> ApiToken:
        """401 for a missing or unknown API token, 403 if it holds none of ``capabilities``."""
        bearer = request.bearer()
        if bearer is None:
            raise HttpError(401, "Unauthorized", "missing bearer token")
        token = self._service.state.api_tokens.get(bearer)
        if token is None:
            raise HttpError(401, "Unauthorized", "unknown API token")
        if token.capabilities is not None and not set(capabilities) & set(token.capabilities):
            raise HttpError(403, "forbidden", "missing capability")
        return token

    def _created(self) -> int:
        return 201 if self._service.switches.created201 else 200

    def _not_found(self, what: str) -> HttpError:
        if self._service.switches.gone_on_revoke_unknown:
            return HttpError(410, "Gone", f"{what} not found")
        return HttpError(404, "NotFound", f"{what} not found")

    def host_json(self, host: HostRec) -> dict[str, Any]:
        id_key = "serverId" if self._service.switches.server_id_spelling else "hostId"
        return {
            id_key: host.host_id,
            "zoneId": host.zone_id,
            "displayName": host.display_name,
            "hostname": host.hostname,
            "gpuType": host.gpu_type,
            "gpuCount": host.gpu_count,
            "status": host.status,
            "thunderdVersion": host.thunderd_version,
            "lastSeenAt": format_time(host.last_seen_at),
            "configurations": {"cordoned": host.cordoned},
        }

    @staticmethod
    def client_json(client: ClientRec) -> dict[str, Any]:
        return {
            "clientId": client.client_id,
            "zoneId": client.zone_id,
            "displayName": client.display_name,
            "gpuType": client.gpu_type,
            "gpuCount": client.gpu_count,
            "createdAt": format_time(client.created_at),
            "updatedAt": format_time(client.updated_at),
            "lastSeenAt": format_time(client.last_seen_at),
            "decommissionedAt": format_time(client.decommissioned_at),
        }

    def _zone_filter(self, request: FakeRequest) -> str | None:
        if self._service.switches.ignore_zone_query:
            return None
        return request.query.get("zoneId") or None

    def list_zones(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "zones:read")
        state = self._service.state
        zones = []
        for zone in sorted(state.zones.values(), key=lambda z: z.zone_id):
            hosts = [h for h in state.hosts.values() if h.zone_id == zone.zone_id]
            live = [
                c
                for c in state.clients.values()
                if c.zone_id == zone.zone_id and c.decommissioned_at is None
            ]
            zones.append(
                {
                    "zoneId": zone.zone_id,
                    "displayName": zone.display_name,
                    "nodeCount": len(hosts),
                    "clientCount": len(live),
                    "createdAt": format_time(zone.created_at),
                }
            )
        return json_response(200, {"zones": zones})

    def ensure_zone(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "zones:create")
        name = request.json().get("displayName")
        if not isinstance(name, str) or not name:
            raise HttpError(400, "BadRequest", "displayName must be a non-empty string")
        state = self._service.state
        existing = state.zones_named(name)
        if existing:
            if self._service.switches.conflict_on_ensure:
                raise HttpError(409, "Conflict", "zone already exists")
            zone, status = existing[0], 200
        else:
            zone, status = state.add_zone(name), self._created()
        body = {"zoneId": zone.zone_id, "displayName": zone.display_name, "orgId": state.org_id}
        return json_response(status, body)

    def list_hosts(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "hosts:read")
        zone_id = self._zone_filter(request)
        hosts = [
            self.host_json(h)
            for h in self._service.state.hosts.values()
            if zone_id is None or h.zone_id == zone_id
        ]
        return json_response(200, {"hosts": hosts})

    def list_clients(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "clients:read")
        zone_id = self._zone_filter(request)
        clients = [
            self.client_json(c)
            for c in self._service.state.clients.values()
            if zone_id is None or c.zone_id == zone_id
        ]
        return json_response(200, {"clients": clients})

    def targets(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "zones:read")
        state = self._service.state
        zone_id = params["zoneId"]
        if zone_id not in state.zones:
            raise HttpError(404, "NotFound", "zone not found")
        found = state.targets.get(zone_id)
        body = targets_body(found) if found else {"oversubscriptionTargets": []}
        return json_response(200, body)

    def mint(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        body = request.json()
        role = body.get("role")
        if role not in ("client", "server"):
            self._require(request, *_MINT_CAPABILITIES)
            raise HttpError(400, "BadRequest", "role must be 'client' or 'server'")
        self._require(request, f"{role}_enrollment_tokens:create")
        state = self._service.state
        zone_id = body.get("zoneId")
        if not isinstance(zone_id, str) or zone_id not in state.zones:
            raise HttpError(404, "NotFound", "zone not found")
        gpu_type, gpu_count = body.get("gpuType"), body.get("gpuCount")
        if role == "client":
            if not isinstance(gpu_type, str) or not gpu_type:
                raise HttpError(400, "BadRequest", "gpuType must be a non-empty string")
            if not _positive_int(gpu_count):
                raise HttpError(400, "BadRequest", "gpuCount must be an int > 0")
        else:
            gpu_type = gpu_count = None
        expires_in = body.get("expiresInSeconds")
        if expires_in is not None and not _positive_int(expires_in):
            raise HttpError(400, "BadRequest", "expiresInSeconds must be an int > 0")
        token = state.mint(
            role=role,
            zone_id=zone_id,
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            expires_in=expires_in,
            minted_by=request.headers.get("user-agent"),
        )
        answer: dict[str, Any] = {
            "enrollmentTokenId": token.token_id,
            "enrollmentToken": token.secret,
            "role": token.role,
            "expiresAt": format_time(token.expires_at),
            "orgId": state.org_id,
            "zoneId": token.zone_id,
        }
        if role == "client":
            answer.update(gpuType=token.gpu_type, gpuCount=token.gpu_count)
        return json_response(self._created(), answer)

    def exchange(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        if "authorization" not in request.headers:
            raise HttpError(401, "Unauthorized", "missing bearer token")
        token = spendable_token(self._service.state, request.bearer(), "client")
        hostname = request.json(required=False).get("hostname")
        if hostname is not None and not isinstance(hostname, str):
            raise HttpError(400, "BadRequest", "hostname must be a string")
        state = self._service.state
        now = state.now()
        assert token.gpu_type is not None
        assert token.gpu_count is not None
        client = ClientRec(
            client_id=new_id("cl"),
            zone_id=token.zone_id,
            display_name=hostname,
            gpu_type=token.gpu_type,
            gpu_count=token.gpu_count,
            created_at=now,
            updated_at=now,
            auth_token=f"tca_{secrets.token_urlsafe(32)}",
            enrollment_token_id=token.token_id,
        )
        state.clients[client.client_id] = client
        token.spent_at, token.client_id = now, client.client_id
        claims = {
            "orgId": state.org_id,
            "clientId": client.client_id,
            "gpuType": client.gpu_type,
            "gpuCount": client.gpu_count,
            "iat": int(now.timestamp()),
        }
        answer = {"authToken": client.auth_token, "jwt": sign_jwt(claims)}
        return json_response(self._created(), answer)

    def unenroll(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        state = self._service.state
        token = state.tokens.get(params["tokenId"])
        if token is None:
            self._require(request, "clients:revoke", "hosts:revoke")
            raise self._not_found("enrollment token")
        self._require(request, "clients:revoke" if token.role == "client" else "hosts:revoke")
        if token.revoked_at is not None:
            raise self._not_found("enrollment token")
        now = state.now()
        token.revoked_at = now
        answer: dict[str, Any] = {
            "enrollmentTokenId": token.token_id,
            "nodeDeleted": False,
            "role": token.role,
        }
        client = state.clients.get(token.client_id) if token.client_id else None
        if client is not None:
            answer["clientId"] = client.client_id
            if (
                client.decommissioned_at is None
                and not self._service.switches.keep_client_on_unenroll
            ):
                client.decommissioned_at = client.updated_at = now
                answer.update(nodeDeleted=True, deletedAt=format_time(now))
        host = state.hosts.pop(token.host_id, None) if token.host_id else None
        if host is not None:
            id_key = "serverId" if self._service.switches.server_id_spelling else "hostId"
            answer.update(
                {id_key: host.host_id, "nodeDeleted": True, "deletedAt": format_time(now)}
            )
        return json_response(200, answer)

    def revoke_client(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._require(request, "clients:revoke")
        state = self._service.state
        client = state.clients.get(params["clientId"])
        if client is None:
            raise self._not_found("client")
        if client.decommissioned_at is None:
            client.decommissioned_at = client.updated_at = state.now()
        answer = {
            "clientId": client.client_id,
            "decommissionedAt": format_time(client.decommissioned_at),
        }
        return json_response(200, answer)
