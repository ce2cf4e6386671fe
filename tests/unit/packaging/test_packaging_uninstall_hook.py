"""The chart's pre-delete hook as rendered: what helm creates on `helm uninstall`.

Running it is tested in tests/integration/packaging/test_packaging_uninstall_hook.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.packaging.chartkit import CHART, RenderError, render

NAME = "tdp-thunder-device-plugin-pre-delete"
KINDS = ["ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]


def _hook(*args: str) -> list[dict[str, Any]]:
    m = render(*args)
    return [o for o in m.objects if o["metadata"].get("labels", {}).get(
        "app.kubernetes.io/component") == "pre-delete"]  # fmt: skip


def test_it_is_on_by_default_and_every_object_is_a_pre_delete_hook_that_goes_after() -> None:
    objects = _hook()
    assert sorted(o["kind"] for o in objects) == sorted(KINDS)
    weights = {}
    for obj in objects:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        weights[obj["kind"]] = int(annotations["helm.sh/hook-weight"])
    # What the Job needs exists before it.
    assert max(w for k, w in weights.items() if k != "Job") < weights["Job"]
    assert weights["ClusterRole"] < weights["ClusterRoleBinding"]


def test_it_can_be_switched_off() -> None:
    assert _hook("--set", "uninstallHook.enabled=false") == []


def test_its_service_account_may_only_find_and_delete_thunderclusters_and_list_clients() -> None:
    role = next(o for o in _hook() if o["kind"] == "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["thundercompute.com"], "resources": ["thunderclusters"],
         "verbs": ["get", "list", "delete"]},
        {"apiGroups": ["thundercompute.com"], "resources": ["clients"], "verbs": ["list"]},
    ]  # fmt: skip
    binding = next(o for o in _hook() if o["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": NAME, "namespace": "thunder-system"}
    ]


def test_the_job_runs_the_charts_script_in_the_operator_image_unprivileged() -> None:
    objects = {o["kind"]: o for o in _hook("--set", "operator.image.digest=sha256:" + "a" * 64)}
    script = (CHART / "files" / "pre-delete.py").read_text()
    assert objects["ConfigMap"]["data"] == {"pre-delete.py": script}
    job = objects["Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == (
        "ghcr.io/thunder-compute/thunder-device-plugin-operator@sha256:" + "a" * 64
    )
    assert container["command"] == ["python", "/hook/pre-delete.py"]
    assert container["volumeMounts"] == [{"name": "script", "mountPath": "/hook", "readOnly": True}]
    assert pod["volumes"] == [{"name": "script", "configMap": {"name": NAME}}]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TDP_RELEASE"] == "tdp"
    assert env["TDP_NAMESPACE"] == "thunder-system"
    assert env["TDP_OPERATOR"] == "tdp-thunder-device-plugin-operator"
    assert env["TDP_TIMEOUT_SECONDS"] == "120"


def test_the_timeout_bounds_the_wait_and_the_job() -> None:
    job = next(o for o in _hook("--set", "uninstallHook.timeoutSeconds=300") if o["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e["value"] for e in container["env"]}["TDP_TIMEOUT_SECONDS"] == "300"
    assert job["spec"]["activeDeadlineSeconds"] > 300


@pytest.mark.parametrize("seconds", ["5", "3601"])
def test_the_timeout_is_bounded_by_the_schema(seconds: str) -> None:
    with pytest.raises(RenderError) as caught:
        render("--set", f"uninstallHook.timeoutSeconds={seconds}")
    assert "timeoutSeconds" in str(caught.value)
