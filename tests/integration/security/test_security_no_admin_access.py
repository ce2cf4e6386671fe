"""Admin access to a Thunder GPU is refused at creation, by the API server itself.

Admin access (``exactly.adminAccess: true``, allowed in a namespace labelled
``resource.kubernetes.io/admin-access: "true"``) gives a claim a device another claim
already holds. A Thunder GPU has no monitoring-only side: every claim gets its own Thunder
client. The chart's ``no-admin-access`` policy (rendered with `helm template`, its binding
narrowed to this test's namespace so the other tests sharing the control plane are
untouched) refuses such claims and claim templates for the driver's DeviceClasses and
leaves other drivers' classes alone; nothing serves the webhook here.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hack.cluster import binaries
from hack.testbed.kube import Kube, wait_for

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "thunder-device-plugin"
SUFFIX = "-no-admin-access"
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
UNSUPPORTED = "admin access is not supported by Thunder GPUs"
REASON = "a Thunder GPU cannot be shared for admin access; each claim gets its own Thunder client"
THUNDER_CLASS = "thunder-gpu-a6000"
OTHER_DRIVER = "gpu.example.com"


def _render(release: str) -> list[dict[str, Any]]:
    args = [str(binaries() / "helm"), "template", release, str(CHART)]
    args += ["--namespace", "thunder-system", "--show-only", "templates/admission-policies.yaml"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"].endswith(SUFFIX)]


def _refusal(call: Any, *args: Any) -> tuple[int, str]:
    try:
        call(*args)
    except ApiException as err:
        body = err.body.decode() if isinstance(err.body, bytes) else str(err.body or "")
        return int(err.status or 0), str(json.loads(body).get("message", body))
    raise AssertionError("created")


def _request(name: str, device_class: str, *, admin: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def _claim(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}},
    }


def _template(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


class Api:
    def __init__(self, kube: Kube, namespace: str, other_class: str) -> None:
        self.namespace = namespace
        self.other_class = other_class
        self.custom = k8s.CustomObjectsApi(kube.api_client)

    def create(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        created = self.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", self.namespace, resource, body
        )
        assert isinstance(created, dict)
        return created

    def claim(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.create("resourceclaims", body)

    def template(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.create("resourceclaimtemplates", body)


def _other_driver_class(name: str) -> dict[str, Any]:
    selector = f"device.driver == '{OTHER_DRIVER}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": selector}}]},
    }


@pytest.fixture(scope="module")
def api(kube: Kube) -> Iterator[Api]:
    with kube.namespace("adminaccess") as namespace:
        # Without this label the API server itself refuses adminAccess, before any policy.
        kube.core.patch_namespace(
            namespace, {"metadata": {"labels": {ADMIN_NAMESPACE_LABEL: "true"}}}
        )
        objects = _render(f"aa{uuid.uuid4().hex[:5]}")
        assert [o["kind"] for o in objects] == [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        objects[1]["spec"]["matchResources"] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
        other = _other_driver_class(f"other-gpu-{uuid.uuid4().hex[:6]}")
        try:
            kube.create(other)
            for obj in objects:
                kube.create(obj)
            api = Api(kube, namespace, other["metadata"]["name"])

            def enforced() -> bool:
                name = f"probe-{uuid.uuid4().hex[:6]}"
                try:
                    api.claim(_claim(name, [_request("gpu", THUNDER_CLASS, admin=True)]))
                except ApiException as err:
                    return err.status == 422 and REASON in str(err.body)
                api.custom.delete_namespaced_custom_object(
                    "resource.k8s.io", "v1", namespace, "resourceclaims", name
                )
                return False

            wait_for(enforced, "the no-admin-access policy enforced", timeout=60)
            yield api
        finally:
            for obj in reversed(objects):
                kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            kube.delete(other["apiVersion"], other["kind"], other["metadata"]["name"])


def test_a_claim_asking_admin_access_to_a_thunder_gpu_is_refused_with_the_reason(
    api: Api,
) -> None:
    requests = [
        _request("plain", THUNDER_CLASS, admin=False),
        _request("monitor", THUNDER_CLASS, admin=True),
    ]
    status, message = _refusal(api.claim, _claim("admin", requests))
    assert status == 422, message
    assert "ValidatingAdmissionPolicy" in message
    assert (
        f"{UNSUPPORTED} (request monitor, DeviceClass {THUNDER_CLASS} sets adminAccess): {REASON}"
    ) in message


def test_a_claim_template_asking_admin_access_to_a_thunder_gpu_is_refused_with_the_reason(
    api: Api,
) -> None:
    requests = [_request("gpu", "thunder-gpu-h100", admin=True)]
    status, message = _refusal(api.template, _template("admin", requests))
    assert status == 422, message
    assert (
        f"{UNSUPPORTED} (request gpu, DeviceClass thunder-gpu-h100 sets adminAccess): {REASON}"
    ) in message


def test_admin_access_to_another_drivers_class_and_plain_thunder_claims_are_accepted(
    api: Api,
) -> None:
    other = [_request("monitor", api.other_class, admin=True)]
    claim = api.claim(_claim("other-admin", other))
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True
    template = api.template(_template("other-admin", other))
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True
    # Beside a Thunder request without admin access, in the same claim.
    mixed = [_request("gpu", THUNDER_CLASS, admin=False), *other]
    api.claim(_claim("mixed", mixed))
    api.template(_template("mixed", mixed))
    # adminAccess: false is no admin access.
    api.claim(
        _claim(
            "explicit-false",
            [{"name": "gpu", "exactly": {**mixed[0]["exactly"], "adminAccess": False}}],
        )
    )
    api.claim(_claim("plain", [_request("gpu", THUNDER_CLASS, admin=False)]))
