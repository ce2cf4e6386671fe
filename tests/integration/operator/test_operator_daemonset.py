"""The node daemon DaemonSet follows the ThunderCluster spec and never holds the token."""

from __future__ import annotations

import json
from typing import Any

from hack.testbed.kube import wait_for
from hack.testbed.operator import API_TOKEN, OperatorEnv

DAEMONSET = "thunder-dra-daemon"


def daemonset(env: OperatorEnv) -> dict[str, Any] | None:
    return env.kube.get("apps/v1", "DaemonSet", DAEMONSET, env.namespace)


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (only,) = ds["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = only
    return found


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_daemonset_is_rendered_from_the_spec(env: OperatorEnv) -> None:
    ds = wait_for(lambda: daemonset(env), "the DaemonSet")
    spec = env.thundercluster()["spec"]
    meta = ds["metadata"]
    assert meta["labels"]["app.kubernetes.io/name"] == "thunder-dra-driver"
    assert meta["labels"]["app.kubernetes.io/component"] == "daemon"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ThunderCluster", env.name, True)
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["serviceAccountName"] == "thunder-daemon"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "system-node-critical"
    daemon = container(ds)
    assert daemon["securityContext"]["privileged"] is True
    assert daemon["image"].startswith("ghcr.io/thunder-compute/thunder-device-plugin:")
    command = daemon["command"]
    assert command[:3] == ["python", "-m", "thunder_dra.plugin"]
    assert flag(command, "--api-url") == spec["thunder"]["apiURL"]
    assert flag(command, "--driver-name") == "thundercompute.com"
    assert flag(command, "--plugin-dir-root") == "/var/lib/kubelet/plugins"
    assert flag(command, "--registry-dir") == "/var/lib/kubelet/plugins_registry"
    assert flag(command, "--cdi-dir") == "/var/run/cdi"
    assert flag(command, "--state-dir") == "/var/lib/thunder-dra"
    assert flag(command, "--min-driver-version") == "610"
    assert flag(command, "--thunderd-port-range") == "32000-32199"
    assert flag(command, "--host-runner") == "nsenter"
    assert flag(command, "--health-port") == "8081"
    env_vars = {e["name"]: e for e in daemon["env"]}
    assert env_vars["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env_vars["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env_vars["THUNDER_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "thunder-api",
        "key": "THUNDER_API_TOKEN",
    }
    mounts = {m["mountPath"] for m in daemon["volumeMounts"]}
    assert mounts == {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/thunder-dra",
    }
    assert daemon["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert daemon["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert API_TOKEN not in json.dumps(ds), "the token reaches pods only through the Secret"


def test_the_daemonset_follows_spec_changes(env: OperatorEnv) -> None:
    env.add_zone(env.zone("ds"), [("A6000", 1)])
    env.sync()
    env.patch_thundercluster(
        {
            "spec": {
                "daemon": {
                    "image": {"tag": "v9.9.9"},
                    "nodeSelector": {"kubernetes.io/os": "linux", "example.com/gpu-host": "yes"},
                    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                    "logLevel": "debug",
                }
            }
        }
    )
    try:
        # A spec change starts a pass by itself.
        ds = wait_for(
            lambda: (d := daemonset(env)) and container(d)["image"].endswith(":v9.9.9") and d,
            "the DaemonSet to take the new image",
        )
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "example.com/gpu-host": "yes"}
        daemon = container(ds)
        assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in daemon["env"]
        assert flag(daemon["command"], "--log-level") == "debug"

        def slices_follow() -> bool:
            for piece in env.slices():
                (term,) = piece["spec"]["nodeSelector"]["nodeSelectorTerms"]
                keys = {e["key"] for e in term["matchExpressions"]}
                if "example.com/gpu-host" not in keys:
                    return False
            return True

        wait_for(slices_follow, "the slices to select the daemon's nodes")

        mark = len(env.cluster.audit_events())
        env.sync()
        env.sync()
        assert env.operator_writes(mark, ["daemonsets"]) == [], "an unchanged spec writes nothing"
    finally:
        env.patch_thundercluster(
            {
                "spec": {
                    "daemon": {
                        "image": {"tag": ""},
                        "nodeSelector": {"example.com/gpu-host": None},
                        "extraEnv": [],
                        "logLevel": "info",
                    }
                }
            }
        )
    wait_for(
        lambda: (
            (d := daemonset(env))
            and "example.com/gpu-host" not in d["spec"]["template"]["spec"]["nodeSelector"]
        ),
        "a removed nodeSelector label to go",
    )


def test_a_daemonset_edited_by_hand_is_put_back(env: OperatorEnv) -> None:
    ds = wait_for(lambda: daemonset(env), "the DaemonSet")
    image = container(ds)["image"]
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/other:1"
    env.kube.resource("apps/v1", "DaemonSet").replace(body=ds, namespace=env.namespace)
    env.sync()
    assert container(wait_for(lambda: daemonset(env), "the DaemonSet"))["image"] == image
