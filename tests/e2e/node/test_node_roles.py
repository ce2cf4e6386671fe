"""The daemon's two node roles on a real node: serving, then consumer, then control plane.

The operator renders one DaemonSet per role (docs/daemon.md#node-roles): the serving one,
privileged and in the host's PID namespace, on nodes labelled `thundercompute.com/node=true`;
the consumer one, without privilege, host namespaces or capabilities, on every other node
but control-plane nodes that did not opt in. The chart installs as the README says
(`hack.node.chart.installed`) on the node, labelled serving. In order (the tests share one
install):

- the serving pod runs with today's spec and enrolls the node with Thunder (the rest of
  the serving role, GPU pods included, is tests/e2e/node/test_node_install.py);
- with the serving label removed, the serving pod goes and the consumer DaemonSet's pod
  runs on the node, its spec as rendered, and registers with the kubelet;
- a stock pod asking for two GPUs runs there with the files the consumer daemon prepared
  (the only daemon on the node) injected;
- labelled control-plane, the node loses its daemon; the opt-in label brings it back;
- labelled serving again, the serving pod is back and the consumer pod gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hack import image as image_builder
from hack.node.chart import INJECTED, NAMESPACE, Install, check_injected, installed, wait
from hack.node.launcher import Node
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod

DRIVER = "thundercompute.com"
SERVING_LABEL = "thundercompute.com/node"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
OPT_IN_LABEL = "thundercompute.com/consumer"
SERVING_DS = "thunder-dra-daemon"
CONSUMER_DS = "thunder-dra-daemon-consumer"
CONSUMER_HOST_PATHS = {
    "/var/lib/kubelet/plugins/thundercompute.com",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/cdi",
    "/var/lib/thunder-dra",
}


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    with installed(real_node, node_images, tmp_path_factory.mktemp("node-roles")) as done:
        try:
            yield done
        finally:
            # The node as the other tests of this folder find it: serving, nothing else.
            _label(done, f"{CONTROL_PLANE_LABEL}-", f"{OPT_IN_LABEL}-", f"{SERVING_LABEL}=true")
            wait(lambda: _only_pod_of(done, SERVING_DS), "the serving daemon pod back", 240)


def _label(install: Install, *labels: str) -> None:
    install.node.kubectl("label", "node", install.node.config.name, "--overwrite", *labels)


def _owner(pod: dict[str, Any]) -> str:
    refs = pod["metadata"].get("ownerReferences") or [{}]
    return str(refs[0].get("name", ""))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def _only_pod_of(install: Install, daemonset: str) -> dict[str, Any] | None:
    """The node's one daemon pod, when it is a Ready pod of `daemonset` and no other is left."""
    pods = install.daemon_pods()
    if len(pods) == 1 and _owner(pods[0]) == daemonset and _ready(pods[0]):
        return pods[0]
    return None


def _no_daemon_pod(install: Install) -> bool:
    return not install.daemon_pods()


def _show(title: str, value: Any) -> None:
    print(f"\n--- {title}\n{json.dumps(value, indent=2, sort_keys=True)}")


def _registered_since(install: Install, start: int, pod_uid: str) -> str | None:
    """The kubelet's line saying it connected to the driver's socket of pod `pod_uid`."""
    lines = install.node.logs("kubelet").splitlines()[start:]
    return next(
        (
            ln
            for ln in lines
            if "Connection changed" in ln
            and f'driverName="{DRIVER}"' in ln
            and "connected=true" in ln
            and pod_uid in ln
        ),
        None,
    )


def test_the_serving_role_runs_todays_privileged_pod_and_enrolls_the_node(
    install: Install,
) -> None:
    pod = wait(lambda: _only_pod_of(install, SERVING_DS), "the serving daemon pod", 240)
    spec = pod["spec"]
    assert spec["nodeName"] == install.node.config.name
    assert spec["hostPID"] is True
    assert spec["containers"][0]["securityContext"] == {"privileged": True}
    assert pod["metadata"]["labels"]["thundercompute.com/daemon-role"] == "serving"
    enrolled = wait(install.enrolled_host, "the serving node registered with Thunder", 240)
    assert (enrolled["gpuType"], enrolled["gpuCount"]) == ("A6000", 4)


def test_without_the_serving_label_the_consumer_pod_runs_unprivileged(install: Install) -> None:
    start = len(install.node.logs("kubelet").splitlines())
    _label(install, f"{SERVING_LABEL}-")
    pod = wait(lambda: _only_pod_of(install, CONSUMER_DS), "the consumer daemon pod", 240)
    spec = pod["spec"]
    container = spec["containers"][0]
    _show("consumer pod securityContext", container["securityContext"])
    _show("consumer pod volumes", spec["volumes"])
    daemon_set = install.get("daemonset", "-n", NAMESPACE, CONSUMER_DS)
    _show("consumer DaemonSet affinity", daemon_set["spec"]["template"]["spec"]["affinity"])
    assert spec["nodeName"] == install.node.config.name
    for host_access in ("hostPID", "hostNetwork", "hostIPC"):
        assert not spec.get(host_access), host_access
    context = container["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == (
        CONSUMER_HOST_PATHS
    )
    assert all("hostPath" in v or "projected" in v for v in spec["volumes"]), spec["volumes"]
    command = container["command"]
    assert command[command.index("--node-role") + 1] == "consumer"
    # The kubelet took the consumer pod's plugin; the daemon knows it does not serve.
    line = wait(
        lambda: _registered_since(install, start, pod["metadata"]["uid"]),
        "the kubelet to connect to the consumer daemon",
    )
    assert DRIVER in line
    log = install.node.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"])
    records = [json.loads(ln) for ln in log.splitlines() if ln.startswith("{")]
    resolved = [r for r in records if r.get("message") == "node resolved"]
    assert resolved, log[-3000:]
    assert resolved[0]["serving"] is False
    assert "Read-only file system" not in log, log[-3000:]
    assert not [r for r in records if r.get("level") in ("error", "critical")], log[-3000:]


def test_the_consumer_daemon_prepares_a_gpu_pods_claim(install: Install) -> None:
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.5})
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    consumer = _only_pod_of(install, CONSUMER_DS)
    assert consumer is not None, install.daemon_pods()
    limits = {"thundercompute.com/gpu-a6000": "2"}
    manifest = stock_pod(
        "consumer-gpus",
        install.images["stock"].ref,
        INJECTED,
        container={"resources": {"limits": limits}},
    )
    pod = run_pod(install.node, manifest, timeout=240)
    logs = pod_logs(install.node, "consumer-gpus")
    assert pod["status"]["phase"] == "Succeeded", logs
    check_injected(install, logs)
    # Prepared by the consumer daemon: the node's only daemon pod throughout.
    after = _only_pod_of(install, CONSUMER_DS)
    assert after is not None
    assert after["metadata"]["uid"] == consumer["metadata"]["uid"]
    install.node.kubectl("delete", "pod", "consumer-gpus", "--wait=true")
    install.wait_claims_gone("default")


def test_a_control_plane_node_runs_the_daemon_only_when_it_opts_in(install: Install) -> None:
    _label(install, f"{CONTROL_PLANE_LABEL}=")
    wait(lambda: _no_daemon_pod(install) or None, "no daemon pod on the control-plane node", 240)
    _label(install, f"{OPT_IN_LABEL}=true")
    pod = wait(lambda: _only_pod_of(install, CONSUMER_DS), "the opted-in consumer pod", 240)
    assert pod["spec"]["nodeName"] == install.node.config.name


def test_labelled_serving_again_the_serving_pod_replaces_the_consumer_pod(
    install: Install,
) -> None:
    _label(install, f"{CONTROL_PLANE_LABEL}-", f"{OPT_IN_LABEL}-", f"{SERVING_LABEL}=true")
    pod = wait(lambda: _only_pod_of(install, SERVING_DS), "the serving daemon pod back", 240)
    assert pod["spec"]["hostPID"] is True
