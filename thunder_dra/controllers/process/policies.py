"""The operator applies the driver's admission policies itself (``--apply-admission-policies``).

The chart and the kustomize manifests ship the policies of
:mod:`thunder_dra.kube.admissionpolicy`; an OLM bundle cannot (OLM installs no
ValidatingAdmissionPolicy), so its CSV starts the operator with this flag. At start-up,
before it reconciles anything, the operator creates each policy and binding for its own
namespace and ServiceAccounts, or replaces one whose rules differ. The policies are
ordinary cluster objects from then on: the API server enforces them whether or not the
operator runs. A failure stops the start-up with the API server's answer (the Pod
restarts), so the driver never runs in a cluster where it could not protect itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from thunder_dra.controllers.workload.daemonset import contains
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.admissionpolicy import (
    BINDING_KIND,
    OPERATOR_PREFIX,
    POLICY_KIND,
    Identity,
    policies,
)
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.resources import (
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)

_PATHS: Final = {
    POLICY_KIND: VALIDATING_ADMISSION_POLICIES,
    BINDING_KIND: VALIDATING_ADMISSION_POLICY_BINDINGS,
}

_log = logging.getLogger(__name__)


def operator_identity(
    namespace: str, daemon_service_account: str, operator_service_account: str
) -> Identity:
    return Identity(
        namespace=namespace,
        daemon_service_account=daemon_service_account,
        operator_service_account=operator_service_account,
        name_prefix=OPERATOR_PREFIX,
    )


def rendered(identity: Identity) -> list[dict[str, Any]]:
    """The objects this operator owns, labelled as its own."""
    labels = {
        naming.LABEL_APP_NAME: naming.APP_NAME,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    return [
        {**obj, "metadata": {**obj["metadata"], "labels": labels}} for obj in policies(identity)
    ]


def _up_to_date(stored: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return contains(bodies.labels(stored), want["metadata"]["labels"]) and contains(
        bodies.spec(stored), want["spec"]
    )


async def apply_policies(kube: KubeClient, identity: Identity) -> dict[str, str]:
    """Create or bring up to date every policy and binding; returns what was done to each
    (keyed ``<kind>/<name>``)."""
    done: dict[str, str] = {}
    for obj in rendered(identity):
        path = _PATHS[obj["kind"]]
        name = obj["metadata"]["name"]
        key = f"{obj['kind']}/{name}"
        stored = await kube.get_optional(path.item(name))
        if stored is None:
            await kube.create(path.collection(), obj)
            done[key] = "created"
        elif _up_to_date(stored, obj):
            done[key] = "unchanged"
        else:
            version = bodies.resource_version(stored)
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
            await kube.replace(path.item(name), body)
            done[key] = "updated"
    _log.info("admission policies applied", extra={"policies": done})
    return done
