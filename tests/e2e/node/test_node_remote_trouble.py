"""A remote GPU's trouble on Thunder's side, as a cluster user sees it on a real node.

The chart is installed as in ``test_node_install`` (the images ``make image`` built, the
fake Thunder on the node's bridge); each test has a namespace of its own and leaves no
claim behind.

- Thunder unreachable: while the fake answers every zone listing with 503, the
  operator taints every device of the zone `thundercompute.com/unbacked`
  (NoSchedule). A pod that already runs with a Thunder GPU keeps running; a new GPU pod
  stays Pending (never ContainerCreating on the node) with the operator's
  `ThunderDevicesTainted` event naming the taint. When Thunder answers again the
  taints go, and the pending pod is scheduled and runs.
- A GPU pod runs and its claim's `status.devices` entry, written by the daemon, is
  Ready with the zone, the model and the Thunder client ID (the one the `Client`
  record names), and no credential.
- A client revoked in Thunder, not through the driver: within 60 s the kubelet, which
  watches the daemon's `DRAResourceHealth` stream, shows the pod's device Unhealthy in
  `containerStatuses[].allocatedResourcesStatus`, with the daemon's message. The driver
  stops nothing: the pod keeps running, and acting on the status is the user's (or a
  controller's) choice.
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hack import image as image_builder
from hack.node.chart import Install, installed, wait
from hack.node.launcher import Node
from tests.e2e.node.conftest import stock_pod

TAINT_KEY = "thundercompute.com/unbacked"
ZONES = "/api/v1/zones"
DEVICE_CLASS = "thunder-gpu-a6000"


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    with installed(real_node, node_images, tmp_path_factory.mktemp("node-trouble")) as done:
        zone = wait(done.zone_id, "the node's zone in Thunder")
        done.fake.admin.set_targets(zone, {"A6000": 1.0})
        wait(lambda: done.get("deviceclass", DEVICE_CLASS), f"DeviceClass {DEVICE_CLASS}")
        wait(done.ready_daemon_pod, "a Ready daemon pod", timeout=240)
        yield done


def _template(namespace: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _gpu_pod(install: Install, name: str, namespace: str) -> dict[str, Any]:
    pod = stock_pod(
        name,
        install.images["stock"].ref,
        "ls /etc/thunder/ && sleep 3600",
        container={"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    )
    pod["metadata"]["namespace"] = namespace
    return pod


@pytest.fixture
def namespace(install: Install) -> Iterator[str]:
    name = f"trouble-{uuid.uuid4().hex[:6]}"
    install.node.kubectl("create", "namespace", name)
    install.apply(f"{name}-template", _template(name))
    yield name
    install.node.kubectl("delete", "pods", "--all", "-n", name, "--wait=true", check=False)
    install.wait_claims_gone(name)
    install.node.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _phase(install: Install, namespace: str, name: str) -> str:
    pod = install.get("pod", "-n", namespace, name) or {}
    return str((pod.get("status") or {}).get("phase") or "")


def _running(install: Install, namespace: str, name: str) -> bool:
    pod = install.get("pod", "-n", namespace, name) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


def _taints(install: Install) -> dict[str, str]:
    """Device -> the value of its thundercompute.com/unbacked taint, on every slice."""
    found = {}
    for piece in (install.get("resourceslices") or {}).get("items", []):
        for device in piece["spec"].get("devices") or []:
            for taint in device.get("taints") or []:
                if taint["key"] == TAINT_KEY:
                    assert taint["effect"] == "NoSchedule", taint
                    found[device["name"]] = taint["value"]
    return found


def _device_names(install: Install) -> list[str]:
    slices = (install.get("resourceslices") or {}).get("items", [])
    return sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])


def _events(install: Install, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    out = install.node.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.kind=Pod,involvedObject.name={name},reason={reason}",
    )  # fmt: skip
    return list(json.loads(out).get("items", []))


def test_thunder_unreachable_taints_devices_new_pods_pend_running_pods_stay(
    install: Install, namespace: str
) -> None:
    devices = _device_names(install)
    assert devices, "the zone's devices are published"
    install.apply(f"{namespace}-running", _gpu_pod(install, "running", namespace))
    wait(lambda: _running(install, namespace, "running"), "the first GPU pod running", 240)

    install.fake.admin.add_fault(ZONES, method="GET", status=503)
    try:

        def all_tainted() -> dict[str, str] | None:
            found = _taints(install)
            return found if len(found) == len(devices) else None

        tainted = wait(all_tainted, "every device tainted", timeout=90)
        assert set(tainted.values()) == {"ThunderUnreachable"}, tainted
        assert _device_names(install) == devices, "nothing withdrawn"

        install.apply(f"{namespace}-late", _gpu_pod(install, "late", namespace))
        event = wait(
            lambda: _events(install, namespace, "late", "ThunderDevicesTainted"),
            "the late pod told of the taint",
            timeout=90,
        )[0]
        print(f"the late pod's event: {event['message']}")
        assert f"{TAINT_KEY}:NoSchedule" in event["message"]
        assert "(ThunderUnreachable)" in event["message"]
        late = install.get("pod", "-n", namespace, "late")
        assert late["status"]["phase"] == "Pending"
        assert not late["spec"].get("nodeName"), "never bound, so never ContainerCreating"
        scheduled = {c["type"]: c for c in late["status"].get("conditions") or []}
        assert scheduled["PodScheduled"]["status"] == "False", scheduled
        assert _running(install, namespace, "running"), "the running pod is untouched"
    finally:
        install.fake.admin.clear_faults()

    wait(lambda: not _taints(install), "the taints gone when Thunder is back", timeout=90)
    wait(lambda: _running(install, namespace, "late"), "the pending pod running", timeout=240)
    assert _running(install, namespace, "running")
    assert _phase(install, namespace, "running") == "Running"


def _client_id(install: Install, namespace: str) -> str | None:
    for client in install.clients(namespace):
        found = (client.get("status") or {}).get("clientId")
        if found:
            return str(found)
    return None


def _claim_status(install: Install, namespace: str) -> dict[str, Any] | None:
    """The daemon's `status.devices` entry of the namespace's one claim."""
    claims = (install.get("resourceclaims", "-n", namespace) or {}).get("items") or []
    for claim in claims:
        for entry in (claim.get("status") or {}).get("devices") or []:
            if entry.get("conditions"):
                return dict(entry)
    return None


def _device_health(install: Install, namespace: str, name: str) -> list[dict[str, Any]]:
    pod = install.get("pod", "-n", namespace, name) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    entries = statuses[0].get("allocatedResourcesStatus") or [] if statuses else []
    return [r for entry in entries for r in entry.get("resources") or []]


def test_a_pods_claim_shows_its_client_and_a_revoked_client_shows_the_device_unhealthy(
    install: Install, namespace: str
) -> None:
    install.apply(f"{namespace}-watched", _gpu_pod(install, "watched", namespace))
    wait(lambda: _running(install, namespace, "watched"), "the GPU pod running", 240)
    healthy = wait(
        lambda: [r for r in _device_health(install, namespace, "watched") if r.get("health")],
        "the device's health in the pod's status",
        timeout=60,
    )
    assert [r["health"] for r in healthy] == ["Healthy"], healthy
    client_id = wait(lambda: _client_id(install, namespace), "the claim's Thunder client")
    entry = wait(lambda: _claim_status(install, namespace), "the claim's status.devices entry")
    print(f"the claim's status.devices entry: {entry}")
    ready = {c["type"]: c for c in entry.get("conditions") or []}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Prepared"), entry
    assert entry["data"] == {"zone": "zone-a", "gpuModel": "A6000", "thunderClientId": client_id}
    assert entry["driver"] == "thundercompute.com"
    assert not [s for s in install.secrets() if s in json.dumps(entry)], "no credential"

    # Revoked with Thunder's own API and another API token, as a console user would.
    token = install.fake.admin.add_api_token(capabilities=["clients:revoke"])
    answer = httpx.post(
        f"{install.fake.base_url}/api/v1/clients/{client_id}/revoke",
        headers={"Authorization": f"Bearer {token}"},
        verify=ssl.create_default_context(cafile=str(install.node.cluster.ca_cert)),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text

    def unhealthy() -> list[dict[str, Any]] | None:
        found = _device_health(install, namespace, "watched")
        return found if found and all(r.get("health") == "Unhealthy" for r in found) else None

    resources = wait(unhealthy, "the pod's device Unhealthy", timeout=60)
    print(f"allocatedResourcesStatus resources: {resources}")
    assert client_id in str(resources[0].get("message", "")), resources
    assert "revoked" in str(resources[0].get("message", ""))
    assert _running(install, namespace, "watched"), "the driver stops nothing"
