"""The daemon DaemonSet: rendering, when it needs a write, and DaemonReady."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from prometheus_client import CollectorRegistry

from tests.support.fakekube import FakeKube
from thunder_dra.api.thundercluster import ThunderCluster, ThunderClusterSpec
from thunder_dra.controllers.inventory.publish import Publisher
from thunder_dra.controllers.inventory.reconciler import InventoryReconciler
from thunder_dra.controllers.process.loop import ClusterLoop, Services
from thunder_dra.controllers.process.options import parse_options
from thunder_dra.controllers.reaper import Reaper
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.ownership import ThunderClusterRef, update_body
from thunder_dra.controllers.shared.thunderapi import TOKEN_KEY, ThunderClients, read_token
from thunder_dra.controllers.workload.daemonset import (
    DAEMONSET_NAME,
    contains,
    readiness,
    render,
    up_to_date,
)
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.resources import DAEMON_SETS, SECRETS

OWNER = ThunderClusterRef("main", "uid-1")


def rendered(**spec: Any) -> dict[str, Any]:
    return render(
        ThunderClusterSpec.model_validate(spec), "thunder-system", OWNER, "thunder-dra-daemon"
    )


def as_stored(body: dict[str, Any]) -> dict[str, Any]:
    """What the API server hands back: defaults filled in, quantities normalised."""
    stored = copy.deepcopy(body)
    stored["metadata"].update(uid="ds-uid", resourceVersion="7", generation=1)
    stored["metadata"]["annotations"]["deprecated.daemonset.template.generation"] = "1"
    spec = stored["spec"]
    spec["revisionHistoryLimit"] = 10
    pod = spec["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", securityContext={})
    container = pod["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    container["livenessProbe"]["successThreshold"] = 1
    for env in container["env"]:
        if "fieldRef" in env.get("valueFrom", {}):
            env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    return stored


def test_the_rendering_has_the_agreed_shape() -> None:
    body = rendered()
    assert body["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = body["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    container = pod["containers"][0]
    command = container["command"]
    assert command[command.index("--registry-dir") + 1] == "/var/lib/kubelet/plugins_registry"
    token = next(e for e in container["env"] if e["name"] == "THUNDER_API_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "thunder-api", "key": "THUNDER_API_TOKEN"}
    moved = rendered(kubelet={"pluginDirRoot": "/data/kubelet/plugins"})
    moved_command = moved["spec"]["template"]["spec"]["containers"][0]["command"]
    assert (
        moved_command[moved_command.index("--registry-dir") + 1] == "/data/kubelet/plugins_registry"
    )


def test_an_image_digest_pins_the_image() -> None:
    digest = "sha256:" + "a" * 64
    body = rendered(
        daemon={"image": {"repository": "example.com/d", "tag": "v1", "digest": digest}}
    )
    assert body["spec"]["template"]["spec"]["containers"][0]["image"] == f"example.com/d@{digest}"


def test_a_stored_copy_with_server_defaults_needs_no_write() -> None:
    body = rendered()
    assert up_to_date(as_stored(body), body)


def test_a_spec_change_or_a_hand_edit_needs_a_write() -> None:
    body = rendered()
    stored = as_stored(body)
    changed = rendered(daemon={"nodeSelector": {}})
    assert not up_to_date(stored, changed), "a removed selector label changes the hash"
    edited = copy.deepcopy(stored)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    assert not up_to_date(edited, body)


def test_quantities_compare_by_value() -> None:
    assert contains({"cpu": "500m"}, {"cpu": "0.5"}, ("resources",))
    assert not contains({"cpu": "500m"}, {"cpu": "0.5"}, ("command",))
    assert not contains([1, 2], [1], ())


def test_an_update_keeps_what_others_added() -> None:
    body = rendered()
    stored = as_stored(body)
    stored["metadata"]["labels"]["team"] = "gpu"
    stored["metadata"]["annotations"]["note"] = "x"
    update = update_body(stored, rendered(daemon={"logLevel": "debug"}))
    assert update["metadata"]["resourceVersion"] == "7"
    assert update["metadata"]["labels"]["team"] == "gpu"
    assert update["metadata"]["annotations"]["note"] == "x"
    assert "thundercompute.com/rendered-hash" in update["metadata"]["annotations"]
    assert len(update["metadata"]["ownerReferences"]) == 1


def test_readiness_follows_the_daemonset_status() -> None:
    stored = as_stored(rendered())
    assert readiness(None).reason == "DaemonSetMissing"
    assert readiness(stored).reason == "RolloutPending"
    stored["status"] = {"observedGeneration": 1, "desiredNumberScheduled": 0}
    assert readiness(stored).reason == "NoNodes"
    stored["status"].update(desiredNumberScheduled=3, updatedNumberScheduled=2, numberReady=3)
    assert readiness(stored).reason == "RollingUpdate"
    stored["status"].update(updatedNumberScheduled=3, numberReady=2)
    assert readiness(stored).reason == "PodsNotReady"
    stored["status"].update(numberReady=3)
    state = readiness(stored)
    assert state.ready
    assert state.reason == "AllPodsReady"


TOKEN = "tcat_live_operator_token_3f9c1e7a"


async def test_the_token_is_never_rendered() -> None:
    """The operator's process holds the token while its loop writes the DaemonSet: in the
    Secret it reads (the API token Secret, in the fake apiserver here) and, for a local
    run, in its own environment, where an OTLP header may carry it too. None of it may
    reach the DaemonSet, nor any other request of that step: the pods get the token only
    through a `secretKeyRef`."""
    environ = {
        "THUNDER_NAMESPACE": "thunder-system",
        "THUNDER_API_TOKEN": TOKEN,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {TOKEN}",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=east",
    }
    options = parse_options(["--otel-headers-secret", "otel-auth"], environ=environ)
    fake = FakeKube()
    kube = KubeClient(fake)
    metrics = OperatorMetrics(CollectorRegistry())
    events = EventRecorder(kube, component="thunder-operator", instance="test", scrub=str)
    clients = ThunderClients(CollectorRegistry())
    services = Services(
        options=options,
        kube=kube,
        metrics=metrics,
        events=events,
        inventory=InventoryReconciler(kube, Publisher(kube, 1), events, metrics, clients),
        reaper=Reaper(kube, events, metrics),
        thunder_clients=clients,
    )
    cluster = ThunderCluster.model_validate(
        {
            "apiVersion": "thundercompute.com/v1alpha1",
            "kind": "ThunderCluster",
            "metadata": {"name": "thunder", "generation": 1, "uid": "tc-uid"},
            "spec": {"daemon": {"extraEnv": [{"name": "HTTPS_PROXY", "value": "http://p:1"}]}},
        }
    )
    fake.put(
        SECRETS.collection(cluster.spec.thunder.secret_namespace),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": cluster.spec.thunder.secret_name},
            "data": {TOKEN_KEY: base64.b64encode(TOKEN.encode()).decode()},
        },
    )
    assert (await read_token(kube, cluster.spec.thunder)).reveal() == TOKEN

    await ClusterLoop(services, "tc-uid", "thunder")._reconcile_daemonset(cluster)

    stored = fake.get(DAEMON_SETS.item(DAEMONSET_NAME, "thunder-system"))
    assert stored is not None
    assert TOKEN not in json.dumps(stored)
    writes = [(r.path, r.body) for r in fake.requests if r.body]
    assert writes, "the step wrote nothing"
    assert not [path for path, body in writes if TOKEN.encode() in body]
    env = stored["spec"]["template"]["spec"]["containers"][0]["env"]
    (token,) = [e for e in env if e["name"] == "THUNDER_API_TOKEN"]
    assert token == {
        "name": "THUNDER_API_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "thunder-api", "key": "THUNDER_API_TOKEN"}},
    }
    await clients.aclose()
