"""The fake service's ``/_admin/`` endpoints (thunder-api.md 6.2): unauthenticated, never logged,
never faulted. ``README.md`` lists them with their bodies."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hack.fake_thunder.artifact_host import ARTIFACT_PREFIX
from hack.fake_thunder.audit import audit
from hack.fake_thunder.library import library, library_sha256
from hack.fake_thunder.messages import (
    FakeRequest,
    FakeResponse,
    HttpError,
    json_response,
    no_content,
)
from hack.fake_thunder.public_api import spendable_token
from hack.fake_thunder.routing import Handler, Route, route
from hack.fake_thunder.state import (
    ApiToken,
    FakeState,
    HostRec,
    TargetsRec,
    format_time,
    new_id,
    parse_time,
    token_view,
)

if TYPE_CHECKING:
    from hack.fake_thunder.service import FakeThunder

P = "/_admin"


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise HttpError(400, "BadRequest", message)


def _is_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


class AdminApi:
    def __init__(self, service: FakeThunder) -> None:
        self._service = service

    @property
    def _state(self) -> FakeState:
        return self._service.state

    def routes(self) -> list[Route]:
        return [
            route("GET", f"{P}/state", self._show(lambda: self._state.dump())),
            route("PUT", f"{P}/state", self.replace_state),
            route("POST", f"{P}/reset", self.reset),
            route("POST", f"{P}/api-tokens", self.add_api_token),
            route("POST", f"{P}/zones", self.add_zone),
            route("PUT", f"{P}/zones/{{zoneId}}/oversubscription-targets", self.set_targets),
            route("POST", f"{P}/hosts", self.add_host),
            route("PATCH", f"{P}/hosts/{{hostId}}", self.patch_host),
            route("DELETE", f"{P}/hosts/{{hostId}}", self.delete_host),
            route("GET", f"{P}/tokens", self.list_tokens),
            route("GET", f"{P}/tokens/{{tokenId}}", self.get_token),
            route("GET", f"{P}/writes", self._show(lambda: self._service.writes)),
            route("DELETE", f"{P}/writes", self.clear_writes),
            route(
                "GET",
                f"{P}/faults",
                lambda r, p: json_response(200, self._service.faults.to_json()),
            ),
            route("POST", f"{P}/faults", self.add_fault),
            route("DELETE", f"{P}/faults", self.clear_faults),
            route("DELETE", f"{P}/faults/{{faultId}}", self.remove_fault),
            route("GET", f"{P}/switches", self._show(lambda: self._service.switches.to_json())),
            route("PUT", f"{P}/switches", self.set_switches),
            route("GET", f"{P}/audit", self._show(lambda: audit(self._state))),
            route("GET", f"{P}/downloads", self._show(lambda: self._service.downloads)),
            route("DELETE", f"{P}/downloads", self.clear_downloads),
            route("GET", f"{P}/artifacts", self.artifacts),
            route("POST", f"{P}/clock", self.advance_clock),
        ]

    @staticmethod
    def _show(read: Callable[[], Any]) -> Handler:
        def handler(request: FakeRequest, params: dict[str, str]) -> FakeResponse:
            return json_response(200, read())

        return handler

    def replace_state(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        try:
            state = FakeState.load(request.json(), keep_api_tokens=self._state.api_tokens)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise HttpError(400, "BadRequest", f"bad state: {type(exc).__name__}: {exc}") from None
        state.clock_offset = self._state.clock_offset
        self._service.state = state
        return json_response(200, state.dump())

    def reset(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._service.reset()
        return no_content()

    def add_api_token(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        body = request.json(required=False)
        token = body.get("token") or f"tcapi_fake_{secrets.token_urlsafe(18)}"
        capabilities = body.get("capabilities")
        _need(isinstance(token, str), "token must be a string")
        _need(
            capabilities is None
            or (isinstance(capabilities, list) and all(isinstance(c, str) for c in capabilities)),
            "capabilities must be a list of strings or null",
        )
        self._state.api_tokens[token] = ApiToken(token, capabilities)
        return json_response(200, {"token": token, "capabilities": capabilities})

    def add_zone(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        body = request.json()
        name, zone_id = body.get("displayName"), body.get("zoneId")
        _need(isinstance(name, str) and bool(name), "displayName must be a non-empty string")
        _need(zone_id is None or _is_str(zone_id), "zoneId must be a non-empty string")
        assert isinstance(name, str)
        if zone_id in self._state.zones:
            raise HttpError(409, "Conflict", f"zone {zone_id} exists")
        zone = self._state.add_zone(name, zone_id)
        answer = {"zoneId": zone.zone_id, "displayName": zone.display_name}
        return json_response(200, answer | {"createdAt": format_time(zone.created_at)})

    def set_targets(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        zone_id = params["zoneId"]
        if zone_id not in self._state.zones:
            raise HttpError(404, "NotFound", "zone not found")
        body = request.json()
        items = body.get("oversubscriptionTargets") or []
        _need(isinstance(items, list), "oversubscriptionTargets must be a list")
        # Items are stored as given, so tests can serve odd shapes to the client.
        self._state.targets[zone_id] = TargetsRec(items, body.get("defaultOversubscriptionTarget"))
        return json_response(200, body)

    def add_host(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        """A host from a server token (as thunderd registers) or straight into a zone."""
        body = request.json()
        state = self._state
        token = None
        if body.get("enrollmentToken") is not None:
            token = spendable_token(state, body["enrollmentToken"], "server")
            zone = state.zones.get(token.zone_id)
            if zone is None:
                raise HttpError(404, "NotFound", "the token's zone no longer exists")
            wanted = body.get("zoneName")
            if wanted is not None and wanted != zone.display_name:
                raise HttpError(
                    400, "BadRequest", f"zoneName {wanted!r} is not the token's zone name"
                )
            zone_id = zone.zone_id
        else:
            wanted_id = body.get("zoneId")
            if not isinstance(wanted_id, str) or wanted_id not in state.zones:
                raise HttpError(404, "NotFound", "zone not found")
            zone_id = wanted_id
        gpu_type, gpu_count = body.get("gpuType"), body.get("gpuCount")
        if not isinstance(gpu_type, str) or not gpu_type:
            raise HttpError(400, "BadRequest", "gpuType must be a non-empty string")
        if type(gpu_count) is not int or gpu_count < 0:
            raise HttpError(400, "BadRequest", "gpuCount must be an int >= 0")
        host_id = body.get("hostId") or new_id("host")
        if host_id in state.hosts:
            raise HttpError(409, "Conflict", f"host {host_id} exists")
        hostname = body.get("hostname") or body.get("displayName") or host_id
        now = state.now()
        host = HostRec(
            host_id=host_id,
            zone_id=zone_id,
            display_name=body.get("displayName") or hostname,
            hostname=hostname,
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            created_at=now,
            status=body.get("status", "active"),
            cordoned=bool(body.get("cordoned", False)),
            thunderd_version=body.get("thunderdVersion", "fake-thunderd-1.0"),
            last_seen_at=now,
            ip=body.get("ip"),
            enrollment_token_id=token.token_id if token else None,
        )
        state.hosts[host_id] = host
        if token is not None:
            token.spent_at, token.host_id = now, host_id
        return json_response(200, state.dump_host(host))

    def patch_host(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        host = self._state.hosts.get(params["hostId"])
        if host is None:
            raise HttpError(404, "NotFound", "host not found")
        body = request.json()
        checks: dict[str, Callable[[Any], bool]] = {
            "status": lambda v: isinstance(v, str),
            "cordoned": lambda v: type(v) is bool,
            "gpuType": _is_str,
            "gpuCount": _is_count,
            "thunderdVersion": lambda v: v is None or isinstance(v, str),
            "lastSeenAt": lambda v: v is None or isinstance(v, str),
        }
        for key, value in body.items():
            _need(key in checks and checks[key](value), f"cannot set {key!r} to {value!r}")
        attributes = {
            "status": "status",
            "cordoned": "cordoned",
            "gpuType": "gpu_type",
            "gpuCount": "gpu_count",
            "thunderdVersion": "thunderd_version",
        }
        for key, value in body.items():
            if key == "lastSeenAt":
                host.last_seen_at = parse_time(value)
            else:
                setattr(host, attributes[key], value)
        return json_response(200, self._state.dump_host(host))

    def delete_host(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        if self._state.hosts.pop(params["hostId"], None) is None:
            raise HttpError(404, "NotFound", "host not found")
        return no_content()

    def list_tokens(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        views = [token_view(t, self._state) for t in self._state.tokens.values()]
        return json_response(200, views)

    def get_token(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        token = self._state.tokens.get(params["tokenId"])
        if token is None:
            raise HttpError(404, "NotFound", "enrollment token not found")
        return json_response(200, token_view(token, self._state))

    def clear_writes(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._service.writes.clear()
        return no_content()

    def add_fault(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        return json_response(200, self._service.faults.add(request.json()).to_json())

    def clear_faults(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._service.faults.clear()
        return no_content()

    def remove_fault(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        if not self._service.faults.remove(params["faultId"]):
            raise HttpError(404, "NotFound", "fault not found")
        return no_content()

    def set_switches(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._service.switches.update(request.json())
        return json_response(200, self._service.switches.to_json())

    def clear_downloads(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        self._service.downloads.clear()
        return no_content()

    def artifacts(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        base = request.base_url + ARTIFACT_PREFIX
        answer = {
            "artifactBaseUrl": base,
            "installerUrl": f"{base}/install.sh",
            "libraryUrl": f"{base}/libthunder.so",
            "librarySha256": library_sha256(),
            "librarySize": len(library()),
        }
        return json_response(200, answer)

    def advance_clock(self, request: FakeRequest, params: dict[str, str]) -> FakeResponse:
        seconds = request.json().get("advanceSeconds")
        if not isinstance(seconds, int | float) or seconds < 0:
            raise HttpError(400, "BadRequest", "advanceSeconds must be a number >= 0")
        self._state.clock_offset += timedelta(seconds=seconds)
        return json_response(200, {"now": format_time(self._state.now())})
