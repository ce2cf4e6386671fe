"""Lifecycle of the chart's own pods on a real node: upgrade, a killed daemon, a lost operator.

The chart is installed as the README says (``hack.node.chart.installed``, the same install
as ``test_node_install.py``: the built images on the real kubelet and containerd, the fake
Thunder over https on the bridge), here with a 30 s ``orphanGracePeriod`` (the validated
minimum). Each case works in a namespace of its own and ends with every pod deleted, no
ResourceClaim, Client or CDI spec left and no leaked enrollment in the fake's audit:

- a DaemonSet image upgrade (``helm upgrade`` to another tag of the daemon image, rolled by
  the operator with ``maxSurge: 1``) while GPU pods keep starting: each of them runs with
  the injected files and the kubelet reports no failed prepare;
- the daemon container SIGKILLed while a prepare is in flight (the fake holds the
  enrollment exchange): the kubelet restarts it, the pod then runs with its files and
  nothing leaks;
- the operator pod deleted while a claim is prepared, and an orphaned Client recorded while
  it is gone: the new operator pod's reaper revokes the orphan after the grace period and
  leaves the prepared claim's enrollment alone.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client import CollectorRegistry

from hack import image as image_builder
from hack.node.chart import (
    API_TOKEN,
    DAEMON_SET,
    INJECTED,
    NAMESPACE,
    ZONE,
    Install,
    check_injected,
    installed,
    running,
    wait,
)
from hack.node.launcher import Node
from hack.testbed.daemon import claim_template
from tests.e2e.node.conftest import pod_logs, stock_pod
from thunder_dra.kube.provenance import ANNOTATION, ProvenanceKey
from thunder_dra.thunder import Secret, ThunderClient
from thunder_dra.thunder.aiotransport import AiohttpTransport

GPU = "thundercompute.com/gpu-a6000"
CLASS = "thunder-gpu-a6000"
GRACE = "30s"


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    workdir = tmp_path_factory.mktemp("node-lifecycle")
    values = {"operator": {"orphanGracePeriod": GRACE}}
    with installed(real_node, node_images, workdir, values) as done:
        wait(done.ready_daemon_pod, "a Ready daemon pod", timeout=240)
        zone = wait(done.zone_id, "the node's zone in Thunder", timeout=240)
        done.fake.admin.set_targets(zone, {"A6000": 1.5})
        wait(lambda: done.get("deviceclass", CLASS), f"DeviceClass {CLASS}", timeout=240)
        yield done


def _namespace(install: Install, name: str) -> str:
    install.node.kubectl("create", "namespace", name)
    _apply(install, claim_template("one-a6000", name, CLASS, 1))
    return name


def _gpu_pod(
    install: Install, namespace: str, name: str, *, claim: bool = False, script: str = INJECTED
) -> dict[str, Any]:
    """A stock pod asking for one A6000: by extended-resource limits, or by a
    ResourceClaimTemplate claim."""
    if claim:
        spec: dict[str, Any] = {
            "container": {"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-a6000"}],
        }
    else:
        spec = {"container": {"resources": {"limits": {GPU: "1"}}}}
    manifest = stock_pod(name, install.images["stock"].ref, script, **spec)
    manifest["metadata"]["namespace"] = namespace
    return manifest


def _apply(install: Install, manifest: dict[str, Any]) -> None:
    meta = manifest["metadata"]
    install.apply(f"{manifest['kind']}-{meta.get('namespace', '')}-{meta['name']}", manifest)


def _phase(install: Install, namespace: str, name: str) -> str | None:
    pod = install.get("pod", "-n", namespace, name) or {}
    phase = (pod.get("status") or {}).get("phase")
    return str(phase) if phase in ("Succeeded", "Failed") else None


def _finished(install: Install, namespace: str, name: str, timeout: float = 240) -> str:
    def done() -> str | None:
        return _phase(install, namespace, name)

    try:
        return wait(done, f"pod {namespace}/{name} to finish", timeout=timeout)
    except TimeoutError as exc:
        events = install.node.kubectl("get", "events", "-n", namespace, check=False)
        pod = install.get("pod", "-n", namespace, name)
        raise AssertionError(f"{exc}\n{pod}\n{events}") from None


def _cleanup(install: Install, namespace: str) -> None:
    """Every pod of ``namespace`` deleted: unprepared, nothing left, nothing leaked."""
    install.node.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", timeout=180)
    install.wait_claims_gone(namespace)
    wait(lambda: not install.cdi_specs(), "the claims' CDI specs removed")
    audit = install.fake.admin.audit()
    assert audit["leaks"] == [], audit
    assert audit["orphanClients"] == [], audit


def _daemon_image(pod: dict[str, Any]) -> tuple[str, str]:
    """(spec image, status imageID) of a daemon pod's container."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return pod["spec"]["containers"][0]["image"], str(statuses[0].get("imageID", ""))


def test_a_daemon_image_upgrade_while_pods_start_fails_no_prepare(install: Install) -> None:
    ns = _namespace(install, "lifecycle-upgrade")
    old_ref = install.images["daemon"].ref
    repository, tag = old_ref.rsplit(":", 1)
    new_ref = f"{repository}:{tag}-upgraded"
    install.node.tag_image(old_ref, new_ref)
    old_pod = wait(install.ready_daemon_pod, "the Ready daemon pod", timeout=120)
    assert _daemon_image(old_pod)[0] == old_ref
    log_start = len(install.node.logs("kubelet").splitlines())

    # Pods keep coming, one every 3 s, before, during and after the roll (at most 40);
    # the phase each was created in is recorded (an order of events, no clock). Two more
    # are started at the roll's first steps, so the roll has its pods however fast it is
    # (a new daemon can be Ready and the old one gone within 4 s).
    phase = ["before"]
    created: list[tuple[str, str]] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    naming = threading.Lock()

    def start_one() -> None:
        with naming:
            name = f"roll-{len(created)}"
            _apply(install, _gpu_pod(install, ns, name, claim=len(created) % 2 == 1))
            created.append((name, phase[0]))

    def keep_starting() -> None:
        try:
            while not stop.is_set() and len(created) < 40:
                start_one()
                stop.wait(3)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    starter = threading.Thread(target=keep_starting, daemon=True)
    starter.start()
    try:
        wait(lambda: len(created) >= 2, "the first pods created", timeout=60)
        phase[0] = "rolling"
        repository, new_tag = new_ref.rsplit(":", 1)
        install.upgrade({"daemon": {"image": {"repository": repository, "tag": new_tag}}})
        start_one()

        def daemon_set_changed() -> bool:
            ds = install.get("daemonset", "-n", NAMESPACE, DAEMON_SET) or {}
            containers = ((ds.get("spec") or {}).get("template") or {}).get("spec", {})
            return [c["image"] for c in containers.get("containers", [])] == [new_ref]

        wait(daemon_set_changed, "the operator to set the new image on the DaemonSet", 120)
        start_one()

        def rolled() -> dict[str, Any] | None:
            pods = install.daemon_pods()
            if len(pods) != 1 or _daemon_image(pods[0])[0] != new_ref:
                return None
            return install.ready_daemon_pod()

        new_pod = wait(rolled, "the DaemonSet rolled to the new image", timeout=300)
        phase[0] = "after"
        wait(lambda: created[-1][1] == "after", "a pod created after the roll", timeout=60)
    finally:
        stop.set()
        starter.join(timeout=60)
    assert not errors, errors

    # The new pod replaced the old one, from the same image under its new name.
    assert new_pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
    assert _daemon_image(new_pod) == (new_ref, _daemon_image(old_pod)[1])
    ds = install.get("daemonset", "-n", NAMESPACE, DAEMON_SET)
    assert ds["status"].get("updatedNumberScheduled") == 1, ds["status"]
    phases = [p for _, p in created]
    assert phases.count("rolling") >= 2, created

    for name, _ in created:
        assert _finished(install, ns, name) == "Succeeded", pod_logs(install.node, name, ns)
        check_injected(install, pod_logs(install.node, name, ns), gpus=1)
    failed = install.failed_prepares(ns, since_log_line=log_start)
    assert failed == [], "\n".join(failed)
    _cleanup(install, ns)


def test_the_daemon_sigkilled_during_a_prepare_converges_without_leaks(install: Install) -> None:
    ns = _namespace(install, "lifecycle-kill")
    daemon = wait(install.ready_daemon_pod, "the Ready daemon pod", timeout=120)
    restarts = daemon["status"]["containerStatuses"][0].get("restartCount", 0)
    # The fake holds the claim's enrollment exchange: the prepare is in flight while it
    # sleeps (the token was minted; the daemon has not got the client's credential yet).
    exchange = "/api/v1/enrollment-tokens/enroll"
    fault = install.fake.admin.add_fault(exchange, method="POST", latency_ms=8000, times=1)
    _apply(install, _gpu_pod(install, ns, "killed-prepare"))

    def in_flight() -> bool:
        return all(f["id"] != fault for f in install.fake.admin.faults())

    wait(in_flight, "the daemon's enrollment exchange held by the fake", timeout=240)
    install.node.kill_container(daemon["status"]["containerStatuses"][0]["containerID"])

    def restarted() -> dict[str, Any] | None:
        pod = install.ready_daemon_pod()
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return pod if statuses[0].get("restartCount", 0) > restarts else None

    wait(restarted, "the kubelet to restart the killed daemon container", timeout=240)
    assert _finished(install, ns, "killed-prepare") == "Succeeded"
    check_injected(install, pod_logs(install.node, "killed-prepare", ns), gpus=1)
    # The kill hit that prepare: the kubelet saw it fail, then tried again.
    assert install.failed_prepares(ns), "the kubelet reported no failed prepare for the kill"
    _cleanup(install, ns)


def _ca_context(install: Install) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(install.node.cluster.ca_cert))


async def _enroll(install: Install, zone_id: str) -> tuple[str, str]:
    async with ThunderClient(
        api_token=API_TOKEN,
        component="daemon",
        base_url=install.fake.base_url,
        transport=AiohttpTransport(verify=_ca_context(install)),
        registry=CollectorRegistry(),
    ) as thunder:
        minted = await thunder.mint_client_token(zone_id, "A6000", 1)
        exchanged = await thunder.exchange(minted.enrollment_token, "pod-on-a-lost-claim")
        return minted.enrollment_token_id, exchanged.claims.client_id


def _as_daemon(install: Install) -> k8s.CustomObjectsApi:
    """The API as the daemon of this node (its ServiceAccount with the node's name, as its
    Pod's bound token shows it: the Client policies check both)."""
    pod = wait(install.ready_daemon_pod, "the Ready daemon pod", timeout=120)
    account = f"system:serviceaccount:{NAMESPACE}:{pod['spec']['serviceAccountName']}"
    kubeconfig = str(install.node.cluster.kubeconfig)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    api.set_default_header("Impersonate-User", account)
    api.set_default_header(
        "Impersonate-Extra-authentication.kubernetes.io%2fnode-name", install.node.config.name
    )
    return k8s.CustomObjectsApi(api)


def _record_orphan(install: Install, namespace: str) -> dict[str, str]:
    """A Client as the daemon records it, for a claim that is gone (deleted without the
    daemon's unprepare, as when a node dies), with a real enrollment in the fake."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "lost-claim", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }
    _apply(install, claim)
    claim_uid = install.get("resourceclaim", "-n", namespace, "lost-claim")["metadata"]["uid"]
    install.node.kubectl("delete", "resourceclaim", "-n", namespace, "lost-claim", "--wait=true")
    zone_id = wait(install.zone_id, "the node's zone in Thunder")
    token_id, client_id = asyncio.run(_enroll(install, zone_id))
    name = f"lost-claim-{uuid.uuid4().hex[:6]}"
    signature = ProvenanceKey(Secret(API_TOKEN)).sign(
        namespace=namespace,
        name=name,
        claim_uid=claim_uid,
        enrollment_token_id=token_id,
        client_id=client_id,
    )
    client = {
        "apiVersion": "thundercompute.com/v1alpha1",
        "kind": "Client",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": ["thundercompute.com/client-cleanup"],
            "annotations": {ANNOTATION: signature},
        },
        "spec": {
            "claim": {"namespace": namespace, "name": "lost-claim", "uid": claim_uid},
            "nodeName": install.node.config.name,
            "zone": {"name": ZONE, "id": zone_id},
            "gpuType": "A6000",
            "gpuCount": 1,
            "enrollmentTokenId": token_id,
        },
    }
    as_daemon = _as_daemon(install)
    group, version = "thundercompute.com", "v1alpha1"
    as_daemon.create_namespaced_custom_object(group, version, namespace, "clients", client)
    status = {"status": {"phase": "Enrolled", "clientId": client_id}}
    as_daemon.patch_namespaced_custom_object_status(
        group, version, namespace, "clients", name, status
    )
    return {"name": name, "token": token_id, "client": client_id}


def _token(install: Install, token_id: str) -> dict[str, Any]:
    return install.fake.admin.token(token_id)


def test_the_reaper_revokes_an_orphan_made_while_the_operator_pod_was_gone(
    install: Install,
) -> None:
    ns = _namespace(install, "lifecycle-operator")
    keeper = _gpu_pod(install, ns, "keeper", claim=True, script=INJECTED + "sleep 3600")
    _apply(install, keeper)
    wait(lambda: running(install, "keeper", ns), "the keeper pod running", timeout=240)
    kept = install.clients(ns)
    assert len(kept) == 1, kept
    assert (kept[0].get("status") or {}).get("phase") == "Enrolled", kept
    kept_token = kept[0]["spec"]["enrollmentTokenId"]
    assert _token(install, kept_token)["state"] == "spent"

    operators = install.operator_pods()
    assert len(operators) == 1, [p["metadata"]["name"] for p in operators]
    old = operators[0]["metadata"]
    install.node.kubectl(
        "delete", "pod", "-n", NAMESPACE, old["name"], "--wait=true", timeout=120
    )  # fmt: skip
    orphan = _record_orphan(install, ns)

    def new_operator_ready() -> dict[str, Any] | None:
        for pod in install.operator_pods():
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if pod["metadata"]["uid"] != old["uid"] and conditions.get("Ready") == "True":
                return pod
        return None

    wait(new_operator_ready, "a new operator pod Ready", timeout=240)

    def revoked() -> bool:
        token = _token(install, orphan["token"])
        gone = not install.get("clients.thundercompute.com", "-n", ns, orphan["name"])
        return token["state"] == "revoked" and gone

    wait(revoked, "the orphan's enrollment revoked and its Client removed", timeout=240)
    token = _token(install, orphan["token"])
    assert token["client"]["decommissionedAt"], token

    # The prepared claim is untouched: its Client, its enrollment, its pod.
    after = install.clients(ns)
    assert [c["metadata"]["uid"] for c in after] == [kept[0]["metadata"]["uid"]], after
    assert after[0]["status"]["phase"] == "Enrolled"
    assert not after[0]["status"].get("orphanedSince"), after[0]["status"]
    kept_now = _token(install, kept_token)
    assert kept_now["state"] == "spent", kept_now
    assert not kept_now["client"]["decommissionedAt"], kept_now
    pod = running(install, "keeper", ns)
    assert pod, "the keeper pod is no longer running"
    assert pod["status"]["containerStatuses"][0].get("restartCount", 0) == 0, pod
    _cleanup(install, ns)
