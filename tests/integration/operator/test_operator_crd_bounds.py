"""The API server itself refuses out-of-range ThunderCluster specs, webhook or not.

Server-side dry-run creates against the local kube-apiserver with the generated CRD: no
webhook is involved, so this is what holds when the operator is down.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s

from hack.testbed.kube import Kube
from hack.testbed.operator import apply_crds
from thunder_dra.api.constants import GROUP, THUNDER_CLUSTER_PLURAL, VERSION


@pytest.fixture(scope="module")
def objects(kube: Kube) -> k8s.CustomObjectsApi:
    apply_crds(kube)
    return k8s.CustomObjectsApi(kube.api_client)


def _dry_run(objects: k8s.CustomObjectsApi, spec: dict[str, Any]) -> tuple[int, str]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ThunderCluster",
        "metadata": {"name": "bounds-check"},
        "spec": spec,
    }
    try:
        objects.create_cluster_custom_object(
            GROUP, VERSION, THUNDER_CLUSTER_PLURAL, body, dry_run="All"
        )
    except k8s.ApiException as exc:
        return int(exc.status or 0), str(json.loads(exc.body or "{}").get("message", exc.body))
    return 201, ""


def test_a_spec_at_the_bounds_is_accepted(objects: k8s.CustomObjectsApi) -> None:
    spec = {
        "operator": {
            "reconcileInterval": "24h",
            "orphanGracePeriod": "30s",
            "inventoryConcurrency": 64,
        },
        "daemon": {
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "tolerations": [{"operator": "Exists", "tolerationSeconds": 2**31 - 1}],
            "resources": {"limits": {"memory": "512Mi", "cpu": 2}},
        },
    }
    status, message = _dry_run(objects, spec)
    assert status == 201, message


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (
            {"operator": {"reconcileInterval": "99999999999999999999h"}},
            "spec.operator.reconcileInterval",
            "",
        ),
        (
            {"operator": {"reconcileInterval": "1s"}},
            "spec.operator.reconcileInterval",
            "must be between 5s and 24h",
        ),
        (
            {"operator": {"orphanGracePeriod": "2562048h"}},
            "spec.operator.orphanGracePeriod",
            "",
        ),
        (
            {"operator": {"orphanGracePeriod": "1" + "0" * 70 + "s"}},
            "spec.operator.orphanGracePeriod",
            "64",
        ),
        (
            {"operator": {"inventoryConcurrency": 2**62}},
            "spec.operator.inventoryConcurrency",
            "64",
        ),
        (
            {"operator": {"limits": {"maxPools": -1}}},
            "spec.operator.limits.maxPools",
            "",
        ),
        (
            {"daemon": {"tolerations": [{"operator": "Exists", "tolerationSeconds": -5}]}},
            "spec.daemon.tolerations[0].tolerationSeconds",
            "",
        ),
        (
            {"daemon": {"resources": {"limits": {"memory": "9" * 80}}}},
            "spec.daemon.resources.limits.memory",
            "",
        ),
        (
            {"daemon": {"extraEnv": [{"name": "THUNDER_DRA_CRASH_AT", "value": "x"}]}},
            "spec.daemon.extraEnv[0].name",
            "reserved",
        ),
        (
            {"daemon": {"extraEnv": [{"name": "NODE_NAME", "value": "other"}]}},
            "spec.daemon.extraEnv[0].name",
            "reserved",
        ),
        (
            {"daemon": {"extraEnv": [{"name": f"E{i}"} for i in range(65)]}},
            "spec.daemon.extraEnv",
            "64",
        ),
    ],
)
def test_the_api_server_refuses_out_of_range_input_naming_the_field(
    objects: k8s.CustomObjectsApi, spec: dict[str, Any], field: str, says: str
) -> None:
    status, message = _dry_run(objects, spec)
    assert status == 422, message
    assert field in message, message
    assert says in message, message
