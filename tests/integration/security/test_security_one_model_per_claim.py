"""Claims that can never be prepared are refused at creation, by the API server itself.

A Thunder client serves one zone and one GPU model, so a claim whose requests select two
models' DeviceClasses is allocated and then fails every prepare. The chart's
``one-model-per-claim`` policy (rendered with `helm template`, its binding narrowed to
this test's namespace so the other tests sharing the control plane are untouched)
refuses such claims, claim templates and Pods whose resources name two models' extended
resources; nothing serves the webhook here.
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
SUFFIX = "-one-model-per-claim"
REASON = "a Thunder client serves one zone and one GPU model"


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


def _request(name: str, device_class: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class}}


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


def _container(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": "example.invalid/none", "resources": {"limits": limits}}


def _pod(name: str, containers: list[dict[str, Any]], init: list[dict[str, Any]]) -> Any:
    spec: dict[str, Any] = {"containers": containers, "automountServiceAccountToken": False}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class Api:
    def __init__(self, kube: Kube, namespace: str) -> None:
        self.namespace = namespace
        self.custom = k8s.CustomObjectsApi(kube.api_client)
        self.core = kube.core

    def claim(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", self.namespace, "resourceclaims", body
        )

    def template(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", self.namespace, "resourceclaimtemplates", body
        )

    def pod(self, body: Any) -> None:
        self.core.create_namespaced_pod(self.namespace, body)


TWO = [_request("a", "thunder-gpu-a6000"), _request("b", "thunder-gpu-h100")]


@pytest.fixture(scope="module")
def api(kube: Kube) -> Iterator[Api]:
    with kube.namespace("onemodel") as namespace:
        objects = _render(f"om{uuid.uuid4().hex[:5]}")
        assert [o["kind"] for o in objects] == [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        objects[1]["spec"]["matchResources"] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
        try:
            for obj in objects:
                kube.create(obj)
            api = Api(kube, namespace)

            def enforced() -> bool:
                name = f"probe-{uuid.uuid4().hex[:6]}"
                try:
                    api.claim(_claim(name, TWO))
                except ApiException as err:
                    return err.status == 422 and REASON in str(err.body)
                api.custom.delete_namespaced_custom_object(
                    "resource.k8s.io", "v1", namespace, "resourceclaims", name
                )
                return False

            wait_for(enforced, "the one-model-per-claim policy enforced", timeout=60)
            yield api
        finally:
            for obj in reversed(objects):
                kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def test_a_claim_requesting_two_models_is_refused_with_the_reason(api: Api) -> None:
    status, message = _refusal(api.claim, _claim("two", TWO))
    assert status == 422
    assert "ValidatingAdmissionPolicy" in message
    assert (
        f"{REASON}: one claim may not request two Thunder GPU models "
        "(thunder-gpu-a6000, thunder-gpu-h100); use one claim per model"
    ) in message
    # A request whose alternatives all name one model counts as that model.
    same = {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "thunder-gpu-h100"}]}
    status, message = _refusal(api.claim, _claim("two-first", [TWO[0], same]))
    assert status == 422
    assert "(thunder-gpu-a6000, thunder-gpu-h100)" in message


def test_a_claim_template_requesting_two_models_is_refused_with_the_reason(api: Api) -> None:
    status, message = _refusal(api.template, _template("two", TWO))
    assert status == 422
    assert f"{REASON}: one claim may not request two Thunder GPU models" in message
    assert "(thunder-gpu-a6000, thunder-gpu-h100)" in message


def test_a_pod_limiting_two_models_is_refused_with_the_reason(api: Api) -> None:
    a6000 = _container("a", {"thundercompute.com/gpu-a6000": "1"})
    h100 = _container("b", {"thundercompute.com/gpu-h100": "1"})
    for name, containers, init in (
        ("two-containers", [a6000, h100], []),
        ("init-container", [a6000], [h100]),
        (
            "one-container",
            [
                _container(
                    "c", {"thundercompute.com/gpu-a6000": "1", "thundercompute.com/gpu-h100": "1"}
                )
            ],
            [],
        ),
    ):
        status, message = _refusal(api.pod, _pod(name, containers, init))
        assert status == 422, name
        # Within one container the two names come in the map's order.
        models = "thundercompute.com/gpu-a6000, thundercompute.com/gpu-h100"
        swapped = "thundercompute.com/gpu-h100, thundercompute.com/gpu-a6000"
        reason = f"{REASON}: the resources of one Pod may not name two Thunder GPU models"
        assert f"{reason} ({models})" in message or f"{reason} ({swapped})" in message, message
        assert "the scheduler makes one claim for them; use one Pod per model" in message


def test_one_model_alternatives_and_other_drivers_are_accepted(api: Api) -> None:
    api.claim(
        _claim("one", [_request("a", "thunder-gpu-a6000"), _request("b", "thunder-gpu-a6000")])
    )
    alternatives = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "h100", "deviceClassName": "thunder-gpu-h100"},
            {"name": "a6000", "deviceClassName": "thunder-gpu-a6000"},
        ],
    }
    api.claim(_claim("prioritized", [alternatives]))
    api.claim(_claim("prioritized-and-one", [alternatives, _request("c", "thunder-gpu-a6000")]))
    mixed = [_request("a", "thunder-gpu-a6000"), _request("nic", "example.com-nic")]
    api.claim(_claim("mixed", mixed))
    api.claim(_claim("others", [_request("a", "gpu.example.com"), _request("b", "nic.example")]))
    api.template(_template("one", [_request("a", "thunder-gpu-h100")]))
    api.template(_template("mixed", mixed))
    # CREATE is enough: the API server refuses any change of a template's spec.
    status, message = _refusal(
        api.custom.patch_namespaced_custom_object,
        "resource.k8s.io",
        "v1",
        api.namespace,
        "resourceclaimtemplates",
        "one",
        {"spec": {"spec": {"devices": {"requests": TWO}}}},
    )
    assert status == 422, message
    assert "immutable" in message, message
    a6000 = {"thundercompute.com/gpu-a6000": "1"}
    api.pod(_pod("one", [_container("a", a6000), _container("b", a6000)], [_container("i", a6000)]))
    api.pod(_pod("mixed", [_container("a", {**a6000, "example.com/nic": "1"})], []))
    api.pod(_pod("plain", [_container("a", {"cpu": "1"})], []))
