"""A kubelet stand-in for simulated nodes: plugin registration and DRA calls, as the kubelet.

For one node it watches that node's ``plugins_registry`` directory and
registers each plugin over the real registration protocol (GetInfo with a 1 s
timeout, version negotiation in the plugin's order, NotifyRegistrationStatus).
For every pod the scheduler binds to the node it resolves the pod's claims,
requires them allocated and reserved for the pod, calls NodePrepareResources
on the claim's driver (45 s), and only then marks the pod Running. When a pod
is deleted it calls NodeUnprepareResources for claims no other local pod uses
(including claims whose prepare failed: the kubelet records a claim before
preparing it) and removes the pod. Failed calls are retried with backoff, as the
kubelet does. A registration socket deleted and created again (a restarted plugin)
is registered again, and a call goes to the newest registration that answers,
falling back to older ones (the kubelet prefers connected endpoints). The CDI
device IDs each claim got are recorded for tests to inspect.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client

from thunder_dra.proto_gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

log = logging.getLogger(__name__)

SUPPORTED_DRA = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PREPARE_TIMEOUT = 45.0
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"


@dataclass
class Plugin:
    driver: str
    endpoint: str
    version: str
    registration_socket: str
    registered_at: float
    # (inode, ctime) of the registration socket: a socket deleted and created again is a
    # new plugin instance to the kubelet (it re-registers on the fsnotify create event).
    socket_identity: tuple[int, int] = (0, 0)


@dataclass
class PodRecord:
    uid: str
    namespace: str
    name: str
    claims: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> CDI IDs
    claim_refs: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # uid->(ns,name,drv)
    running: bool = False


class PrepareError(RuntimeError):
    """A DRA call failed for a pod; the message names the claim and the driver's error."""


class KubeletStandIn:
    """Run with ``start()``/``stop()`` or as a context manager."""

    def __init__(
        self,
        node_name: str,
        api_client: client.ApiClient,
        registry_dir: Path,
        poll_interval: float = 0.1,
    ) -> None:
        self.node_name = node_name
        self._api_client = api_client
        self.registry_dir = registry_dir
        self.poll_interval = poll_interval
        self.plugins: dict[str, list[Plugin]] = {}
        self.pods: dict[str, PodRecord] = {}
        self.errors: list[str] = []
        self.calls: list[tuple[str, str, list[str]]] = []  # (method, driver, claim uids)
        self._rejected: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # The generated API classes load on first use (CoreV1Api alone takes about a second),
    # so a stand-in that only registers plugins never pays for them.
    @functools.cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api_client)

    @functools.cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._api_client)

    # -- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> KubeletStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start (or, after :meth:`stop`, start again) syncing the registry and pods."""
        self._stop.clear()
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(
            target=self._run, name=f"kubelet-{self.node_name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_registry()
                self.sync_pods()
            except Exception as err:
                self._record_error(f"sync failed: {err}")
            self._stop.wait(self.poll_interval)

    def _record_error(self, message: str) -> None:
        with self._lock:
            if not self.errors or self.errors[-1] != message:
                self.errors.append(message)

    # -- plugin registration ----------------------------------------------------------
    def sync_registry(self) -> None:
        present = set()
        for entry in sorted(self.registry_dir.rglob("*")):
            if entry.name.startswith("."):
                continue
            try:
                info = entry.stat()
            except FileNotFoundError:
                continue
            if not stat.S_ISSOCK(info.st_mode):
                continue
            path = str(entry)
            identity = (info.st_ino, info.st_ctime_ns)
            present.add(path)
            known = self._known(path)
            if known is not None and known.socket_identity != identity:
                self._forget(path)
                known = None
            if known is not None or self._rejected.get(path, 0) > time.monotonic():
                continue
            self._register(path, identity)
        with self._lock:
            for driver, plugins in list(self.plugins.items()):
                kept = [p for p in plugins if p.registration_socket in present]
                if kept:
                    self.plugins[driver] = kept
                else:
                    del self.plugins[driver]

    def _known(self, socket_path: str) -> Plugin | None:
        for plugins in self.plugins.values():
            for plugin in plugins:
                if plugin.registration_socket == socket_path:
                    return plugin
        return None

    def _forget(self, socket_path: str) -> None:
        with self._lock:
            for driver, plugins in list(self.plugins.items()):
                kept = [p for p in plugins if p.registration_socket != socket_path]
                if kept:
                    self.plugins[driver] = kept
                else:
                    del self.plugins[driver]

    def _register(self, socket_path: str, identity: tuple[int, int] = (0, 0)) -> None:
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=1.0)
            except grpc.RpcError as err:
                self._reject(socket_path, f"GetInfo on {socket_path} failed: {err.code()}")
                return
            error = self._validate(info)
            if error:
                with contextlib.suppress(grpc.RpcError):
                    stub.NotifyRegistrationStatus(
                        pluginregistration_v1_pb2.RegistrationStatus(
                            plugin_registered=False, error=error
                        ),
                        timeout=5.0,
                    )
                self._reject(socket_path, error)
                return
            version = next(v for v in info.supported_versions if v in SUPPORTED_DRA)
            endpoint = info.endpoint or socket_path
            plugin = Plugin(info.name, endpoint, version, socket_path, time.monotonic(), identity)
            with self._lock:
                self.plugins.setdefault(info.name, []).append(plugin)
            try:
                stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True),
                    timeout=5.0,
                )
            except grpc.RpcError as err:
                self._record_error(f"NotifyRegistrationStatus on {socket_path}: {err.code()}")
            log.info("registered %s at %s (%s)", info.name, endpoint, version)

    def _validate(self, info: pluginregistration_v1_pb2.PluginInfo) -> str:
        if info.type != "DRAPlugin":
            return f"unsupported plugin type {info.type!r}"
        if not info.name:
            return "plugin name is empty"
        if not any(v in SUPPORTED_DRA for v in info.supported_versions):
            return f"no supported DRA version in {list(info.supported_versions)}"
        endpoint = info.endpoint
        for plugins in self.plugins.values():
            if any(p.endpoint == endpoint for p in plugins):
                return f"endpoint {endpoint} is already registered"
        return ""

    def _reject(self, socket_path: str, message: str) -> None:
        self._record_error(message)
        self._rejected[socket_path] = time.monotonic() + 1.0

    def endpoint_for(self, driver: str) -> Plugin | None:
        """The newest registration of a driver whose endpoint is still there, as the kubelet."""
        candidates = self._candidates(driver)
        return candidates[0] if candidates else None

    def _candidates(self, driver: str) -> list[Plugin]:
        """A driver's registrations in the kubelet's order of preference: newest first,
        those whose endpoint still exists before the others."""
        with self._lock:
            plugins = list(self.plugins.get(driver, []))
        newest = sorted(plugins, key=lambda p: p.registered_at, reverse=True)
        present = [p for p in newest if Path(p.endpoint).exists()]
        return present + [p for p in newest if p not in present]

    def wait_registered(self, driver: str, timeout: float = 30.0) -> Plugin:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            plugin = self.endpoint_for(driver)
            if plugin:
                return plugin
            time.sleep(0.05)
        raise TimeoutError(f"{self.node_name}: {driver} did not register; errors: {self.errors}")

    # -- pods -------------------------------------------------------------------------
    def sync_pods(self) -> None:
        pods: list[Any] = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}"
        ).items
        seen = set()
        for pod in pods:
            uid: str = pod.metadata.uid
            seen.add(uid)
            if self._retry_at.get(uid, 0) > time.monotonic():
                continue
            try:
                if pod.metadata.deletion_timestamp:
                    self._terminate(pod)
                elif uid not in self.pods or not self.pods[uid].running:
                    self._start_pod(pod)
                self._failures.pop(uid, None)
            except PrepareError as err:
                self._record_error(str(err))
                failures = self._failures.get(uid, 0) + 1
                self._failures[uid] = failures
                self._retry_at[uid] = time.monotonic() + min(0.2 * 2**failures, 5.0)
        for uid in set(self.pods) - seen:
            # Removed by someone else (force-deleted): unprepare what only it used.
            self._unprepare_for(self.pods.pop(uid))

    def _claims_of(self, pod: Any) -> list[tuple[str, str]]:
        names: list[str] = []
        statuses = {
            s.name: s.resource_claim_name for s in (pod.status.resource_claim_statuses or [])
        }
        for ref in pod.spec.resource_claims or []:
            name = ref.resource_claim_name or statuses.get(ref.name)
            if not name:
                raise PrepareError(f"pod {pod.metadata.name}: claim for {ref.name} not created yet")
            names.append(name)
        extended = pod.status.extended_resource_claim_status
        if extended and extended.resource_claim_name:
            names.append(extended.resource_claim_name)
        return [(pod.metadata.namespace, n) for n in names]

    def _start_pod(self, pod: Any) -> None:
        uid = pod.metadata.uid
        record = self.pods.get(uid) or PodRecord(uid, pod.metadata.namespace, pod.metadata.name)
        self.pods[uid] = record
        by_driver: dict[str, list[dict[str, Any]]] = {}
        for namespace, name in self._claims_of(pod):
            claim = self._read_claim(namespace, name)
            status = claim.get("status") or {}
            allocation = status.get("allocation")
            if not allocation:
                raise PrepareError(f"claim {namespace}/{name} is not allocated")
            reserved = {r.get("uid") for r in status.get("reservedFor") or []}
            if uid not in reserved:
                raise PrepareError(f"claim {namespace}/{name} is not reserved for pod {uid}")
            drivers = {r["driver"] for r in allocation.get("devices", {}).get("results") or []}
            for driver in drivers:
                by_driver.setdefault(driver, []).append(claim)
                # Recorded before the call, as the kubelet checkpoints a claim before
                # preparing it: a pod deleted after a failed or partial prepare still
                # gets its claims unprepared.
                record.claim_refs[claim["metadata"]["uid"]] = (
                    claim["metadata"]["namespace"],
                    claim["metadata"]["name"],
                    driver,
                )
        for driver, claims in by_driver.items():
            answers = self._prepare(driver, claims)
            for claim in claims:
                record.claims[claim["metadata"]["uid"]] = answers[claim["metadata"]["uid"]]
        self._mark_running(pod)
        record.running = True

    def _read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            claim: Any = self.custom.get_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", name
            )
        except client.ApiException as err:
            raise PrepareError(f"claim {namespace}/{name}: {err.status} {err.reason}") from err
        return dict(claim)

    def _call(self, driver: str, method: str, build: Callable[[Any], Any]) -> Any:
        """Call ``method`` with ``build(pb)`` on the preferred endpoint of ``driver``.

        Like the kubelet, which prefers a connected endpoint, an endpoint that does not
        answer (a plugin killed without removing its socket, mid rolling update) is
        skipped for the next one.
        """
        candidates = self._candidates(driver)
        if not candidates:
            raise PrepareError(f"driver {driver} is not registered on {self.node_name}")
        failure: grpc.RpcError | None = None
        for plugin in candidates:
            pb, grpc_mod = (
                (dra_v1_pb2, dra_v1_pb2_grpc)
                if plugin.version == "v1.DRAPlugin"
                else (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)
            )
            with grpc.insecure_channel(f"unix:{plugin.endpoint}") as channel:
                stub = grpc_mod.DRAPluginStub(channel)
                try:
                    return getattr(stub, method)(build(pb), timeout=PREPARE_TIMEOUT)
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:
                        raise PrepareError(
                            f"{method} to {driver} failed: {err.code()} {err.details()}"
                        ) from err
                    failure = err
        assert failure is not None
        raise PrepareError(f"{method} to {driver} failed: {failure.code()} {failure.details()}")

    def _prepare(self, driver: str, claims: list[dict[str, Any]]) -> dict[str, list[str]]:
        uids = [c["metadata"]["uid"] for c in claims]
        self.calls.append(("NodePrepareResources", driver, uids))
        response = self._call(
            driver,
            "NodePrepareResources",
            lambda pb: pb.NodePrepareResourcesRequest(
                claims=[
                    pb.Claim(
                        namespace=c["metadata"]["namespace"],
                        uid=c["metadata"]["uid"],
                        name=c["metadata"]["name"],
                    )
                    for c in claims
                ]
            ),
        )
        answers: dict[str, list[str]] = {}
        for claim in claims:
            claim_uid = claim["metadata"]["uid"]
            label = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            if claim_uid not in response.claims:
                raise PrepareError(f"{driver} returned no result for claim {label}")
            result = response.claims[claim_uid]
            if result.error:
                raise PrepareError(f"{driver} failed to prepare claim {label}: {result.error}")
            answers[claim_uid] = [i for d in result.devices for i in d.cdi_device_ids]
        return answers

    def _mark_running(self, pod: Any) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
        ]
        containers = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        body: Any = {
            "status": {
                "phase": "Running",
                "conditions": conditions,
                "containerStatuses": containers,
                "startTime": now,
            }
        }
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)

    def _terminate(self, pod: Any) -> None:
        record = self.pods.get(pod.metadata.uid)
        if record:
            self._unprepare_for(record)
            self.pods.pop(pod.metadata.uid, None)
        with contextlib.suppress(client.ApiException):
            body: Any = client.V1DeleteOptions(
                grace_period_seconds=0,
                preconditions=client.V1Preconditions(uid=pod.metadata.uid),
            )
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body=body)

    def _unprepare_for(self, record: PodRecord) -> None:
        still_used = {
            claim_uid
            for other in self.pods.values()
            if other.uid != record.uid
            for claim_uid in other.claim_refs
        }
        by_driver: dict[str, list[tuple[str, str, str]]] = {}
        for claim_uid, (namespace, name, driver) in record.claim_refs.items():
            if claim_uid not in still_used:
                by_driver.setdefault(driver, []).append((namespace, name, claim_uid))
        for driver, refs in by_driver.items():
            self._unprepare(driver, refs)

    def _unprepare(self, driver: str, refs: list[tuple[str, str, str]]) -> None:
        self.calls.append(("NodeUnprepareResources", driver, [uid for _, _, uid in refs]))
        response = self._call(
            driver,
            "NodeUnprepareResources",
            lambda pb: pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, name, uid in refs]
            ),
        )
        for ns, name, uid in refs:
            if uid not in response.claims:
                raise PrepareError(f"{driver} returned no unprepare result for claim {ns}/{name}")
            if response.claims[uid].error:
                raise PrepareError(
                    f"{driver} failed to unprepare claim {ns}/{name}: {response.claims[uid].error}"
                )

    # -- for tests --------------------------------------------------------------------
    def cdi_ids(self, pod_uid: str) -> dict[str, list[str]]:
        record = self.pods.get(pod_uid)
        return dict(record.claims) if record else {}
