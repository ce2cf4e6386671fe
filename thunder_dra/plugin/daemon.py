"""The daemon's life: assemble the parts, check the node, recover, serve, shut down.

Start-up order matters for crash safety: the instance lock and the checkpoint come before
anything that could mint, journal rollback before the kubelet can call, and the plugin
sockets only once recovery is done. A serving node that fails its checks (zone label,
node IP, ``nvidia-smi``, driver version) stops the daemon with a message naming what is
missing; everything that depends on Thunder or the API server is retried instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from thunder_dra import fsutil
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.transport import build_client
from thunder_dra.plugin.claims import lifecycle
from thunder_dra.plugin.claims.binding import BindingWatcher
from thunder_dra.plugin.claims.recovery import InstanceJournal
from thunder_dra.plugin.claims.status import ClaimStatusWriter
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.kubelet.handler import ClaimService, claim_service
from thunder_dra.plugin.kubelet.health import HealthMonitor
from thunder_dra.plugin.kubelet.service import PluginServer, SocketPaths
from thunder_dra.plugin.metrics import DaemonMetrics, EnrollmentState
from thunder_dra.plugin.node.enrollment import NodeEnroller
from thunder_dra.plugin.node.facts import NodeInfo, check_gpu_driver, node_info
from thunder_dra.plugin.node.hostrunner import HostNamespaceRunner, HostRunner, LocalRunner
from thunder_dra.plugin.state.checkpoint import CheckpointVersionError, ClaimState
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.process.health import HealthServer
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.process.tracing import DAEMON_SERVICE, configure_tracing
from thunder_dra.thunder import ArtifactFetcher, RetryPolicy, ThunderClient
from thunder_dra.thunder.aiotransport import AiohttpTransport
from thunder_dra.version import user_agent

IO_THREADS = 32
THUNDER_SPARE_CONNECTIONS = 8  # beyond --claim-concurrency, to Thunder
NODE_READ_ATTEMPTS = 10

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start; the message says why."""


def make_runner(config: DaemonConfig) -> HostRunner:
    if config.host_runner == "local":
        # Not the daemon's own environment: it holds the Thunder API token.
        return LocalRunner(config.host_path_prefix, config.host_env, inherit_env=False)
    return HostNamespaceRunner()


async def read_node(kube: KubeClient, config: DaemonConfig) -> NodeInfo:
    delay = 0.5
    for attempt in range(1, NODE_READ_ATTEMPTS + 1):
        try:
            return node_info(
                await kube.get_node(config.node_name),
                config.advertised_ip_label,
                consumer_only=config.node_role == "consumer",
            )
        except KubeError as err:
            if attempt == NODE_READ_ATTEMPTS or err.status in (401, 403, 404):
                raise StartupError(f"cannot read node {config.node_name}: {err}") from None
            log.warning("reading the node failed; retrying", extra={"error": str(err)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise StartupError(f"cannot read node {config.node_name}")


class Daemon:
    def __init__(
        self, config: DaemonConfig, scrubber: SecretScrubber, crash: CrashPoints | None = None
    ) -> None:
        self.config = config
        self.scrubber = scrubber
        self.metrics = DaemonMetrics()
        # Armed only by the test-only entry point (hack.daemon_under_test).
        self.crash = crash if crash is not None else CrashPoints()
        self._closers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(IO_THREADS, thread_name_prefix="daemon-io"))
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            server, health, service = await self._start()
            await stop.wait()
            log.info("stopping")
            await server.stop()
            # Work deferred for a pause in the kubelet's calls goes ahead at once.
            service.lull.open()
            await service.drain()
            await health.stop()
        finally:
            await self._close()

    async def _start(self) -> tuple[PluginServer, HealthServer, ClaimService]:
        cfg = self.config
        kube = await self._open_kube()
        node = await read_node(kube, cfg)
        runner = make_runner(cfg)
        await self._check_node(node, runner)
        own = await self._lock_instance()
        tracer_provider = configure_tracing(DAEMON_SERVICE)
        self._closers.append(tracer_provider.shutdown)
        thunder, fetcher = self._thunder_clients(tracer_provider)
        claims = lifecycle.assemble(
            config=cfg,
            node_name=node.name,
            kube=kube,
            thunder=thunder,
            fetcher=fetcher,
            own=own,
            metrics=self.metrics,
            crash=self.crash,
            scrubber=self.scrubber,
        )
        status = self._status_writer(kube)
        service = claim_service(
            claims,
            metrics=self.metrics,
            tracer=tracer_provider.get_tracer("thunder_dra.plugin"),
            concurrency=cfg.claim_concurrency,
            status=status,
            lull=status.lull,
        )
        enroller = await self._enroller(node, runner, thunder, own, claims)
        await self._recover(claims)
        # What a write lost to a restart left behind: written again where it differs.
        for prepared in claims.checkpoint.current.claims.values():
            if prepared.state is ClaimState.PREPARED:
                status.prepared(prepared)
        # Device health for the kubelet: one snapshot of Thunder's view every interval.
        device_health = HealthMonitor(
            lambda: claims.checkpoint.current.claims.values(),
            thunder,
            gauge=self.metrics.device_health,
        )
        self._tasks.append(asyncio.create_task(device_health.run(), name="device-health"))
        server = await self._serve_kubelet(service, device_health)
        health = await self._serve_health(server, enroller)
        if enroller is not None:
            self._tasks.append(asyncio.create_task(enroller.run(), name="node-enrollment"))
        self._tasks.append(
            asyncio.create_task(
                claims.recovery.sweep_forever(cfg.intervals.sweep), name="journal-sweep"
            )
        )
        if cfg.enroll_before_binding:
            watcher = BindingWatcher(
                kube, service, claims.checkpoint, driver=cfg.driver_name, node_name=node.name
            )
            self._tasks.append(asyncio.create_task(watcher.run(), name="enroll-before-binding"))
        log.info(
            "daemon ready to serve",
            extra={
                "instance": cfg.instance_id,
                "event_loop": type(asyncio.get_running_loop()).__module__.partition(".")[0],
            },
        )
        return server, health, service

    async def _open_kube(self) -> KubeClient:
        cfg = self.config
        kube = build_client(
            cfg.kubeconfig, user_agent=user_agent("daemon"), timeout=cfg.kube_timeout
        )
        self._closers.append(kube.close)
        await kube.open()
        return kube

    def _status_writer(self, kube: KubeClient) -> ClaimStatusWriter:
        """Writes claims' ``status.devices`` entries in the background; stopped at exit."""
        status = ClaimStatusWriter(
            kube,
            driver=self.config.driver_name,
            scrub=self.scrubber.scrub,
            registry=self.metrics.registry,
        )
        self._closers.append(status.close)
        return status

    async def _check_node(self, node: NodeInfo, runner: HostRunner) -> None:
        """A serving node's GPU driver, or the daemon stops (:class:`NodeSetupError`)."""
        self.metrics.serving_node.set(1 if node.serving else 0)
        if node.serving:
            version = await check_gpu_driver(runner, node.name, self.config.min_driver_version)
            log.info("serving node checked", extra={"zone": node.zone, "driver_version": version})
        else:
            self.metrics.set_enrollment(EnrollmentState.NOT_SERVING)
        log.info(
            "node resolved",
            extra={
                "node": node.name,
                "zone": node.zone,
                "serving": node.serving,
                "advertised_ip": node.advertised_ip,
            },
        )

    async def _lock_instance(self) -> InstanceJournal:
        """This instance's journal, under its lock for the process's whole life."""
        cfg = self.config
        await fsutil.ensure_dir_async(cfg.state_dir, 0o700)
        own = InstanceJournal(cfg.journal_root, cfg.instance_id)
        if not await asyncio.to_thread(own.lock.try_acquire):
            raise StartupError(
                f"another daemon with instance ID {cfg.instance_id} holds {own.lock.path}"
            )
        self._closers.append(own.lock.release)
        return own

    def _thunder_clients(
        self, tracer_provider: TracerProvider
    ) -> tuple[ThunderClient, ArtifactFetcher]:
        """The Thunder API client and the artifact fetcher, with the flags' retry policy."""
        cfg = self.config
        tuning = cfg.thunder
        policy = RetryPolicy(
            max_attempts=tuning.max_attempts,
            initial_backoff=tuning.initial_backoff,
            max_backoff=tuning.max_backoff,
            budget=tuning.budget,
        )
        thunder = ThunderClient(
            api_token=cfg.api_token,
            component="daemon",
            base_url=cfg.api_url,
            timeout=tuning.timeout,
            retry=policy,
            # The contract gives the exchange 90 s where other calls get 60 s (thunder-api.md 2.9).
            exchange_retry=RetryPolicy(
                max_attempts=tuning.max_attempts,
                initial_backoff=tuning.initial_backoff,
                max_backoff=tuning.max_backoff,
                budget=tuning.budget * 1.5,
            ),
            registry=self.metrics.registry,
            tracer_provider=tracer_provider,
            # aiohttp, not httpx's own transport: httpcore cost more CPU per claim than the
            # rest of the daemon's Thunder path. One connection per claim slot, and a few for
            # node enrollment, the sweep and repairs.
            transport=AiohttpTransport(pool_size=cfg.claim_concurrency + THUNDER_SPARE_CONNECTIONS),
        )
        self._closers.append(thunder.aclose)
        fetcher = ArtifactFetcher(
            component="daemon",
            timeout=max(tuning.timeout, 30.0),
            retry=policy,
            registry=self.metrics.registry,
            tracer_provider=tracer_provider,
        )
        self._closers.append(fetcher.aclose)
        return thunder, fetcher

    async def _enroller(
        self,
        node: NodeInfo,
        runner: HostRunner,
        thunder: ThunderClient,
        own: InstanceJournal,
        claims: lifecycle.ClaimLifecycle,
    ) -> NodeEnroller | None:
        """A serving node's enroller, its state loaded (not yet running); None elsewhere."""
        if not node.serving:
            return None
        enroller = NodeEnroller(
            config=self.config,
            node=node,
            runner=runner,
            thunder=thunder,
            journal=own.journal,
            undo=claims.undo,
            metrics=self.metrics,
            crash=self.crash,
            scrubber=self.scrubber,
            abandoned=claims.abandoned,
            installer=claims.library.fetch_installer,
        )
        await enroller.load()
        return enroller

    async def _recover(self, claims: lifecycle.ClaimLifecycle) -> None:
        """Start-up recovery, before the kubelet can call (:meth:`Recovery.startup`)."""
        try:
            await claims.recovery.startup()
        except CheckpointVersionError as err:
            raise StartupError(f"{err}; run the daemon version that wrote it") from None
        self.metrics.prepared_claims.set(len(claims.checkpoint.current.claims))

    async def _serve_kubelet(
        self, service: ClaimService, device_health: HealthMonitor
    ) -> PluginServer:
        """The registration and DRA sockets (with device health on the DRA socket)."""
        cfg = self.config
        paths = SocketPaths.for_instance(
            cfg.driver_name, cfg.instance_id, cfg.registry_dir, cfg.plugin_dir
        )
        server = PluginServer(
            cfg.driver_name,
            service,
            paths,
            on_registration=lambda ok, _: self.metrics.registered.set(1 if ok else 0),
            device_health=device_health,
        )
        await server.start()
        self._closers.append(server.stop)
        return server

    async def _serve_health(
        self, server: PluginServer, enroller: NodeEnroller | None
    ) -> HealthServer:
        """``/healthz``, ``/readyz`` (registered, and a serving node enrolled) and metrics."""

        def readiness() -> list[str]:
            missing = []
            if not server.registration.registered:
                missing.append("not registered with the kubelet")
            if enroller is not None and not enroller.ready:
                missing.append(
                    f"node not enrolled with Thunder ({enroller.last_error or 'in progress'})"
                )
            return missing

        cfg = self.config
        health = HealthServer(
            host=cfg.health_address,
            port=cfg.health_port,
            registry=self.metrics.registry,
            readiness=readiness,
        )
        await health.start()
        self._closers.append(health.stop)
        return health

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for closer in reversed(self._closers):
            try:
                result = closer()
                if asyncio.iscoroutine(result):
                    await result
            except Exception as err:
                log.debug("error while closing", extra={"error": str(err)})
