"""One node's daemon parts, assembled in-process for the claim lifecycle tests.

:class:`World` is what outlives a daemon process: the fake Thunder service (in memory,
answering through its httpx transport, so no socket is opened), the fake apiserver
(:class:`tests.support.fakekube.FakeKube` behind the daemon's real
:class:`thunder_dra.kube.client.KubeClient`) and the node's directories. Each
:meth:`World.start` assembles a fresh daemon from them with the daemon's own wiring
(:func:`thunder_dra.plugin.claims.lifecycle.assemble` under
:func:`thunder_dra.plugin.kubelet.handler.claim_service`), so a test can "kill" one mid-step
(:class:`tests.unit.plugin.fakes.CrashAt`) and start the next on the same state.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from hack.fake_thunder.audit import audit
from hack.fake_thunder.service import FakeThunder
from tests.support.fakekube import FakeKube, parse_path
from tests.unit.plugin.fakes import CrashAt
from thunder_dra.api import ClaimReference
from thunder_dra.kube import naming
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.resources import CLIENTS, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, SECRETS
from thunder_dra.plugin.claims import lifecycle
from thunder_dra.plugin.claims.prepare import Preparer
from thunder_dra.plugin.claims.recovery import InstanceJournal, Recovery
from thunder_dra.plugin.claims.repair import Repairer
from thunder_dra.plugin.claims.unprepare import Unpreparer
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.kubelet.handler import ClaimService, claim_service
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.plugin.state.checkpoint import CheckpointStore, CheckpointWriter, write_file
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.thunder import ArtifactFetcher, RetryPolicy, Secret, ThunderClient

DRIVER = "thundercompute.com"
NODE = "node-1"
NAMESPACE = "team-a"
API_TOKEN = "tcapi_lifecycle_test_token"
# Answered by the fake's transport: nothing is sent anywhere.
BASE_URL = "http://127.0.0.1:9"
ZONE = "US East"
MODEL = "A6000"
POOL = "us-east/a6000"
FAST_RETRY = RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.002, budget=5.0)


@dataclass
class Daemon:
    """One daemon instance's parts."""

    config: DaemonConfig
    thunder: ThunderClient
    fetcher: ArtifactFetcher
    checkpoint: CheckpointStore
    preparer: Preparer
    repairer: Repairer
    unpreparer: Unpreparer
    recovery: Recovery
    service: ClaimService
    own: InstanceJournal
    metrics: DaemonMetrics
    abandoned: set[str]
    executor: ThreadPoolExecutor
    crash: CrashPoints

    async def prepare(self, *refs: ClaimReference) -> dict[str, Any]:
        """NodePrepareResources: per UID, the prepared claim or the error message."""
        return dict(await self.service.prepare(list(refs)))

    async def unprepare(self, *refs: ClaimReference) -> dict[str, str]:
        """NodeUnprepareResources, then the work its answer left running (the records'
        removal); a crash there is raised here, as if the daemon died after answering."""
        answer = await self.service.unprepare(list(refs))
        await self.service.drain()
        if isinstance(self.crash, CrashAt) and self.crash.crashed is not None:
            raise self.crash.crashed
        return answer

    async def stop(self) -> None:
        """A clean exit."""
        await self.service.drain()
        await self._release()

    async def kill(self) -> None:
        """What SIGKILL does: every other task of the daemon stops where it is, without
        running its error handling (a cancellation is no ``Exception``), writes already
        handed to a thread complete or not at all (atomic), and the kernel releases the
        instance lock."""
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        self.executor.shutdown(wait=True)  # blocking, briefly: nothing else runs now
        await self._release()

    async def _release(self) -> None:
        self.own.lock.release()
        await self.thunder.aclose()
        await self.fetcher.aclose()


@dataclass
class World:
    """What outlives a daemon: Thunder, the apiserver and the node's directories."""

    root: Path
    thunder: FakeThunder = field(default_factory=lambda: FakeThunder(api_tokens=[API_TOKEN]))
    kube: FakeKube = field(default_factory=FakeKube)
    zone_id: str = ""
    api: KubeClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = KubeClient(self.kube)
        self.zone_id = self.thunder.state.add_zone(ZONE).zone_id
        self.kube.put(
            RESOURCE_SLICES.collection(),
            {
                "metadata": {
                    "name": "us-east-a6000-0",
                    "labels": {
                        **naming.component_labels(naming.COMPONENT_RESOURCE_INVENTORY),
                        naming.LABEL_GPU_TYPE: "a6000",
                    },
                    "annotations": {
                        naming.ANNOTATION_ZONE: ZONE,
                        naming.ANNOTATION_GPU_TYPE: MODEL,
                    },
                },
                "spec": {"driver": DRIVER, "pool": {"name": POOL, "generation": 1}, "devices": []},
            },
        )

    # Workloads

    def claim(
        self, name: str, *, devices: int = 1, pod: str | None = None, vm: bool = False
    ) -> ClaimReference:
        """An allocated ResourceClaim reserved for a pod (a virt-launcher pod if ``vm``)."""
        pod = pod or (f"virt-launcher-{name}-0" if vm else f"{name}-pod")
        stored = self.kube.put(
            RESOURCE_CLAIMS.collection(NAMESPACE),
            {
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"devices": {"requests": [{"name": "gpu"}]}},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": DRIVER,
                                    "pool": POOL,
                                    "device": f"a6000-{n}",
                                }
                                for n in range(devices)
                            ]
                        }
                    },
                    "reservedFor": [{"resource": "pods", "name": pod, "uid": f"{pod}-uid"}],
                },
            },
        )
        labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": f"{name}-vm"} if vm else {}
        self.kube.put(PODS.collection(NAMESPACE), {"metadata": {"name": pod, "labels": labels}})
        return ClaimReference(namespace=NAMESPACE, name=name, uid=stored["metadata"]["uid"])

    def claim_object(self, ref: ClaimReference) -> dict[str, Any]:
        """The stored ResourceClaim itself, to edit in place."""
        return self.kube.objects[parse_path(RESOURCE_CLAIMS.item(ref.name, ref.namespace)).key]

    def delete_claim(self, ref: ClaimReference) -> None:
        del self.kube.objects[parse_path(RESOURCE_CLAIMS.item(ref.name, ref.namespace)).key]

    def of_collection(self, collection: str) -> list[dict[str, Any]]:
        api, plural = parse_path(collection).key[:2]
        return [
            o for (a, p, _, _), o in sorted(self.kube.objects.items()) if (a, p) == (api, plural)
        ]

    # The daemon

    def config(self, instance: str) -> DaemonConfig:
        return DaemonConfig(
            driver_name=DRIVER,
            node_name=NODE,
            instance_id=instance,
            api_url=BASE_URL,
            artifact_base_url=f"{BASE_URL}/artifacts",
            telemetry_url="https://telemetry.example.invalid:2096",
            plugin_dir_root=self.root / "plugins",
            registry_dir=self.root / "plugins_registry",
            cdi_dir=self.root / "cdi",
            state_dir=self.root / "state",
            min_driver_version=0,
            thunderd_port_range=None,
            advertised_ip_label="thundercompute.com/advertised-ip",
            health_address="127.0.0.1",
            health_port=0,
            host_runner="local",
            host_root=self.root / "host",
            host_path_prefix=(),
            host_env={},
            log_level="debug",
            log_format="text",
            api_token=Secret(API_TOKEN),
        )

    async def start(
        self,
        *,
        crash: CrashPoints | None = None,
        instance: str = "instance-1",
        checkpoint_writer: CheckpointWriter = write_file,
        recover: bool = True,
    ) -> Daemon:
        cfg = self.config(instance)
        # The daemon's own worker threads, so a kill can wait for what they were writing.
        executor = ThreadPoolExecutor(8, thread_name_prefix=f"{instance}-io")
        asyncio.get_running_loop().set_default_executor(executor)
        crash = crash if crash is not None else CrashPoints()
        registry = CollectorRegistry()
        metrics = DaemonMetrics(registry)
        transport = self.thunder.transport()
        thunder = ThunderClient(
            api_token=cfg.api_token,
            component="daemon",
            base_url=cfg.api_url,
            transport=transport,
            retry=FAST_RETRY,
            exchange_retry=FAST_RETRY,
            registry=registry,
        )
        fetcher = ArtifactFetcher(
            component="daemon", transport=transport, retry=FAST_RETRY, registry=registry
        )
        own = InstanceJournal(cfg.journal_root, instance)
        assert own.lock.try_acquire(), f"instance {instance} is still running"
        claims = lifecycle.assemble(
            config=cfg,
            node_name=NODE,
            kube=self.api,
            thunder=thunder,
            fetcher=fetcher,
            own=own,
            metrics=metrics,
            crash=crash,
            scrubber=SecretScrubber(),
            checkpoint_writer=checkpoint_writer,
        )
        if recover:
            await claims.recovery.startup()
        return Daemon(
            config=cfg,
            thunder=thunder,
            fetcher=fetcher,
            checkpoint=claims.checkpoint,
            preparer=claims.preparer,
            repairer=claims.repairer,
            unpreparer=claims.unpreparer,
            recovery=claims.recovery,
            service=claim_service(
                claims, metrics=metrics, tracer=NoOpTracer(), concurrency=cfg.claim_concurrency
            ),
            own=own,
            metrics=metrics,
            abandoned=claims.abandoned,
            executor=executor,
            crash=crash,
        )

    # What a user would check

    def assert_clean(self) -> None:
        """Nothing left anywhere: no enrollment, no record, no Secret, no file, no open
        journal entry, no checkpoint entry."""
        assert self.leaks() == []
        assert self.live_clients() == []
        assert self.live_tokens() == []
        assert self.client_records() == []
        assert self.secrets() == []
        assert self.node_files() == []
        assert self.open_journal_entries() == []
        assert self.checkpoint_claims() == {}

    def leaks(self) -> list[dict[str, Any]]:
        """Enrollments Thunder still holds that nothing can use or revoke (the audit)."""
        found = audit(self.thunder.state)
        return [*found["leaks"], *found["orphanClients"]]

    def live_clients(self) -> list[str]:
        return sorted(
            c.client_id for c in self.thunder.state.clients.values() if c.decommissioned_at is None
        )

    def live_tokens(self) -> list[str]:
        return sorted(
            t.token_id for t in self.thunder.state.tokens.values() if t.revoked_at is None
        )

    def client_records(self) -> list[dict[str, Any]]:
        return self.of_collection(CLIENTS.collection(NAMESPACE))

    def secrets(self) -> list[dict[str, Any]]:
        return self.of_collection(SECRETS.collection(NAMESPACE))

    def node_files(self) -> list[str]:
        """Claim files left on the node: claim directories and CDI specs."""
        found: list[str] = []
        for directory in (self.root / "state" / "claims", self.root / "cdi"):
            if directory.is_dir():
                found += sorted(str(p.relative_to(self.root)) for p in directory.iterdir())
        return found

    def open_journal_entries(self) -> list[str]:
        root = self.root / "state" / "journal"
        if not root.is_dir():
            return []
        return sorted(str(p.relative_to(root)) for p in root.glob("*/*.json"))

    def checkpoint_claims(self) -> dict[str, Any]:
        path = self.root / "state" / "checkpoint.json"
        if not path.exists():
            return {}
        claims: dict[str, Any] = json.loads(path.read_bytes())["payload"]["claims"]
        return claims
