"""The kubelet-facing gRPC surface: plugin registration, the DRA service and device
health, on unix sockets.

The kubelet discovers the plugin through a registration socket in its
``plugins_registry`` directory and then calls the DRA service on the endpoint
that GetInfo names. When the daemon reports device health, GetInfo lists the
``DRAResourceHealth`` services too and the kubelet watches the newest it knows
(``v1`` from Kubernetes 1.37, else ``v1alpha1``) on the same endpoint. Both
sockets carry this daemon instance's ID so that, in a rolling update, the old and
the new daemon serve side by side and the kubelet is never left without a plugin.
Sockets the kubelet (or a reboot) deletes are re-created.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from thunder_dra.plugin.kubelet.health import HEALTH_TIMEOUT_SECONDS, HealthMonitor
from thunder_dra.plugin.state.checkpoint import ClaimRef, PreparedClaim
from thunder_dra.proto_gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# In the kubelet's preference order: the first one it supports is used.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# Listed as well when the daemon reports device health; the kubelet (1.37) watches the
# first of its own list, v1 then v1alpha1, that the plugin lists.
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
UNIX_PATH_MAX = 107


class ClaimHandler(Protocol):
    """What the DRA service delegates to: one answer per claim (by UID), never a
    whole-call failure. Prepare answers the prepared claim or an error message; unprepare
    an error message, empty on success."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


class _DRAServicer:
    """Serves one DRA API version; v1 and v1beta1 share message shapes."""

    def __init__(self, handler: ClaimHandler, pb: Any) -> None:
        self._handler = handler
        self._pb = pb

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        # The request's Claim messages name their claims (namespace, name, UID) as they are.
        results = await self._handler.prepare(list(request.claims))
        response = self._pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            result = results.get(claim.uid, "claim was not prepared")
            entry = response.claims[claim.uid]
            if isinstance(result, str):
                entry.error = result
                continue
            for dev in result.devices:
                entry.devices.append(
                    self._pb.Device(
                        request_names=list(dev.request_names),
                        pool_name=dev.pool_name,
                        device_name=dev.device_name,
                        cdi_device_ids=list(dev.cdi_device_ids),
                    )
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        errors = await self._handler.unprepare(list(request.claims))
        response = self._pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = errors.get(claim.uid, "")
        return response


class _HealthServicer:
    """Serves one DRAResourceHealth API version; v1 and v1alpha1 share message shapes.

    Every watcher gets the monitor's snapshots: the newest at once, then each new one
    (every ``HEALTH_INTERVAL`` seconds), each the whole list of prepared devices."""

    def __init__(self, monitor: HealthMonitor, pb: Any) -> None:
        self._monitor = monitor
        self._pb = pb

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        pb = self._pb
        async for snapshot in self._monitor.watch():
            response = pb.NodeWatchResourcesResponse()
            for device in snapshot.devices:
                response.devices.append(
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(
                            pool_name=device.pool_name, device_name=device.device_name
                        ),
                        health=pb.HealthStatus.Value(device.health.value.upper()),
                        last_updated_time=snapshot.taken_at,
                        health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                        message=device.message,
                    )
                )
            yield response


class _RegistrationServicer:
    def __init__(
        self,
        driver: str,
        endpoint: str,
        on_status: Callable[[bool, str], None],
        versions: Sequence[str] = SUPPORTED_VERSIONS,
    ) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._on_status = on_status
        self._versions = list(versions)

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=self._endpoint,
            supported_versions=self._versions,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._on_status(bool(request.plugin_registered), str(request.error))
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


@dataclass
class SocketPaths:
    registration: Path
    dra: Path

    @classmethod
    def for_instance(
        cls, driver: str, instance_id: str, registry_dir: Path, plugin_dir: Path
    ) -> SocketPaths:
        paths = cls(
            registration=registry_dir / f"{driver}-{instance_id}-reg.sock",
            dra=plugin_dir / f"dra-{instance_id}.sock",
        )
        for path in (paths.registration, paths.dra):
            if len(str(path)) > UNIX_PATH_MAX:
                raise ValueError(
                    f"socket path {path} is {len(str(path))} bytes; unix sockets allow "
                    f"{UNIX_PATH_MAX}: shorten kubelet.pluginDirRoot or the instance ID"
                )
        return paths


@dataclass
class RegistrationState:
    registered: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class PluginServer:
    """Runs the registration and DRA gRPC servers and keeps their sockets present.

    With ``device_health``, the DRA socket serves DRAResourceHealth v1 and v1alpha1 from
    it and the registration lists both (:data:`HEALTH_VERSIONS`)."""

    def __init__(
        self,
        driver: str,
        handler: ClaimHandler,
        paths: SocketPaths,
        socket_check_interval: float = 1.0,
        on_registration: Callable[[bool, str], Awaitable[None] | None] | None = None,
        device_health: HealthMonitor | None = None,
    ) -> None:
        self.driver = driver
        self.handler = handler
        self.paths = paths
        self.device_health = device_health
        self.registration = RegistrationState()
        self.health = health_aio.HealthServicer()
        self._interval = socket_check_interval
        self._on_registration = on_registration
        self._dra_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._restarts = 0

    async def start(self) -> None:
        self.paths.dra.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.paths.registration.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        await self._start_dra()
        await self._start_registration()
        self._watch = asyncio.create_task(self._keep_sockets(), name="plugin-sockets")

    async def _start_dra(self) -> None:
        _remove_stale(self.paths.dra)
        server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DRAServicer(self.handler, dra_v1_pb2), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DRAServicer(self.handler, dra_v1beta1_pb2), server
        )
        if self.device_health is not None:
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _HealthServicer(self.device_health, dra_health_v1_pb2), server
            )
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _HealthServicer(self.device_health, dra_health_v1alpha1_pb2), server
            )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        server.add_insecure_port(f"unix:{self.paths.dra}")
        await server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._dra_server = server

    async def _start_registration(self) -> None:
        _remove_stale(self.paths.registration)
        server = grpc.aio.server()
        servicer = _RegistrationServicer(
            self.driver, str(self.paths.dra), self._status, self.supported_versions
        )
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix:{self.paths.registration}")
        await server.start()
        self._reg_server = server
        log.info(
            "plugin sockets ready",
            extra={"registration": str(self.paths.registration), "dra": str(self.paths.dra)},
        )

    def _status(self, registered: bool, error: str) -> None:
        state = self.registration
        state.registered = registered
        state.changed.set()
        if registered:
            log.info("registered with the kubelet", extra={"driver": self.driver})
        else:
            # The kubelet retries from GetInfo on its own; we log why it refused.
            log.warning("kubelet refused the registration", extra={"error": error})
        if self._on_registration:
            result = self._on_registration(registered, error)
            if asyncio.iscoroutine(result):
                asyncio.ensure_future(result)  # noqa: RUF006 - fire and forget by design

    async def _keep_sockets(self) -> None:
        delay = self._interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self._restore_sockets()
            except Exception as err:
                # A plugin directory gone or unwritable for a while: keep trying, slower.
                delay = min(delay * 2, self._interval * 30)
                log.warning(
                    "restoring the plugin sockets failed; retrying",
                    extra={"error": str(err), "retry_in": delay},
                )
            else:
                delay = self._interval

    async def _restore_sockets(self) -> None:
        if not self.paths.dra.exists():
            log.warning(
                "DRA socket vanished; serving it again", extra={"path": str(self.paths.dra)}
            )
            await self._stop_server(self._dra_server)
            await self._start_dra()
            self._restarts += 1
        if not self.paths.registration.exists():
            log.warning(
                "registration socket vanished; registering again",
                extra={"path": str(self.paths.registration)},
            )
            self.registration.registered = False
            await self._stop_server(self._reg_server)
            await self._start_registration()
            self._restarts += 1

    @property
    def supported_versions(self) -> tuple[str, ...]:
        """What the registration lists: the DRA services, and health when it is served."""
        if self.device_health is None:
            return SUPPORTED_VERSIONS
        return SUPPORTED_VERSIONS + HEALTH_VERSIONS

    @property
    def socket_restarts(self) -> int:
        return self._restarts

    async def _stop_server(self, server: grpc.aio.Server | None) -> None:
        if server is not None:
            await server.stop(grace=1.0)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving and remove our sockets, so the kubelet deregisters this instance."""
        if self._watch:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.health.enter_graceful_shutdown()
        if self.device_health is not None:
            # Health watches never end on their own: finish them rather than wait out
            # the grace period below.
            self.device_health.close()
        # The registration socket goes first: the kubelet stops routing new calls here
        # while calls already in flight on the DRA socket finish within the grace period.
        await self._stop_server(self._reg_server)
        _remove_stale(self.paths.registration)
        if self._dra_server is not None:
            await self._dra_server.stop(grace=grace)
        _remove_stale(self.paths.dra)


def _remove_stale(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
