"""Enrollment before binding, through the real scheduler and two real daemon processes.

Two simulated nodes in two zones, each with its daemon (``--enroll-before-binding``) and
a kubelet stand-in; the two zones' pools are published as the operator publishes them
with ``enrollBeforeBinding`` on (every device ``bindsToNode``, with the binding
conditions). The scheduler waits in PreBind until the chosen node's daemon has enrolled
the claim with the fake Thunder:

- a pod runs, enrolled before it was bound; the kubelet's prepare then only checks files;
- with mints refused in zone A, a pod lands in zone B and never reaches zone A's
  kubelet, even when the device is tried in zone A first;
- with only zone A, the pod stays Pending with Thunder's error in its events;
- a claim enrolled for a pod that is deleted before it starts is released;
- a claim the kubelet unprepared while it is still reserved for its bound pod (a pod
  that ended, before the claim controller drops the reservation) is not enrolled again;
- a daemon killed while it enrolls leaves nothing behind once it is back;
- in every case the fake's audit shows no leaked enrollment.

The real operator publishes the pools and taints a device whose enrollment failed for
its cool-down, so the scheduler's next try lands elsewhere.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    DRIVER,
    RESOURCE,
    DirectClaim,
    NodeHarness,
    claim_template,
    dra_unprepare,
    mints,
)
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import API_TOKEN as OPERATOR_TOKEN
from hack.testbed.operator import CLASS_LABELS, OperatorEnv, operator_env
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED

MINT = "/api/v1/enrollment-tokens"
GPU = "A6000"
COOLDOWN = "30s"
REFUSED_TAINT = "thundercompute.com/enrollment-refused"


@dataclass
class Zones:
    """Two Thunder zones with one host each, published by the real operator with
    ``enrollBeforeBinding`` on; the model's DeviceClass."""

    env: OperatorEnv
    zone: dict[str, str]
    zone_id: dict[str, str]
    device_class: str


@pytest.fixture(scope="module")
def zones(
    kube: Kube,
    cluster: Cluster,
    crds: None,
    fake: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Zones]:
    fake.admin.add_api_token(OPERATOR_TOKEN)  # the operator's Secret holds its own token
    with operator_env(kube, cluster, fake, tmp_path_factory.mktemp("operator")) as env:
        zone = {name: env.zone(name) for name in ("a", "b")}
        zone_id = {name: env.add_zone(zone[name], [(GPU, 4)]) for name in zone}
        env.patch_thundercluster(
            {"spec": {"operator": {"enrollBeforeBinding": {"enabled": True, "cooldown": COOLDOWN}}}}
        )
        env.sync()

        seen: list[object] = []

        def published() -> str | None:
            devices = [d for s in env.slices() for d in s["spec"].get("devices") or ()]
            classes = [
                c["metadata"]["name"]
                for c in kube.list_objects(RESOURCE, "DeviceClass", label_selector=CLASS_LABELS)
            ]
            seen[:] = [devices, classes]
            if len(devices) == 8 and all(d.get("bindsToNode") for d in devices) and classes:
                (name,) = classes
                return str(name)
            return None

        try:
            device_class = wait_for(published, "both zones' pools published with bindsToNode")
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nseen: {seen}\n{env.operator.log_text()[-4000:]}"
            ) from None
        yield Zones(env, zone, zone_id, device_class)


@pytest.fixture(scope="module")
def nodes(kube: Kube, fake: FakeThunderProcess, zones: Zones) -> Iterator[dict[str, NodeHarness]]:
    args = ["--enroll-before-binding"]
    with (
        NodeHarness(kube, fake, zone=zones.zone["a"], extra_args=args) as a,
        NodeHarness(kube, fake, zone=zones.zone["b"], extra_args=args) as b,
    ):
        for harness in (a, b):
            harness.daemon.start().wait_serving()
        yield {"a": a, "b": b}


class World(NamedTuple):
    """What every test here works with."""

    kube: Kube
    fake: FakeThunderProcess
    zones: Zones
    nodes: dict[str, NodeHarness]
    namespace: str


@pytest.fixture
def world(
    kube: Kube,
    fake: FakeThunderProcess,
    zones: Zones,
    nodes: dict[str, NodeHarness],
    namespace: str,
) -> World:
    return World(kube, fake, zones, nodes, namespace)


@pytest.fixture(autouse=True)
def no_faults_left(fake: FakeThunderProcess) -> Iterator[None]:
    yield
    fake.admin.clear_faults()


def _template(kube: Kube, namespace: str, zones: Zones) -> str:
    name = "bind-gpu"
    if kube.get(RESOURCE, "ResourceClaimTemplate", name, namespace) is None:
        kube.create(claim_template(name, namespace, zones.device_class, 1))
    return name


def _pod(
    kube: Kube, namespace: str, zones: Zones, node_selector: dict[str, str] | None = None
) -> str:
    name = f"bind-{uuid.uuid4().hex[:6]}"
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": _template(kube, namespace, zones)}
        ],
        "containers": [
            {
                "name": "main",
                "image": "ubuntu:24.04",
                "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": "gpu", "request": "gpu"}]},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    kube.create_pod(
        namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    )
    return name


def _host(node: NodeHarness) -> dict[str, str]:
    return {"kubernetes.io/hostname": node.name}


def _pod_obj(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get("v1", "Pod", name, namespace) or {}


def _claim_of(kube: Kube, namespace: str, pod: str) -> dict[str, Any] | None:
    for status in (_pod_obj(kube, namespace, pod).get("status") or {}).get(
        "resourceClaimStatuses"
    ) or []:
        if status.get("resourceClaimName"):
            return kube.get(RESOURCE, "ResourceClaim", status["resourceClaimName"], namespace)
    return None


def _conditions(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry.get("driver") == DRIVER:
            for condition in entry.get("conditions") or []:
                found[condition["type"]] = condition
    return found


def _running(kube: Kube, namespace: str, pod: str, timeout: float = 120) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        obj = _pod_obj(kube, namespace, pod)
        return obj if (obj.get("status") or {}).get("phase") == "Running" else None

    try:
        return wait_for(running, f"pod {pod} Running", timeout=timeout)
    except AssertionError as err:
        claim = _claim_of(kube, namespace, pod) or {}
        raise AssertionError(
            f"{err}\nevents: {_events(kube, namespace, pod)}\n"
            f"pod status: {_pod_obj(kube, namespace, pod).get('status')}\n"
            f"claim status: {claim.get('status')}"
        ) from None


def _prepared_claims(node: NodeHarness) -> set[str]:
    return {
        uid
        for method, _, uids in node.kubelet.calls
        if method == "NodePrepareResources"
        for uid in uids
    }


def _events(kube: Kube, namespace: str, pod: str) -> list[dict[str, Any]]:
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [{"reason": e.reason, "message": e.message or ""} for e in events.items]


def _delete_pod(kube: Kube, namespace: str, pod: str) -> None:
    kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    wait_for(lambda: kube.get("v1", "Pod", pod, namespace) is None, f"pod {pod} gone", timeout=90)


def _no_leaks(fake: FakeThunderProcess) -> None:
    wait_for(lambda: fake.admin.leaks() == [], "no leaked enrollment", timeout=60)


def test_a_pod_is_enrolled_before_it_is_bound_and_the_kubelet_only_checks_files(
    world: World,
) -> None:
    kube, fake, zones, nodes, namespace = world
    before = len(fake.admin.writes())
    pod = _pod(kube, namespace, zones)
    obj = _running(kube, namespace, pod)
    claim = _claim_of(kube, namespace, pod)
    assert claim is not None
    conditions = _conditions(claim)
    assert conditions[ENROLLED]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["bindingConditions"] == [ENROLLED]
    assert result["bindingFailureConditions"] == [ENROLLMENT_FAILED]
    node_name = obj["spec"]["nodeName"]
    selector = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert selector == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    ]
    # One enrollment, made before binding; the kubelet's prepare added none.
    assert len(mints(fake, before, role="client")) == 1
    (node,) = [n for n in nodes.values() if n.name == node_name]
    assert claim["metadata"]["uid"] in _prepared_claims(node)
    records = node.daemon.log_records()
    enrolled = [r for r in records if r.get("message") == "enrolling a claim before binding"]
    assert [r["claim_uid"] for r in enrolled] == [claim["metadata"]["uid"]]
    _delete_pod(kube, namespace, pod)
    _no_leaks(fake)


def test_refused_mints_in_zone_a_land_the_pod_in_zone_b_without_reaching_zone_as_kubelet(
    world: World,
) -> None:
    kube, fake, zones, nodes, namespace = world
    fake.admin.add_fault(MINT, method="POST", status=403, zone_id=zones.zone_id["a"])
    a_prepared_before = _prepared_claims(nodes["a"])
    pods = [_pod(kube, namespace, zones) for _ in range(3)]

    def cooling() -> list[dict[str, Any]] | None:
        found = [
            taint
            for piece in zones.env.slices()
            if zones.zone["a"].lower() in piece["spec"]["pool"]["name"]
            for device in piece["spec"].get("devices") or ()
            for taint in device.get("taints") or ()
            if taint["key"] == REFUSED_TAINT
        ]
        return found or None

    # Whether or not a pod tried zone A first, one does in the end: a refusal there
    # taints the device for the cool-down.
    refused = [_pod(kube, namespace, zones, node_selector=_host(nodes["a"]))]
    (taint, *_) = wait_for(cooling, "a zone A device tainted for its cool-down", timeout=120)
    assert taint["effect"] == "NoSchedule"
    landed = {}
    for pod in pods:
        landed[pod] = _running(kube, namespace, pod, timeout=180)["spec"]["nodeName"]
    assert set(landed.values()) == {nodes["b"].name}
    # Zone A's kubelet was never asked to prepare any of them.
    assert _prepared_claims(nodes["a"]) == a_prepared_before
    for pod in pods + refused:
        _delete_pod(kube, namespace, pod)
    _no_leaks(fake)


def test_with_only_the_refusing_zone_the_pod_stays_pending_with_thunders_error(
    world: World,
) -> None:
    kube, fake, zones, nodes, namespace = world
    fake.admin.add_fault(MINT, method="POST", status=403, zone_id=zones.zone_id["a"])
    pod = _pod(kube, namespace, zones, node_selector=_host(nodes["a"]))

    def told() -> list[dict[str, Any]] | None:
        found = [e for e in _events(kube, namespace, pod) if "Thunder mint failed" in e["message"]]
        return found or None

    events = wait_for(told, "the Thunder error in the pod's events", timeout=120)
    assert any(e["reason"] == "FailedScheduling" for e in events), events
    obj = _pod_obj(kube, namespace, pod)
    assert obj["status"].get("phase") == "Pending"
    assert not obj["spec"].get("nodeName")
    _delete_pod(kube, namespace, pod)
    _no_leaks(fake)


def test_a_claim_enrolled_for_a_pod_deleted_before_it_starts_is_released(world: World) -> None:
    kube, fake, zones, nodes, namespace = world
    # The kubelet of node B is stopped: the pod is bound there but never started.
    nodes["b"].kubelet.stop()
    try:
        pod = _pod(kube, namespace, zones, node_selector=_host(nodes["b"]))

        def enrolled() -> dict[str, Any] | None:
            claim = _claim_of(kube, namespace, pod)
            if claim and _conditions(claim).get(ENROLLED, {}).get("status") == "True":
                return claim
            return None

        claim = wait_for(enrolled, "the claim enrolled before binding", timeout=120)
        assert fake.admin.leaks() == []
        _delete_pod(kube, namespace, pod)
        uid = claim["metadata"]["uid"]

        def released() -> bool:
            records = nodes["b"].daemon.log_records()
            return any(
                r.get("message") == "releasing a claim the kubelet no longer needs"
                and r.get("claim_uid") == uid
                for r in records
            )

        wait_for(released, "the daemon released the claim", timeout=120)

        def revoked() -> bool:
            # The log line comes before the release's work: wait for its effect.
            clients = fake.admin.state().get("clients", [])
            return not [
                c for c in clients if c.get("displayName") == pod and not c.get("decommissionedAt")
            ]

        wait_for(revoked, "the pod's Thunder client decommissioned", timeout=60)
        _no_leaks(fake)
    finally:
        nodes["b"].kubelet.start()


def test_a_claim_unprepared_while_still_reserved_for_its_bound_pod_is_not_enrolled_again(
    world: World,
) -> None:
    kube, fake, zones, nodes, namespace = world
    pod = _pod(kube, namespace, zones)
    obj = _running(kube, namespace, pod)
    claim = _claim_of(kube, namespace, pod)
    assert claim is not None
    uid = claim["metadata"]["uid"]
    (node,) = [n for n in nodes.values() if n.name == obj["spec"]["nodeName"]]
    before = len(fake.admin.writes())
    # The kubelet unprepares a pod's claims once its containers have ended; the claim
    # controller drops the reservation on its own time, here not yet.
    direct = DirectClaim(namespace=namespace, name=claim["metadata"]["name"], uid=uid)
    (answer,) = dra_unprepare(node.daemon, [direct]).values()
    assert answer.error == ""

    def cleared() -> dict[str, Any] | None:
        current = kube.get(RESOURCE, "ResourceClaim", claim["metadata"]["name"], namespace)
        if current and ENROLLED not in _conditions(current):
            return current
        return None

    current = wait_for(cleared, "the claim's Enrolled condition cleared", timeout=60)
    assert [r["name"] for r in current["status"]["reservedFor"]] == [pod]
    # The daemon sees the claim change at once (a watch); give it a few watch windows.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        assert mints(fake, before, role="client") == [], "the claim was enrolled again"
        time.sleep(0.5)
    enrolled = [
        r
        for r in node.daemon.log_records()
        if r.get("message") == "enrolling a claim before binding" and r.get("claim_uid") == uid
    ]
    assert len(enrolled) == 1, enrolled
    _delete_pod(kube, namespace, pod)
    _no_leaks(fake)


def test_a_daemon_killed_while_it_enrolls_leaves_nothing_and_the_pod_runs(world: World) -> None:
    kube, fake, zones, nodes, namespace = world
    node = nodes["b"]
    # The exchange hangs long enough for the kill to land between mint and exchange.
    fake.admin.add_fault(
        "/api/v1/enrollment-tokens/enroll", method="POST", latency_ms=8000, times=1
    )
    before = len(fake.admin.writes())
    pod = _pod(kube, namespace, zones, node_selector=_host(node))
    wait_for(lambda: mints(fake, before, role="client") or None, "the mint", timeout=120)
    node.daemon.kill()
    node.daemon.start().wait_serving()
    _running(kube, namespace, pod, timeout=180)
    _delete_pod(kube, namespace, pod)
    _no_leaks(fake)
