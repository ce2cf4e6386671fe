"""Running the operator as a real process against the local control plane, for tests.

`OperatorProcess` starts `python -m thunder_dra.controllers` (dying with the test run if
that is killed), waits for `/readyz`, reads its `/metrics`, and stops it with SIGTERM.
`OperatorEnv` is one test module's world: a fake Thunder process, a namespace holding
the API-token Secret, a ThunderCluster pointing at the fake, and the operator; its
`sync()` asks for a pass (through the `reconcile-requested` annotation) and waits until
a pass that started after the call has finished, so a test never sleeps for a pass.
`standalone_operator` is the benchmarks' world: a fake Thunder seeded with an inventory,
a local control plane and an operator not yet started; passes are waited for through the
operator's log (`OperatorProcess.passes_logged`), so that waiting does not load the
process being measured with `/metrics` expositions.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from hack import supervise
from hack.cluster import Cluster, ClusterConfig, free_port
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.kube import Kube, wait_for
from hack.tied import start_tied

REPO = Path(__file__).resolve().parents[2]
API_TOKEN = "tcapi_op_Operator-Test-Secret-Token-7f3a"
RESOURCE_API = "resource.k8s.io/v1"
THUNDER_API = "thundercompute.com/v1alpha1"
INVENTORY_LABELS = (
    "app.kubernetes.io/name=thunder-dra-driver,app.kubernetes.io/component=resource-inventory"
)
CLASS_LABELS = "app.kubernetes.io/name=thunder-dra-driver,app.kubernetes.io/component=device-class"
RECONCILE_ANNOTATION = "thundercompute.com/reconcile-requested"
OPERATOR_AGENT = "thunder-device-plugin/"
PASS_END_MESSAGES = (b'"message":"inventory pass done"', b'"message":"reconcile failed, retrying"')
"""The log records (JSON format) that end a reconcile cycle, whatever its outcome."""


class OperatorProcess:
    """One `python -m thunder_dra.controllers` process; start() and stop() as often as needed."""

    def __init__(self, kubeconfig: Path, args: Sequence[str], log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.args = list(args)
        self.log_dir = log_dir
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # Variables for the next start, over the defaults (tracing is off by default).
        self.environment: dict[str, str] = {}
        self._log_read = 0
        self._log_passes = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self, extra_args: Sequence[str] = ()) -> None:
        assert self.popen is None or self.popen.poll() is not None, "already running"
        self.starts += 1
        self._log_read = self._log_passes = 0
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "OTEL_SDK_DISABLED": "true",
            **self.environment,
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        command = [
            sys.executable,
            "-m",
            "hack.operator_under_test",
            "--health-port",
            str(self.health_port),
            "--metrics-port",
            str(self.metrics_port),
            "--health-host",
            "127.0.0.1",
            "--log-format",
            "json",
            *self.args,
            *extra_args,
        ]
        with self.log_path.open("ab") as log:
            # Tied to this run: if the test run is killed outright, the operator goes too.
            self.popen = start_tied(
                command,
                signal="TERM",
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self._ready, "the operator's /readyz", timeout=60)

    def _ready(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            code = self.popen.returncode
            raise AssertionError(f"the operator exited ({code}): {self.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/readyz", timeout=2
            ) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 20) -> int | None:
        if self.popen is None:
            return None
        supervise.stop(self.popen, timeout)
        code = self.popen.returncode
        self.popen = None
        return code

    def restart(self, extra_args: Sequence[str] = ()) -> None:
        self.stop()
        self.start(extra_args)

    def log_text(self) -> str:
        return "\n".join(
            supervise.read_log(path) for path in sorted(self.log_dir.glob("operator-*.log"))
        )

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records

    def passes_logged(self) -> int:
        """Reconcile cycles the running process has ended (its log's pass-end records).

        Reads only what was appended since the last call: cheap enough to poll often,
        and it costs the operator nothing, unlike a `/metrics` exposition."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_read)
                data = log.read()
        except FileNotFoundError:
            return 0
        complete = data.rfind(b"\n") + 1
        self._log_read += complete
        self._log_passes += sum(data[:complete].count(m) for m in PASS_END_MESSAGES)
        return self._log_passes

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the running process (`/proc/<pid>/stat`)."""
        assert self.popen is not None, "not running"
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_passes(self, count: int, what: str, timeout: float = 1800) -> None:
        """Until the running process has ended `count` reconcile cycles."""
        wait_for(lambda: self.passes_logged() >= count, what, timeout=timeout)

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text: str = response.read().decode()
        return text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        return metric_sum(self.metrics_text(), name, **labels)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in a `/metrics` text whose labels include `labels`
    (one exposition read once serves several figures)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@dataclass
class OperatorEnv:
    """One module's fake Thunder, namespace, ThunderCluster and operator."""

    kube: Kube
    cluster: Cluster
    fake: FakeThunderProcess
    namespace: str
    name: str
    operator: OperatorProcess
    created: list[tuple[str, str, str, str | None]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.name.rsplit("-", 1)[-1]

    # -- the ThunderCluster ---------------------------------------------------------

    def thundercluster(self) -> dict[str, Any]:
        found = self.kube.get(THUNDER_API, "ThunderCluster", self.name)
        assert found is not None
        return found

    def patch_thundercluster(self, patch: Mapping[str, Any]) -> None:
        api = k8s.CustomObjectsApi(self.kube.api_client)
        api.patch_cluster_custom_object(
            "thundercompute.com", "v1alpha1", "thunderclusters", self.name, dict(patch)
        )

    def condition(self, kind: str) -> dict[str, Any]:
        status = self.thundercluster().get("status") or {}
        for condition in status.get("conditions") or []:
            if condition["type"] == kind:
                found: dict[str, Any] = condition
                return found
        return {}

    def passes_done(self) -> float:
        return self.operator.metric("thunder_dra_operator_inventory_passes_total")

    def sync(self, timeout: float = 90) -> None:
        """Ask for a pass and wait until one that started after this call has finished."""
        started = self.operator.metric("thunder_dra_operator_inventory_pass_starts_total")
        self.patch_thundercluster(
            {"metadata": {"annotations": {RECONCILE_ANNOTATION: uuid.uuid4().hex}}}
        )
        wait_for(
            lambda: self.passes_done() >= started + 1,
            "an inventory pass after the request",
            timeout=timeout,
        )

    # -- published objects ------------------------------------------------------------

    def slices(self, pool: str | None = None) -> list[dict[str, Any]]:
        items = self.kube.list_objects(
            RESOURCE_API, "ResourceSlice", label_selector=INVENTORY_LABELS
        )
        if pool is None:
            return items
        return [s for s in items if s["spec"]["pool"]["name"] == pool]

    def devices(self, pool: str) -> list[str]:
        return sorted(
            (d["name"] for s in self.slices(pool) for d in s["spec"].get("devices") or ()),
            key=lambda name: int(name.rsplit("-", 1)[1]),
        )

    def device_class(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(RESOURCE_API, "DeviceClass", name)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.kube.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={self.name}"
        ).items
        events = [self.kube.api_client.sanitize_for_serialization(e) for e in items]
        return [e for e in events if reason is None or e.get("reason") == reason]

    def operator_writes(self, since: int, resources: Sequence[str]) -> list[dict[str, Any]]:
        """Audit events after index `since` of writes by the operator to `resources`."""
        found = []
        for event in self.cluster.audit_events()[since:]:
            ref = event.get("objectRef") or {}
            agent = str(event.get("userAgent") or "")
            uri = str(event.get("requestURI") or "")
            if (
                isinstance(ref, dict)
                and ref.get("resource") in resources
                and agent.startswith(OPERATOR_AGENT)
                and "dryRun" not in uri
            ):
                found.append(event)
        return found

    # -- Thunder ---------------------------------------------------------------------

    def zone(self, label: str) -> str:
        """A zone display name unique to this module and test."""
        return f"{label}-{self.id}-{uuid.uuid4().hex[:4]}"

    def add_zone(self, display_name: str, hosts: Sequence[tuple[str, int]] = ()) -> str:
        zone_id = self.fake.admin.add_zone(display_name)
        for gpu_type, count in hosts:
            self.fake.admin.add_host(zone_id, gpu_type, count)
        return zone_id


@dataclass
class StandaloneOperator:
    """A seeded fake Thunder, a control plane, a ThunderCluster and its (stopped) operator."""

    fake: FakeThunderProcess
    cluster: Cluster
    kube: Kube
    namespace: str
    name: str
    operator: OperatorProcess

    def request_pass(self) -> None:
        """Ask for a pass through the `reconcile-requested` annotation."""
        patch = {"metadata": {"annotations": {RECONCILE_ANNOTATION: uuid.uuid4().hex}}}
        self.kube.resource(THUNDER_API, "ThunderCluster").patch(
            name=self.name, body=patch, content_type="application/merge-patch+json"
        )


@contextlib.contextmanager
def standalone_operator(
    workdir: Path, seed: Mapping[str, Any], *, prefix: str, latency_ms: int = 0
) -> Iterator[StandaloneOperator]:
    """The world of an operator benchmark; the operator is left for the caller to start
    (it times the start), and is stopped on the way out."""
    with (
        start_fake_thunder(tokens=[API_TOKEN], seed=seed, log_level="WARNING") as fake,
        Cluster(workdir=workdir / "cp", config=ClusterConfig()) as cluster,
    ):
        if latency_ms:
            fake.admin.add_fault("/api/v1/*", method="GET", latency_ms=latency_ms)
        kube = Kube(cluster.kubeconfig)
        apply_crds(kube)
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        with kube.namespace("thunder-bench") as namespace:
            kube.create(token_secret(namespace))
            manifest = thundercluster_manifest(name, namespace, fake.base_url)
            # Passes are asked for; the timer must not add any.
            manifest["spec"]["operator"]["reconcileInterval"] = "24h"
            kube.create(manifest)
            operator = OperatorProcess(
                cluster.kubeconfig,
                ["--standalone", "--namespace", namespace, "--cluster-name", name],
                workdir,
            )
            try:
                yield StandaloneOperator(fake, cluster, kube, namespace, name, operator)
            finally:
                operator.stop()
                kube.delete(THUNDER_API, "ThunderCluster", name)


def apply_crds(kube: Kube) -> None:
    """Create or update the project's CRDs and wait until they are served."""
    import yaml

    api = k8s.ApiextensionsV1Api(kube.api_client)
    names = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        try:
            api.create_custom_resource_definition(body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
            current = api.read_custom_resource_definition(body["metadata"]["name"])
            assert current.metadata is not None
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            api.replace_custom_resource_definition(body["metadata"]["name"], body)

    def established() -> bool:
        for name in names:
            crd = api.read_custom_resource_definition(name)
            conditions = crd.status.conditions or [] if crd.status else []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for(established, "the CRDs to be established")


def token_secret(namespace: str, name: str = "thunder-api") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"THUNDER_API_TOKEN": base64.b64encode(API_TOKEN.encode()).decode()},
    }


def thundercluster_manifest(
    name: str, namespace: str, api_url: str, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": THUNDER_API,
        "kind": "ThunderCluster",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "thunder": {
                "apiURL": api_url,
                "secretName": "thunder-api",
                "secretNamespace": namespace,
            },
            # Passes are asked for with sync(); the timer only catches up in between.
            "operator": {"reconcileInterval": "30s"},
        },
    }


@contextlib.contextmanager
def operator_env(
    kube: Kube,
    cluster: Cluster,
    fake: FakeThunderProcess,
    log_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> Iterator[OperatorEnv]:
    """A namespace with the token Secret, a ThunderCluster and a running operator."""
    apply_crds(kube)
    suffix = uuid.uuid4().hex[:6]
    name = f"tc-{suffix}"
    with kube.namespace("thunder-op") as namespace:
        kube.create(token_secret(namespace))
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "thunder-dra-daemon", "namespace": namespace},
            }
        )
        kube.create(thundercluster_manifest(name, namespace, fake.base_url, labels))
        operator = OperatorProcess(
            cluster.kubeconfig,
            ["--standalone", "--namespace", namespace, "--cluster-name", name, *extra_args],
            log_dir,
        )
        env = OperatorEnv(kube, cluster, fake, namespace, name, operator)
        try:
            operator.start()
            wait_for(lambda: env.passes_done() >= 1, "the first inventory pass")
            yield env
        finally:
            _teardown(env)


def _teardown(env: OperatorEnv) -> None:
    kube = env.kube
    uid = (kube.get(THUNDER_API, "ThunderCluster", env.name) or {}).get("metadata", {}).get("uid")
    kube.delete(THUNDER_API, "ThunderCluster", env.name)
    try:
        # The running operator releases its finalizer on the ThunderCluster.
        wait_for(
            lambda: kube.get(THUNDER_API, "ThunderCluster", env.name) is None,
            "the ThunderCluster to be deleted",
            timeout=30,
        )
    finally:
        env.operator.stop()
        leftover = kube.get(THUNDER_API, "ThunderCluster", env.name)
        if leftover is not None:
            env.patch_thundercluster({"metadata": {"finalizers": None}})

    # Without a kubelet nothing confirms a pod's end: daemon pods the DaemonSets (one per
    # node role) put on simulated nodes are removed at once, or the namespace would never
    # finish deleting.
    for daemon_set in ("thunder-dra-daemon", "thunder-dra-daemon-consumer"):
        kube.delete("apps/v1", "DaemonSet", daemon_set, env.namespace)
    for pod in kube.core.list_namespaced_pod(env.namespace).items:
        if pod.metadata is not None and pod.metadata.name:
            with contextlib.suppress(k8s.ApiException):
                kube.core.delete_namespaced_pod(
                    pod.metadata.name, env.namespace, grace_period_seconds=0
                )

    # Deleting the ThunderCluster lets the garbage collector remove what it owned, but a
    # collector that has not yet rediscovered the CRD (it does every 30s) waits that long;
    # the next module must not see these objects, so they are deleted here.
    for kind, selector in (("ResourceSlice", INVENTORY_LABELS), ("DeviceClass", CLASS_LABELS)):
        for obj in kube.list_objects(RESOURCE_API, kind, label_selector=selector):
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
                kube.delete(RESOURCE_API, kind, obj["metadata"]["name"])


@contextlib.contextmanager
def operator_env_on_emulated(
    version: str,
    fake: FakeThunderProcess,
    workdir: Path,
    *,
    gates: Mapping[str, bool] | None = None,
) -> Iterator[OperatorEnv]:
    """:func:`operator_env` on a control plane of its own that emulates Kubernetes
    ``version`` (1.34, 1.35) with its stock feature gates, changed by ``gates``."""
    config = ClusterConfig(emulated_version=version, feature_gates=dict(gates or {}))
    logs = workdir / "operator"
    logs.mkdir(parents=True, exist_ok=True)
    with Cluster(workdir=workdir / f"cp-{version}", config=config) as cluster:
        kube = Kube(cluster.kubeconfig)
        with operator_env(kube, cluster, fake, logs) as made:
            yield made
