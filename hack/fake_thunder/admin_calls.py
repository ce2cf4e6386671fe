"""The admin requests the fake's test clients send, described once for both clients."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

_R = TypeVar("_R")


class FakeAdminError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        self.status = status
        super().__init__(f"fake thunder admin {method} {path}: {status}: {text[:500]}")


def _ignore(_: Any) -> None:
    return None


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Call(Generic[_R]):
    method: str
    path: str
    body: Any
    decode: Callable[[Any], _R]


def fault_spec(
    path: str,
    method: str,
    status: int | None,
    body: Any,
    headers: Mapping[str, str] | None,
    latency_ms: int,
    times: int | None,
    after: bool,
    zone_id: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"path": path, "method": method, "latencyMs": latency_ms, "after": after}
    if zone_id is not None:
        spec["zoneId"] = zone_id
    if status is not None:
        spec["status"] = status
    if body is not None:
        spec["body"] = body
    if headers:
        spec["headers"] = dict(headers)
    if times is not None:
        spec["times"] = times
    return spec


class AdminCalls:
    """Every admin request, once; the two clients only differ in how they send it."""

    @staticmethod
    def state() -> Call[dict[str, Any]]:
        return Call("GET", "/_admin/state", None, _same)

    @staticmethod
    def replace_state(state: Mapping[str, Any]) -> Call[dict[str, Any]]:
        return Call("PUT", "/_admin/state", dict(state), _same)

    @staticmethod
    def reset() -> Call[None]:
        return Call("POST", "/_admin/reset", None, _ignore)

    @staticmethod
    def add_api_token(token: str | None, capabilities: Sequence[str] | None) -> Call[str]:
        body = {"token": token, "capabilities": None if capabilities is None else [*capabilities]}
        return Call("POST", "/_admin/api-tokens", body, lambda r: str(r["token"]))

    @staticmethod
    def add_zone(display_name: str, zone_id: str | None) -> Call[str]:
        body = {"displayName": display_name, "zoneId": zone_id}
        return Call("POST", "/_admin/zones", body, lambda r: str(r["zoneId"]))

    @staticmethod
    def add_host(body: dict[str, Any]) -> Call[dict[str, Any]]:
        return Call("POST", "/_admin/hosts", body, _same)

    @staticmethod
    def patch_host(host_id: str, changes: Mapping[str, Any]) -> Call[dict[str, Any]]:
        return Call("PATCH", f"/_admin/hosts/{host_id}", dict(changes), _same)

    @staticmethod
    def delete_host(host_id: str) -> Call[None]:
        return Call("DELETE", f"/_admin/hosts/{host_id}", None, _ignore)

    @staticmethod
    def set_targets(
        zone_id: str, targets: Mapping[str, float], default: float | None
    ) -> Call[None]:
        items = [{"gpuType": k, "oversubscriptionTarget": v} for k, v in targets.items()]
        body: dict[str, Any] = {"oversubscriptionTargets": items}
        if default is not None:
            body["defaultOversubscriptionTarget"] = default
        path = f"/_admin/zones/{zone_id}/oversubscription-targets"
        return Call("PUT", path, body, _ignore)

    @staticmethod
    def get(path: str) -> Call[Any]:
        return Call("GET", f"/_admin/{path}", None, _same)

    @staticmethod
    def delete(path: str) -> Call[None]:
        return Call("DELETE", f"/_admin/{path}", None, _ignore)

    @staticmethod
    def add_fault(spec: dict[str, Any]) -> Call[str]:
        return Call("POST", "/_admin/faults", spec, lambda r: str(r["id"]))

    @staticmethod
    def set_switches(changes: Mapping[str, bool | int]) -> Call[dict[str, Any]]:
        return Call("PUT", "/_admin/switches", dict(changes), _same)

    @staticmethod
    def advance_clock(seconds: float) -> Call[None]:
        return Call("POST", "/_admin/clock", {"advanceSeconds": seconds}, _ignore)


def host_body(
    gpu_type: str, gpu_count: int, extra: Mapping[str, Any] | None, **fixed: Any
) -> dict[str, Any]:
    body = {k: v for k, v in fixed.items() if v is not None}
    return body | {"gpuType": gpu_type, "gpuCount": gpu_count} | dict(extra or {})


def decode(call: Call[_R], response: httpx.Response) -> _R:
    if not response.is_success:
        raise FakeAdminError(call.method, call.path, response.status_code, response.text)
    return call.decode(response.json() if response.content else None)
