"""Simulated nodes that each run a real daemon process, plus the pool they draw GPUs from.

A :class:`NodeHarness` is one Node object, one kubelet directory (under a short
``/tmp/dra...`` path: unix socket paths are limited to 108 bytes), one fake host state
directory, one ``python -m thunder_dra.plugin`` process (started, killed and restarted
by the tests) and one kubelet stand-in. A :class:`ZonePool` is a Thunder zone with a
host in the fake service and the ResourceSlice and DeviceClass the operator would
publish for it, built with the operator's own builders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s_client

from hack import supervise
from hack.cluster import free_port
from hack.cluster.nodes import create_node, delete_node
from hack.fake_host import BIN_DIR, STATE_ENV, FakeHost
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import Kube, wait_for
from hack.testbed.kubelet import KubeletStandIn
from hack.tied import start_tied
from thunder_dra.controllers.inventory.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.slices import InventoryConfig, build_pools
from thunder_dra.proto_gen import dra_v1_pb2, dra_v1_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
DRIVER = "thundercompute.com"
API_TOKEN = "tcapi_daemon_it_Secret-API-token-7f3a"
RESOURCE = "resource.k8s.io/v1"
CLIENT_API = "thundercompute.com/v1alpha1"
TELEMETRY_URL = "https://telemetry.example.test:2096"


@dataclass
class ZonePool:
    """A Thunder zone with one host, published as one pool and one DeviceClass."""

    kube: Kube
    fake: FakeThunderProcess
    gpu_type: str = "A6000"
    physical: int = 8
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    zone: str = ""
    zone_id: str = ""
    device_class: str = ""
    _published: list[tuple[str, str]] = field(default_factory=list)

    def publish(self) -> ZonePool:
        self.zone = f"zone-{self.suffix}"
        self.zone_id = self.fake.admin.add_zone(self.zone)
        self.fake.admin.add_host(self.zone_id, self.gpu_type, self.physical, hostname="gpu-host")
        capacity = PoolCapacity(
            zone_name=self.zone,
            model=self.gpu_type,
            physical=self.physical,
            target=Decimal(1),
            target_source=TargetSource.UNSET,
            live_client_gpus=0,
            published=self.physical,
            zone_ids=(self.zone_id,),
        )
        config = InventoryConfig(
            device_class_prefix=f"t{self.suffix}-gpu-", extended_resource_prefix=""
        )
        layout = build_pools([capacity], config)
        for pool in layout.pools:
            for manifest in pool.manifests(generation=1):
                self.kube.create(manifest)
                self._published.append(("ResourceSlice", manifest["metadata"]["name"]))
        for device_class in build_device_classes(layout.pools, config):
            self.kube.create(device_class.manifest())
            self._published.append(("DeviceClass", device_class.name))
            self.device_class = device_class.name
        return self

    def withdraw(self) -> None:
        for kind, name in self._published:
            self.kube.delete(RESOURCE, kind, name)


class DaemonProcess:
    """One daemon process for one node; restartable with the same instance ID."""

    def __init__(
        self,
        *,
        node: str,
        kubeconfig: Path,
        fake: FakeThunderProcess,
        root: Path,
        instance_id: str,
        extra_args: list[str] | None = None,
    ) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self.fake = fake
        self.root = root
        self.instance_id = instance_id
        self.extra_args = list(extra_args or [])
        self.health_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = root / "daemon.log"
        self.starts = 0
        # Variables added to the daemon's environment at the next start (OTEL_*, ...).
        self.environment: dict[str, str] = {}

    @property
    def plugin_root(self) -> Path:
        return self.root / "plugins"

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def host(self) -> FakeHost:
        return FakeHost(self.root / "host")

    @property
    def dra_socket(self) -> Path:
        return self.plugin_root / DRIVER / f"dra-{self.instance_id}.sock"

    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "thunder_dra.plugin",
            "--driver-name",
            DRIVER,
            "--api-url",
            self.fake.base_url,
            "--artifact-base-url",
            self.fake.artifact_base_url,
            "--telemetry-url",
            TELEMETRY_URL,
            "--plugin-dir-root",
            str(self.plugin_root),
            "--registry-dir",
            str(self.registry_dir),
            "--cdi-dir",
            str(self.cdi_dir),
            "--state-dir",
            str(self.state_dir),
            "--min-driver-version",
            "610",
            "--thunderd-port-range",
            "32000-32199",
            "--advertised-ip-label",
            "thundercompute.com/advertised-ip",
            "--health-address",
            "127.0.0.1",
            "--health-port",
            str(self.health_port),
            "--host-runner",
            "local",
            "--host-path-prefix",
            str(BIN_DIR),
            "--host-env",
            f"{STATE_ENV}={self.root / 'host'}",
            "--log-level",
            "debug",
            "--log-format",
            "json",
            "--thunder-timeout",
            "2",
            "--thunder-retry-initial-backoff",
            "0.05",
            "--thunder-retry-max-backoff",
            "0.2",
            "--thunder-retry-budget",
            "15",
            "--thunderd-check-interval",
            "0.5",
            "--enrollment-retry-max",
            "1",
            "--sweep-interval",
            "1",
            *self.extra_args,
        ]

    def start(self, crash_at: str | None = None) -> DaemonProcess:
        assert self.process is None or self.process.poll() is not None, "already running"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "NODE_NAME": self.node,
            "POD_UID": self.instance_id,
            "POD_NAMESPACE": "thunder-system",
            "THUNDER_API_TOKEN": API_TOKEN,
            "KUBECONFIG": str(self.kubeconfig),
            **self.environment,
        }
        command = self.args()
        if crash_at:
            # Crash points exist only behind the test-only entry point.
            command = [sys.executable, "-m", "hack.daemon_under_test", "--crash-at", crash_at]
            command += self.args()[3:]
        with self.log_path.open("ab") as log:
            # Tied to this run: a test run killed outright takes its daemons along.
            self.process = start_tied(
                command,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        self.starts += 1
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 20 s; returns the exit code."""
        if self.process is None:
            return None
        supervise.stop(self.process, 20)
        return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, crash_at: str | None = None) -> DaemonProcess:
        self.stop()
        return self.start(crash_at)

    def log_text(self) -> str:
        return supervise.read_log(self.log_path)

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records

    def http(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def wait_serving(self, timeout: float = 60.0) -> None:
        def up() -> bool:
            if not self.running():
                code = self.process.returncode if self.process else None
                raise AssertionError(f"daemon exited ({code}):\n{self.log_text()[-4000:]}")
            return self.http("/healthz")[0] == 200

        wait_for(up, f"daemon on {self.node} to serve", timeout=timeout)

    def metrics(self) -> dict[str, float]:
        status, body = self.http("/metrics")
        assert status == 200, body
        values: dict[str, float] = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def prepare(self, namespace: str, name: str, uid: str) -> Any:
        """NodePrepareResources for one claim, straight on the DRA socket."""
        with grpc.insecure_channel(f"unix:{self.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=namespace, uid=uid, name=name)]
            )
            return stub.NodePrepareResources(request, timeout=45).claims[uid]

    def journal_entries(self) -> list[Path]:
        return sorted((self.state_dir / "journal").glob("*/*.json"))

    def checkpoint_claims(self) -> list[str]:
        """The claim UIDs the checkpoint holds (none without a checkpoint file)."""
        try:
            text = (self.state_dir / "checkpoint.json").read_text()
        except FileNotFoundError:
            return []
        return sorted(json.loads(text)["payload"]["claims"])


class NodeHarness:
    """A simulated node with its daemon and kubelet stand-in."""

    def __init__(
        self,
        kube: Kube,
        fake: FakeThunderProcess,
        *,
        zone: str | None,
        serving: bool = False,
        labels: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.kube = kube
        self.name = f"n-{suffix}"
        self.zone = zone
        self.serving = serving
        self.labels = labels
        self.root = Path(tempfile.mkdtemp(prefix="dra"))
        self.daemon = DaemonProcess(
            node=self.name,
            kubeconfig=kube.kubeconfig,
            fake=fake,
            root=self.root,
            instance_id=f"i{suffix}",
            extra_args=extra_args,
        )
        self.kubelet = KubeletStandIn(self.name, kube.api_client, self.daemon.registry_dir)
        self._octet = int(suffix[:2], 16)

    def another_instance(self, fake: FakeThunderProcess, suffix: str) -> DaemonProcess:
        """A second daemon of this node (its state root, its own instance ID and log), not
        started: as a rolling update or a second copy on the node runs it."""
        daemon = DaemonProcess(
            node=self.name,
            kubeconfig=self.kube.kubeconfig,
            fake=fake,
            root=self.root,
            instance_id=f"{self.daemon.instance_id}{suffix}",
        )
        daemon.log_path = self.root / f"daemon-{suffix}.log"
        return daemon

    @property
    def ip(self) -> str:
        return f"127.0.{self._octet}.{(self._octet * 7) % 250 + 2}"

    def create_node(self) -> None:
        create_node(
            self.kube.core,
            self.name,
            zone=self.zone,
            serving=self.serving,
            labels=self.labels,
            internal_ip=self.ip,
        )

    def __enter__(self) -> NodeHarness:
        self.create_node()
        self.kubelet.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kubelet.stop()
        self.daemon.stop()
        delete_node(self.kube.core, self.name)
        shutil.rmtree(self.root, ignore_errors=True)


def gpu_pod(
    name: str,
    node: str,
    template: str,
    *,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "ubuntu:24.04",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "gpu", "request": "gpu"}]},
                }
            ],
        },
    }


def claim_template(name: str, namespace: str, device_class: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": device_class,
                                "allocationMode": "ExactCount",
                                "count": count,
                            },
                        }
                    ]
                }
            }
        },
    }


@dataclass
class RunningPod:
    namespace: str
    name: str
    uid: str
    claim_name: str
    claim_uid: str


class Workloads:
    """Pods with generated claims, in one namespace, for one node and pool."""

    def __init__(self, kube: Kube, namespace: str, pool: ZonePool) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pool = pool
        self._templates: set[int] = set()

    def template(self, count: int) -> str:
        name = f"gpu-{count}"
        if count not in self._templates:
            self.kube.create(claim_template(name, self.namespace, self.pool.device_class, count))
            self._templates.add(count)
        return name

    def create(
        self, node: NodeHarness, *, count: int = 1, vm: bool = False, prefix: str = "p"
    ) -> tuple[str, str]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        # Named and labelled as KubeVirt makes a VM's virt-launcher pod.
        if vm:
            name = f"virt-launcher-{name}"
        labels = {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": f"vm-{name}"} if vm else {}
        self.kube.create_pod(
            self.namespace, gpu_pod(name, node.name, self.template(count), labels=labels)
        )
        pod = wait_for(lambda: self.kube.get("v1", "Pod", name, self.namespace), f"pod {name}")
        return name, str(pod["metadata"]["uid"])

    def claim_of(self, pod_name: str) -> tuple[str, str]:
        def claim() -> tuple[str, str] | None:
            pod = self.kube.get("v1", "Pod", pod_name, self.namespace) or {}
            for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
                if status.get("resourceClaimName"):
                    name = str(status["resourceClaimName"])
                    obj = self.kube.get(RESOURCE, "ResourceClaim", name, self.namespace)
                    if obj:
                        return name, str(obj["metadata"]["uid"])
            return None

        return wait_for(claim, f"the claim of pod {pod_name}")

    def wait_running(self, node: NodeHarness, pod_name: str, timeout: float = 90.0) -> RunningPod:
        def running() -> dict[str, Any] | None:
            pod = self.kube.get("v1", "Pod", pod_name, self.namespace)
            if pod and (pod.get("status") or {}).get("phase") == "Running":
                return pod
            return None

        try:
            pod = wait_for(running, f"pod {pod_name} Running", timeout=timeout)
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nkubelet errors: {node.kubelet.errors[-5:]}\n"
                f"daemon log tail:\n{node.daemon.log_text()[-3000:]}"
            ) from None
        claim_name, claim_uid = self.claim_of(pod_name)
        return RunningPod(
            self.namespace, pod_name, str(pod["metadata"]["uid"]), claim_name, claim_uid
        )

    def delete(self, pod_name: str) -> None:
        self.kube.core.delete_namespaced_pod(pod_name, self.namespace)

    def wait_gone(self, node: NodeHarness, pod_name: str, timeout: float = 90.0) -> None:
        def gone() -> bool:
            return self.kube.get("v1", "Pod", pod_name, self.namespace) is None

        try:
            wait_for(gone, f"pod {pod_name} gone", timeout=timeout)
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nkubelet errors: {node.kubelet.errors[-5:]}\n"
                f"daemon log tail:\n{node.daemon.log_text()[-3000:]}"
            ) from None


def secrets_of(fake: FakeThunderProcess) -> list[str]:
    """Every credential the fake knows: API token, enrollment tokens, client auth tokens."""
    state = fake.admin.state()
    values = [API_TOKEN]
    values += [t["enrollmentToken"] for t in state.get("enrollmentTokens", [])]
    values += [c["authToken"] for c in state.get("clients", []) if c.get("authToken")]
    return [v for v in values if v]


def files_under(directory: Path) -> Iterator[Path]:
    if directory.exists():
        yield from (p for p in directory.rglob("*") if p.is_file())


def mints(
    fake: FakeThunderProcess, since: int = 0, role: str | None = None
) -> list[dict[str, Any]]:
    found = []
    for write in fake.admin.writes()[since:]:
        if (
            write["method"] == "POST"
            and write["path"] == "/api/v1/enrollment-tokens"
            and (role is None or (write.get("body") or {}).get("role") == role)
        ):
            found.append(write)
    return found


@dataclass(frozen=True)
class DirectClaim:
    """A ResourceClaim allocated by the test itself, for calls straight on the DRA socket."""

    namespace: str
    name: str
    uid: str


def allocated_claims(
    kube: Kube, namespace: str, pool: ZonePool, count: int, prefix: str = "c"
) -> list[DirectClaim]:
    """``count`` ResourceClaims given ``status.allocation`` on ``pool`` through the status
    subresource, as the scheduler would (no pod: the claim's name is the client's)."""
    custom = k8s_client.CustomObjectsApi(kube.api_client)
    [piece] = [n for kind, n in pool._published if kind == "ResourceSlice"][:1]
    published = kube.get(RESOURCE, "ResourceSlice", piece) or {}
    pool_name = published["spec"]["pool"]["name"]
    devices = [d["name"] for d in published["spec"]["devices"]]
    claims = []
    for index in range(count):
        name = f"{prefix}-{uuid.uuid4().hex[:6]}-{index}"
        body = {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": pool.device_class}}]
                }
            },
        }
        created = kube.create(body)
        result = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": pool_name,
            "device": devices[index % len(devices)],
        }
        status = {"status": {"allocation": {"devices": {"results": [result]}}}}
        custom.patch_namespaced_custom_object_status(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name, status
        )
        claims.append(DirectClaim(namespace, name, str(created["metadata"]["uid"])))
    return claims


def dra_prepare(daemon: DaemonProcess, claims: list[DirectClaim], timeout: float = 45) -> Any:
    """One NodePrepareResources call for ``claims``; the per-claim answers by UID."""
    with grpc.insecure_channel(f"unix:{daemon.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        return stub.NodePrepareResources(request, timeout=timeout).claims


def dra_unprepare(daemon: DaemonProcess, claims: list[DirectClaim], timeout: float = 45) -> Any:
    """One NodeUnprepareResources call; the per-claim answers by UID."""
    with grpc.insecure_channel(f"unix:{daemon.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        return stub.NodeUnprepareResources(request, timeout=timeout).claims


def enrolled_record(kube: Kube, namespace: str, claim_uid: str) -> dict[str, Any]:
    """The claim's ``Client`` record once its status says ``Enrolled``: the daemon writes
    the status just after the kubelet's answer (the spec, client ID included, before)."""

    def enrolled() -> dict[str, Any] | None:
        record = kube.get(CLIENT_API, "Client", f"claim-{claim_uid}", namespace)
        if record is None or (record.get("status") or {}).get("phase") != "Enrolled":
            return None
        return record

    return wait_for(enrolled, f"the Client record of claim {claim_uid} set Enrolled")


def live_clients(fake: FakeThunderProcess, zone_id: str) -> list[dict[str, Any]]:
    """Thunder clients of ``zone_id`` that are not decommissioned."""
    clients = fake.admin.state().get("clients", [])
    return [c for c in clients if c["zoneId"] == zone_id and not c.get("decommissionedAt")]
