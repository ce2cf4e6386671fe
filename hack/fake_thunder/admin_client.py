"""Test-side clients for the fake service's ``/_admin/`` endpoints.

:class:`FakeThunderAdmin` is synchronous (fixtures, scripts, a fake running as a process);
:class:`AsyncFakeThunderAdmin` has the same methods as coroutines (use it with an in-process
fake: ``AsyncFakeThunderAdmin(url, transport=fake.transport())``). Keys in ``changes`` and
``extra`` mappings use the wire spelling (camelCase).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import httpx

from hack.fake_thunder.admin_calls import AdminCalls, Call, decode, fault_spec, host_body

_R = TypeVar("_R")


class FakeThunderAdmin:
    """Synchronous admin client for a fake running elsewhere (usually a process)."""

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.Client(transport=transport, timeout=30.0)

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[_R]) -> _R:
        url = self.base_url + call.path
        return decode(call, self._http.request(call.method, url, json=call.body))

    def state(self) -> dict[str, Any]:
        return self._run(AdminCalls.state())

    def replace_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return self._run(AdminCalls.replace_state(state))

    def reset(self) -> None:
        self._run(AdminCalls.reset())

    def add_api_token(
        self, token: str | None = None, capabilities: Sequence[str] | None = None
    ) -> str:
        return self._run(AdminCalls.add_api_token(token, capabilities))

    def add_zone(self, display_name: str, zone_id: str | None = None) -> str:
        return self._run(AdminCalls.add_zone(display_name, zone_id))

    def add_host(
        self,
        zone_id: str,
        gpu_type: str,
        gpu_count: int,
        *,
        status: str | None = None,
        hostname: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = host_body(
            gpu_type, gpu_count, extra, zoneId=zone_id, status=status, hostname=hostname
        )
        return self._run(AdminCalls.add_host(body))

    def register_host(
        self,
        enrollment_token: str,
        gpu_type: str,
        gpu_count: int,
        *,
        zone_name: str | None = None,
        hostname: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What thunderd does with a server token: consume it and add the host."""
        body = host_body(
            gpu_type,
            gpu_count,
            extra,
            enrollmentToken=enrollment_token,
            zoneName=zone_name,
            hostname=hostname,
        )
        return self._run(AdminCalls.add_host(body))

    def patch_host(self, host_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return self._run(AdminCalls.patch_host(host_id, changes))

    def delete_host(self, host_id: str) -> None:
        self._run(AdminCalls.delete_host(host_id))

    def set_targets(
        self, zone_id: str, targets: Mapping[str, float], default: float | None = None
    ) -> None:
        self._run(AdminCalls.set_targets(zone_id, targets, default))

    def token(self, token_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._run(AdminCalls.get(f"tokens/{token_id}"))
        return result

    def tokens(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._run(AdminCalls.get("tokens"))
        return result

    def writes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._run(AdminCalls.get("writes"))
        return result

    def clear_writes(self) -> None:
        self._run(AdminCalls.delete("writes"))

    def add_fault(
        self,
        path: str,
        *,
        method: str = "*",
        status: int | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        latency_ms: int = 0,
        times: int | None = None,
        after: bool = False,
        zone_id: str | None = None,
    ) -> str:
        spec = fault_spec(path, method, status, body, headers, latency_ms, times, after, zone_id)
        return self._run(AdminCalls.add_fault(spec))

    def faults(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._run(AdminCalls.get("faults"))
        return result

    def clear_faults(self) -> None:
        self._run(AdminCalls.delete("faults"))

    def switches(self) -> dict[str, Any]:
        result: dict[str, Any] = self._run(AdminCalls.get("switches"))
        return result

    def set_switches(self, **changes: bool | int) -> dict[str, Any]:
        return self._run(AdminCalls.set_switches(changes))

    def audit(self) -> dict[str, Any]:
        result: dict[str, Any] = self._run(AdminCalls.get("audit"))
        return result

    def leaks(self) -> list[dict[str, Any]]:
        return list(self.audit()["leaks"])

    def downloads(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._run(AdminCalls.get("downloads"))
        return result

    def artifacts(self) -> dict[str, Any]:
        result: dict[str, Any] = self._run(AdminCalls.get("artifacts"))
        return result

    def advance_clock(self, seconds: float) -> None:
        self._run(AdminCalls.advance_clock(seconds))


class AsyncFakeThunderAdmin:
    """The same calls as coroutines, e.g. against an in-process fake's transport."""

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.AsyncClient(transport=transport, timeout=30.0)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: Call[_R]) -> _R:
        url = self.base_url + call.path
        return decode(call, await self._http.request(call.method, url, json=call.body))

    async def state(self) -> dict[str, Any]:
        return await self._run(AdminCalls.state())

    async def replace_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return await self._run(AdminCalls.replace_state(state))

    async def reset(self) -> None:
        await self._run(AdminCalls.reset())

    async def add_api_token(
        self, token: str | None = None, capabilities: Sequence[str] | None = None
    ) -> str:
        return await self._run(AdminCalls.add_api_token(token, capabilities))

    async def add_zone(self, display_name: str, zone_id: str | None = None) -> str:
        return await self._run(AdminCalls.add_zone(display_name, zone_id))

    async def add_host(
        self,
        zone_id: str,
        gpu_type: str,
        gpu_count: int,
        *,
        status: str | None = None,
        hostname: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = host_body(
            gpu_type, gpu_count, extra, zoneId=zone_id, status=status, hostname=hostname
        )
        return await self._run(AdminCalls.add_host(body))

    async def register_host(
        self,
        enrollment_token: str,
        gpu_type: str,
        gpu_count: int,
        *,
        zone_name: str | None = None,
        hostname: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What thunderd does with a server token: consume it and add the host."""
        body = host_body(
            gpu_type,
            gpu_count,
            extra,
            enrollmentToken=enrollment_token,
            zoneName=zone_name,
            hostname=hostname,
        )
        return await self._run(AdminCalls.add_host(body))

    async def patch_host(self, host_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await self._run(AdminCalls.patch_host(host_id, changes))

    async def delete_host(self, host_id: str) -> None:
        await self._run(AdminCalls.delete_host(host_id))

    async def set_targets(
        self, zone_id: str, targets: Mapping[str, float], default: float | None = None
    ) -> None:
        await self._run(AdminCalls.set_targets(zone_id, targets, default))

    async def token(self, token_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(AdminCalls.get(f"tokens/{token_id}"))
        return result

    async def tokens(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._run(AdminCalls.get("tokens"))
        return result

    async def writes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._run(AdminCalls.get("writes"))
        return result

    async def clear_writes(self) -> None:
        await self._run(AdminCalls.delete("writes"))

    async def add_fault(
        self,
        path: str,
        *,
        method: str = "*",
        status: int | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        latency_ms: int = 0,
        times: int | None = None,
        after: bool = False,
        zone_id: str | None = None,
    ) -> str:
        spec = fault_spec(path, method, status, body, headers, latency_ms, times, after, zone_id)
        return await self._run(AdminCalls.add_fault(spec))

    async def faults(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._run(AdminCalls.get("faults"))
        return result

    async def clear_faults(self) -> None:
        await self._run(AdminCalls.delete("faults"))

    async def switches(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(AdminCalls.get("switches"))
        return result

    async def set_switches(self, **changes: bool | int) -> dict[str, Any]:
        return await self._run(AdminCalls.set_switches(changes))

    async def audit(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(AdminCalls.get("audit"))
        return result

    async def leaks(self) -> list[dict[str, Any]]:
        return list((await self.audit())["leaks"])

    async def downloads(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._run(AdminCalls.get("downloads"))
        return result

    async def artifacts(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(AdminCalls.get("artifacts"))
        return result

    async def advance_clock(self, seconds: float) -> None:
        await self._run(AdminCalls.advance_clock(seconds))
