"""The daemon's two node roles: what each DaemonSet gets, where each runs, and the upgrade
from the single DaemonSet of earlier releases."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.fakekube import FakeKube
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload.daemonset import (
    CONSUMER_DAEMONSET_NAME,
    DAEMONSET_NAME,
    ROLE_LABEL,
    Role,
    readiness_of_roles,
    reconcile_daemonsets,
    render,
    render_all,
    selector_labels,
)
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.resources import DAEMON_SETS
from thunder_dra.plugin.config import parse_config
from thunder_dra.plugin.node.facts import NodeSetupError, node_info

OWNER = ThunderClusterRef("main", "uid-1")
NAMESPACE = "thunder-system"
CONSUMER_HOST_PATHS = {
    "/var/lib/kubelet/plugins/thundercompute.com",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/cdi",
    "/var/lib/thunder-dra",
}


def rendered(role: Role, **spec: Any) -> dict[str, Any]:
    return render(ThunderClusterSpec.model_validate(spec), NAMESPACE, OWNER, "sa", role=role)


def pod_of(body: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = body["spec"]["template"]["spec"]
    return pod


def test_the_consumer_pod_has_no_privilege_host_namespace_or_capability() -> None:
    body = rendered(Role.CONSUMER)
    assert body["metadata"]["name"] == CONSUMER_DAEMONSET_NAME
    pod = pod_of(body)
    for host_access in ("hostPID", "hostNetwork", "hostIPC"):
        assert host_access not in pod
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
        "runAsNonRoot": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "ports" not in container or all("hostPort" not in p for p in container["ports"])
    volumes = pod["volumes"]
    assert all(set(v) == {"name", "hostPath"} for v in volumes)
    assert {v["hostPath"]["path"] for v in volumes} == CONSUMER_HOST_PATHS
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {v["name"]: v["hostPath"]["path"] for v in volumes} == mounts
    command = container["command"]
    assert command[command.index("--node-role") + 1] == "consumer"
    assert command[command.index("--host-runner") + 1] == "local"


def test_the_consumer_plugin_directory_follows_the_driver_and_kubelet_settings() -> None:
    body = rendered(
        Role.CONSUMER,
        kubelet={"pluginDirRoot": "/data/kubelet/plugins"},
        operator={"driverName": "gpu.example.com"},
    )
    paths = {v["hostPath"]["path"] for v in pod_of(body)["volumes"]}
    assert "/data/kubelet/plugins/gpu.example.com" in paths
    assert "/data/kubelet/plugins" not in paths


def test_the_daemon_reads_the_consumer_command_line() -> None:
    command = rendered(Role.CONSUMER)["spec"]["template"]["spec"]["containers"][0]["command"]
    env = {"NODE_NAME": "n1", "POD_UID": "u1", "THUNDER_API_TOKEN": "t"}
    config = parse_config(command[3:], env)
    assert (config.node_role, config.host_runner) == ("consumer", "local")
    serving = rendered(Role.SERVING)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert parse_config(serving[3:], env).node_role == "auto"


def test_a_consumer_daemon_never_serves_whatever_the_node_says() -> None:
    node = {"metadata": {"name": "n1", "labels": {"thundercompute.com/node": "true"}}}
    assert node_info(node, "x.example.com/ip", consumer_only=True).serving is False
    with pytest.raises(NodeSetupError, match=r"topology\.kubernetes\.io/zone"):
        node_info(node, "x.example.com/ip")


def test_the_serving_pod_keeps_what_enrollment_needs() -> None:
    body = rendered(Role.SERVING)
    assert body["metadata"]["name"] == DAEMONSET_NAME
    # The selector of the single DaemonSet of earlier releases: updated in place.
    assert body["spec"]["selector"] == {"matchLabels": selector_labels()}
    pod = pod_of(body)
    assert pod["hostPID"] is True
    (container,) = pod["containers"]
    assert container["securityContext"] == {"privileged": True}
    assert {v["hostPath"]["path"] for v in pod["volumes"]} == {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/thunder-dra",
    }
    command = container["command"]
    assert command[command.index("--host-runner") + 1] == "nsenter"
    assert "--node-role" not in command


def _matches(labels: dict[str, str], expression: dict[str, Any]) -> bool:
    key, operator = expression["key"], expression["operator"]
    if operator == "In":
        return labels.get(key) in expression["values"]
    if operator == "NotIn":
        return labels.get(key) not in expression["values"]
    if operator == "DoesNotExist":
        return key not in labels
    if operator == "Exists":
        return key in labels
    raise AssertionError(operator)


def runs_on(body: dict[str, Any], labels: dict[str, str]) -> bool:
    """What the scheduler and the DaemonSet controller decide from the pod's node
    selection (the default tolerations tolerate every taint)."""
    pod = pod_of(body)
    if any(labels.get(k) != v for k, v in pod["nodeSelector"].items()):
        return False
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(_matches(labels, e) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


LINUX = {"kubernetes.io/os": "linux"}
CONTROL_PLANE = {"node-role.kubernetes.io/control-plane": ""}
NODES: dict[str, tuple[dict[str, str], Role | None]] = {
    "serving": ({**LINUX, "thundercompute.com/node": "true"}, Role.SERVING),
    "worker": (LINUX, Role.CONSUMER),
    "worker labelled node=false": ({**LINUX, "thundercompute.com/node": "false"}, Role.CONSUMER),
    "control plane": ({**LINUX, **CONTROL_PLANE}, None),
    "legacy master": ({**LINUX, "node-role.kubernetes.io/master": ""}, None),
    "control plane, opted in": (
        {**LINUX, **CONTROL_PLANE, "thundercompute.com/consumer": "true"},
        Role.CONSUMER,
    ),
    "control plane, serving": (
        {**LINUX, **CONTROL_PLANE, "thundercompute.com/node": "true"},
        Role.SERVING,
    ),
    "not linux": ({"kubernetes.io/os": "windows"}, None),
}


@pytest.mark.parametrize("node", list(NODES))
def test_each_node_runs_at_most_one_daemon_of_its_role(node: str) -> None:
    labels, want = NODES[node]
    bodies = {role: rendered(role) for role in Role}
    running = [role for role, body in bodies.items() if runs_on(body, labels)]
    assert running == ([want] if want else [])


def test_both_roles_share_the_account_driver_selector_and_tolerations() -> None:
    spec = {"daemon": {"nodeSelector": {"pool": "gpu"}}}
    serving, consumer = rendered(Role.SERVING, **spec), rendered(Role.CONSUMER, **spec)
    for key in ("serviceAccountName", "nodeSelector", "tolerations", "priorityClassName"):
        assert pod_of(serving)[key] == pod_of(consumer)[key]

    def flag(body: dict[str, Any], name: str) -> str:
        command: list[str] = pod_of(body)["containers"][0]["command"]
        return command[command.index(name) + 1]

    assert flag(serving, "--driver-name") == flag(consumer, "--driver-name")
    # Each DaemonSet's selector matches its own pods; the consumer's never the serving's.
    for body in (serving, consumer):
        labels = body["spec"]["template"]["metadata"]["labels"]
        assert body["spec"]["selector"]["matchLabels"].items() <= labels.items()
    serving_labels = serving["spec"]["template"]["metadata"]["labels"]
    assert not consumer["spec"]["selector"]["matchLabels"].items() <= serving_labels.items()


def old_single_daemonset() -> dict[str, Any]:
    """The single DaemonSet an earlier release wrote: no role label, no node affinity."""
    body = copy.deepcopy(rendered(Role.SERVING))
    del body["spec"]["template"]["metadata"]["labels"][ROLE_LABEL]
    del body["metadata"]["labels"][ROLE_LABEL]
    del pod_of(body)["affinity"]
    body["metadata"]["annotations"] = {"thundercompute.com/rendered-hash": "old"}
    return body


def roll_out(fake: FakeKube, name: str, nodes: int) -> None:
    stored = fake.get(DAEMON_SETS.item(name, NAMESPACE))
    assert stored is not None
    stored["status"] = {
        "observedGeneration": stored["metadata"]["generation"],
        "desiredNumberScheduled": nodes,
        "updatedNumberScheduled": nodes,
        "numberReady": nodes,
    }
    fake.objects[next(k for k in fake.objects if k[-1] == name)] = stored


async def test_an_upgrade_narrows_the_old_daemonset_once_the_consumer_pods_are_ready() -> None:
    fake = FakeKube()
    fake.put(DAEMON_SETS.collection(NAMESPACE), old_single_daemonset())
    kube = KubeClient(fake)
    bodies = render_all(ThunderClusterSpec(), NAMESPACE, OWNER, "sa")

    first = await reconcile_daemonsets(kube, bodies)
    assert [(role, action) for role, _, action in first] == [
        (Role.CONSUMER, "created"),
        (Role.SERVING, "deferred"),
    ]
    old = fake.get(DAEMON_SETS.item(DAEMONSET_NAME, NAMESPACE))
    assert old is not None
    assert "affinity" not in pod_of(old)
    # Until the consumer pods are ready, the old DaemonSet keeps every node served.
    roll_out(fake, CONSUMER_DAEMONSET_NAME, 3)
    second = await reconcile_daemonsets(kube, bodies)
    assert [action for _, _, action in second] == ["unchanged", "updated"]
    narrowed = fake.get(DAEMON_SETS.item(DAEMONSET_NAME, NAMESPACE))
    assert narrowed is not None
    assert "affinity" in pod_of(narrowed)
    # Updated in place (same selector), never deleted: serving pods roll one by one.
    assert not fake.calls("DELETE")
    start = len(fake.requests)
    third = await reconcile_daemonsets(kube, bodies)
    assert [action for _, _, action in third] == ["unchanged", "unchanged"]
    assert all(r.method == "GET" for r in fake.requests[start:])


async def test_a_fresh_install_creates_both_daemonsets_at_once() -> None:
    fake = FakeKube()
    bodies = render_all(ThunderClusterSpec(), NAMESPACE, OWNER, "sa")
    done = await reconcile_daemonsets(KubeClient(fake), bodies)
    assert [(role, action) for role, _, action in done] == [
        (Role.CONSUMER, "created"),
        (Role.SERVING, "created"),
    ]


def _status(desired: int, ready: int) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": desired,
            "updatedNumberScheduled": desired,
            "numberReady": ready,
        },
    }


def test_daemon_ready_reads_both_roles() -> None:
    none = readiness_of_roles({Role.CONSUMER: _status(0, 0), Role.SERVING: _status(0, 0)})
    assert (none.ready, none.reason) == (False, "NoNodes")
    only_serving = readiness_of_roles({Role.CONSUMER: _status(0, 0), Role.SERVING: _status(2, 2)})
    assert (only_serving.ready, only_serving.reason) == (True, "AllPodsReady")
    both = readiness_of_roles({Role.CONSUMER: _status(3, 3), Role.SERVING: _status(2, 2)})
    assert both.ready
    assert CONSUMER_DAEMONSET_NAME in both.message
    waiting = readiness_of_roles({Role.CONSUMER: _status(3, 1), Role.SERVING: _status(2, 2)})
    assert (waiting.ready, waiting.reason) == (False, "PodsNotReady")
    assert waiting.message.startswith(f"{CONSUMER_DAEMONSET_NAME}: 1 of 3")
    missing = readiness_of_roles({Role.CONSUMER: None, Role.SERVING: _status(2, 2)})
    assert (missing.ready, missing.reason) == (False, "DaemonSetMissing")
