"""NoExecute after an outage longer than `spec.operator.inventoryProtection.noExecuteAfter`,
through the real operator, API server, scheduler and kube-controller-manager's
`device-taint-eviction-controller`.

- Setting at its minimum (30s), Thunder unreachable: the device of a claim a bound pod
  holds is tainted `thundercompute.com/unbacked=ThunderUnreachable:NoSchedule` at once,
  and once that taint is 30s old (by its stored `timeAdded`) also with effect NoExecute;
  the real eviction controller then deletes the pod; a pass with no change, both taints
  present, makes no write; when Thunder is back both taints go.
- Setting off (the default): through the same outage, longer than 30s, the pod stays
  bound and the device carries only the NoSchedule taint.
- The API server itself holds the setting's bounds.

The module runs its own control plane, whose kube-controller-manager also runs the
eviction controller: the shared one does not, because that controller also writes the
status of every DeviceTaintRule, which other modules hold still. Writes are counted from
the API server's audit log.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from hack.cluster import Cluster, ClusterConfig
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import OperatorEnv, operator_env
from tests.integration.operator.test_operator_taints import (
    TAINT_KEY,
    allocated_device,
    bound_node,
    claim,
    pod,
)
from thunder_dra.api.constants import GROUP, THUNDER_CLUSTER_PLURAL, VERSION

MINIMUM = "30s"
EVICTION_CONTROLLER = "device-taint-eviction-controller"
EVICTOR = f"system:serviceaccount:kube-system:{EVICTION_CONTROLLER}"


@pytest.fixture(scope="module")
def evicting_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(extra_controllers=(EVICTION_CONTROLLER,))
    with Cluster(workdir=tmp_path_factory.mktemp("cp-eviction"), config=config) as made:
        yield made


@pytest.fixture(scope="module")
def env(
    evicting_cluster: Cluster,
    fake_thunder: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    kube = Kube(evicting_cluster.kubeconfig)
    with operator_env(
        kube, evicting_cluster, fake_thunder, tmp_path_factory.mktemp("operator")
    ) as made:
        yield made


def taints(env: OperatorEnv, pool: str, device: str) -> list[tuple[str, str, str]]:
    """(value, effect, timeAdded) of each taint of one device, in order."""
    for piece in env.slices(pool):
        for found in piece["spec"]["devices"]:
            if found["name"] == device:
                listed = found.get("taints") or []
                assert all(t["key"] == TAINT_KEY and t.get("timeAdded") for t in listed), listed
                return [(t["value"], t["effect"], t["timeAdded"]) for t in listed]
    raise AssertionError(f"{device} is not published in {pool}")


def effects(env: OperatorEnv, pool: str, device: str) -> list[str]:
    return [effect for _, effect, _ in taints(env, pool, device)]


def set_no_execute_after(env: OperatorEnv, value: str | None) -> None:
    env.patch_thundercluster(
        {"spec": {"operator": {"inventoryProtection": {"noExecuteAfter": value}}}}
    )


def deleted_by(env: OperatorEnv, namespace: str, name: str, since: int) -> list[str]:
    """Users whose delete of the pod the audit log holds after index `since`."""
    users = []
    for event in env.cluster.audit_events()[since:]:
        ref, user = event.get("objectRef"), event.get("user")
        if (
            event.get("verb") == "delete"
            and isinstance(ref, dict)
            and (ref.get("resource"), ref.get("namespace"), ref.get("name"))
            == ("pods", namespace, name)
        ):
            users.append(str(user.get("username") if isinstance(user, dict) else user))
    return users


def disruption(env: OperatorEnv, namespace: str, name: str) -> dict[str, Any] | None:
    obj = env.kube.get("v1", "Pod", name, namespace) or {}
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == "DisruptionTarget" and condition["status"] == "True":
            found: dict[str, Any] = condition
            return found
    return None


class Outage:
    """A bound pod holding the one device of a fresh zone, and Thunder's zone list down."""

    def __init__(self, env: OperatorEnv, namespace: str, label: str, node: str, pool: str):
        self.env, self.namespace, self.label, self.node, self.pool = (
            env,
            namespace,
            label,
            node,
            pool,
        )
        self.device = ""

    def bind(self) -> None:
        env, ns = self.env, self.namespace
        env.kube.create(claim("gpu", ns, f"thunder-gpu-{self.label}"))
        env.kube.create_pod(ns, pod("trainer", "gpu"))
        assert wait_for(lambda: bound_node(env, ns, "trainer"), "the pod bound") == self.node
        self.device = wait_for(lambda: allocated_device(env, ns, "gpu"), "its claim allocated")

    def tainted_since(self) -> datetime:
        """The stored timeAdded of the device's NoSchedule taint."""
        (stamp,) = [t for _, e, t in taints(self.env, self.pool, self.device) if e == "NoSchedule"]
        return datetime.fromisoformat(stamp)


@pytest.fixture
def outage(env: OperatorEnv) -> Iterator[Outage]:
    model = f"N{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("noexec")
    node = f"node-{label}"
    with (
        env.kube.nodes({node: {"zone": zone, "serving": True}}),
        env.kube.namespace("noexec") as ns,
    ):
        env.add_zone(zone, [(model, 1)])
        env.sync()
        made = Outage(env, ns, label, node, f"{zone}/{label}")
        try:
            yield made
        finally:
            set_no_execute_after(env, None)
            # No kubelet confirms a pod's end: remove it at once.
            try:
                env.kube.core.delete_namespaced_pod("trainer", ns, grace_period_seconds=0)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise


def test_an_outage_longer_than_the_setting_evicts_the_pod_through_the_real_controller(
    env: OperatorEnv, outage: Outage
) -> None:
    set_no_execute_after(env, MINIMUM)
    env.sync()
    outage.bind()
    ns, pool, device = outage.namespace, outage.pool, outage.device
    assert effects(env, pool, device) == []

    fault = env.fake.admin.add_fault("/api/v1/zones", method="GET", status=503)
    try:
        env.sync()
        assert [(v, e) for v, e, _ in taints(env, pool, device)] == [
            ("ThunderUnreachable", "NoSchedule")
        ]
        since = outage.tainted_since()
        mark = len(env.cluster.audit_events())

        def no_execute() -> bool:
            env.sync()
            return effects(env, pool, device) == ["NoSchedule", "NoExecute"]

        wait_for(no_execute, "the NoExecute taint, once the NoSchedule one is 30s old", 180, 1)
        after = taints(env, pool, device)
        assert [(v, e) for v, e, _ in after] == [
            ("ThunderUnreachable", "NoSchedule"),
            ("ThunderUnreachable", "NoExecute"),
        ]
        assert outage.tainted_since() == since, "the NoSchedule taint keeps its timeAdded"
        assert datetime.fromisoformat(after[1][2]) - since >= timedelta(seconds=30)

        # The real eviction controller deletes the pod (no kubelet here to finish it, so
        # it stays Terminating): the DisruptionTarget condition it sets, and its delete.
        condition = wait_for(lambda: disruption(env, ns, "trainer"), "the pod evicted", 60)
        assert condition["reason"] == "DeletionByDeviceTaintManager", condition
        obj = env.kube.get("v1", "Pod", "trainer", ns)
        assert obj is not None
        assert obj["metadata"].get("deletionTimestamp"), obj
        assert EVICTOR in deleted_by(env, ns, "trainer", mark)

        # No change, both taints present: no write, and both timeAdded as stamped.
        mark = len(env.cluster.audit_events())
        env.sync()
        writes = env.operator_writes(mark, ["resourceslices", "deviceclasses"])
        assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
        assert taints(env, pool, device) == after
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    env.sync()
    assert taints(env, pool, device) == [], "Thunder is back: both taints go"


def test_with_the_setting_off_the_pod_stays_bound_through_the_same_outage(
    env: OperatorEnv, outage: Outage
) -> None:
    assert (
        env.thundercluster()["spec"]["operator"]["inventoryProtection"].get("noExecuteAfter")
        is None
    ), "off by default"
    outage.bind()
    ns, pool, device = outage.namespace, outage.pool, outage.device

    fault = env.fake.admin.add_fault("/api/v1/zones", method="GET", status=503)
    try:
        env.sync()
        since = outage.tainted_since()
        # Past the shortest setting by the API server's clock (timeAdded): a pass then.
        wait = since + timedelta(seconds=35) - datetime.now(UTC)
        time.sleep(max(wait.total_seconds(), 0))
        mark = len(env.cluster.audit_events())
        env.sync()
        env.sync()
        assert [(v, e) for v, e, _ in taints(env, pool, device)] == [
            ("ThunderUnreachable", "NoSchedule")
        ]
        assert env.operator_writes(mark, ["resourceslices"]) == []
        obj = env.kube.get("v1", "Pod", "trainer", ns)
        assert obj is not None
        assert not obj["metadata"].get("deletionTimestamp"), obj
        assert obj["spec"]["nodeName"] == outage.node
        assert disruption(env, ns, "trainer") is None
        assert deleted_by(env, ns, "trainer", mark) == []
        assert allocated_device(env, ns, "gpu") == device
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    env.sync()
    assert taints(env, pool, device) == []


def _dry_run(env: OperatorEnv, value: Any) -> tuple[int, str]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ThunderCluster",
        "metadata": {"name": "no-execute-bounds"},
        "spec": {"operator": {"inventoryProtection": {"noExecuteAfter": value}}},
    }
    try:
        k8s.CustomObjectsApi(env.kube.api_client).create_cluster_custom_object(
            GROUP, VERSION, THUNDER_CLUSTER_PLURAL, body, dry_run="All"
        )
    except k8s.ApiException as exc:
        return int(exc.status or 0), str(json.loads(exc.body or "{}").get("message", exc.body))
    return 201, ""


def test_the_api_server_holds_the_settings_bounds(env: OperatorEnv) -> None:
    for accepted in (None, MINIMUM, "168h"):
        assert _dry_run(env, accepted)[0] == 201, accepted
    for refused in ("29s", "169h"):
        status, message = _dry_run(env, refused)
        assert status == 422, message
        assert "spec.operator.inventoryProtection.noExecuteAfter" in message, message
        assert "must be between 30s and 168h" in message, message
