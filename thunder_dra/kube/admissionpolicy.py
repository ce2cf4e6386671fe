"""The driver's ValidatingAdmissionPolicies: defined once, rendered for every install path.

Six policies (``admissionregistration.k8s.io/v1``), each with a binding that denies.
Four narrow what the driver itself writes:

- **daemon-setup-secrets**: the daemon's ServiceAccount may create, update and delete
  only ``<claim>-thunder-setup`` Secrets owned by that ResourceClaim and annotated with
  its own node (``thundercompute.com/node-name``), and may update or delete only such
  a Secret its own node made;
- **daemon-clients**: the daemon may create, update and delete only Clients whose
  ``spec.nodeName`` is its own node;
- **client-writers**: only the driver's ServiceAccounts (daemon, operator) create or
  update Clients (status included); anyone else may only remove finalizers;
- **daemon-claim-status**: through ``resourceclaims/status`` the daemon may change only
  the ``status.devices`` entries of its own driver: ``allocation``, ``reservedFor`` and
  other drivers' entries stay as they are.

Two more hold everyone, the driver too: **one-model-per-claim** refuses claims that ask
one Thunder client for two GPU models, **no-admin-access** claims that ask a Thunder GPU
for admin access (see their builders).

"Its own node" is the node name the API server puts in the credential of a token bound
to a Pod (``authentication.kubernetes.io/node-name`` in ``request.userInfo.extra``,
Kubernetes 1.32+): the kubelet's projected token of the daemon's Pod carries it, so the
check needs neither the operator nor the webhook to be up. A daemon credential without
it (a legacy token Secret, impersonation without the extra) is refused every write.

The policies compare the request's user with the ServiceAccounts' usernames, which hold
the install namespace. :func:`policies` builds them for one :class:`Identity`; the chart
template and the kustomize files are generated from it with placeholders
(``python -m thunder_dra.kube.admissionpolicy``, a unit test checks the drift), and an
operator started with ``--apply-admission-policies`` (the OLM bundle, which cannot ship
policies) applies them for its own namespace (``thunder_dra.controllers.process.policies``).

Admission cannot read other objects, so "a claim allocated on this node" is checked as
far as the request shows it: the Secret's name, its owner (the claim of that name, with
the UID the Secret is labelled with; the garbage collector removes a Secret whose owner
does not exist) and its node annotation. A daemon can therefore never read, overwrite or
delete a Secret it did not make on its node; it can create a new setup Secret naming a
claim, which is removed with that claim.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from thunder_dra.api.constants import CLIENT_PLURAL, DOMAIN, GROUP
from thunder_dra.kube import naming

API_VERSION: Final = "admissionregistration.k8s.io/v1"
POLICY_KIND: Final = "ValidatingAdmissionPolicy"
BINDING_KIND: Final = "ValidatingAdmissionPolicyBinding"
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""The node of the Pod a ServiceAccount token is bound to, in the request's user extra."""
ANNOTATION_NODE_NAME: Final = f"{DOMAIN}/node-name"
"""On a setup Secret: the node whose daemon wrote it (an annotation: node names can be
longer than a label value)."""
LABEL_CLAIM_UID: Final = f"{DOMAIN}/claim-uid"
"""On a setup Secret and a Client: the UID of the claim it was made for."""
SETUP_SECRET_SUFFIX: Final = "-thunder-setup"
SUFFIXES: Final = (
    "daemon-setup-secrets",
    "daemon-clients",
    "client-writers",
    "one-model-per-claim",
    "no-admin-access",
    "daemon-claim-status",
)
DEFAULT_DEVICE_CLASS_PREFIX: Final = "thunder-gpu-"
DEFAULT_EXTENDED_RESOURCE_PREFIX: Final = f"{DOMAIN}/gpu-"
ONE_MODEL_REASON: Final = "a Thunder client serves one zone and one GPU model"
ADMIN_ACCESS_UNSUPPORTED: Final = "admin access is not supported by Thunder GPUs"
ADMIN_ACCESS_REASON: Final = (
    "a Thunder GPU cannot be shared for admin access; each claim gets its own Thunder client"
)
"""Why admin access is refused, at admission and by the daemon."""
OPERATOR_PREFIX: Final = "thunder-dra"
"""Name prefix of the policies an operator applies itself (one driver per cluster), so
its RBAC can name them (``resourceNames``)."""

REPO: Final = Path(__file__).resolve().parents[2]
CHART_TEMPLATE: Final = (
    REPO / "charts" / "thunder-device-plugin" / "templates" / "admission-policies.yaml"
)
CONFIG_DIR: Final = REPO / "config" / "policy"
CONFIG_FILE: Final = "admission_policies.yaml"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the driver is in one install: its namespace and ServiceAccounts."""

    namespace: str
    daemon_service_account: str
    operator_service_account: str
    name_prefix: str
    """Prefix of the (cluster-scoped) policy and binding names."""
    device_class_prefix: str = DEFAULT_DEVICE_CLASS_PREFIX
    """Names of the per-model DeviceClasses start with it (``one-model-per-claim``,
    ``no-admin-access``)."""
    extended_resource_prefix: str = DEFAULT_EXTENDED_RESOURCE_PREFIX
    """Names of the per-model extended resources start with it (``one-model-per-claim``)."""
    driver_name: str = naming.DRIVER_NAME
    """The DRA driver whose claim status entries the daemon writes (``daemon-claim-status``)."""

    def user(self, service_account: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{service_account}"

    def policy_name(self, suffix: str) -> str:
        return f"{self.name_prefix}-{suffix}"

    def policy_names(self) -> list[str]:
        return [self.policy_name(suffix) for suffix in SUFFIXES]


def _cel_string(value: str) -> str:
    if "'" in value or "\\" in value:
        raise ValueError(f"{value!r} cannot be a CEL string literal here")
    return f"'{value}'"


def _identity_variables(identity: Identity) -> list[dict[str, str]]:
    """The install namespace as its own variable (kustomize replaces just this literal;
    ``namespace`` itself is a reserved word in CEL)."""
    daemon = _cel_string(f":{identity.daemon_service_account}")
    operator = _cel_string(f":{identity.operator_service_account}")
    return [
        {"name": "driverNamespace", "expression": _cel_string(identity.namespace)},
        {
            "name": "daemonUser",
            "expression": f"'system:serviceaccount:' + variables.driverNamespace + {daemon}",
        },
        {
            "name": "operatorUser",
            "expression": f"'system:serviceaccount:' + variables.driverNamespace + {operator}",
        },
        {"name": "isDaemon", "expression": "request.userInfo.username == variables.daemonUser"},
        {
            "name": "node",
            "expression": (
                f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra"
                f" && size(request.userInfo.extra['{NODE_NAME_EXTRA}']) == 1"
                f" ? request.userInfo.extra['{NODE_NAME_EXTRA}'][0] : ''"
            ),
        },
    ]


def _node_bound() -> dict[str, str]:
    return {
        "expression": "!variables.isDaemon || variables.node != ''",
        "message": (
            "the daemon writes only with a token bound to its Pod on a node "
            f"(no {NODE_NAME_EXTRA} in the request's credential)"
        ),
        "reason": "Forbidden",
    }


def _policy(
    identity: Identity,
    suffix: str,
    rules: list[dict[str, Any]],
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": identity.policy_name(suffix)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "variables": _identity_variables(identity) + variables,
            "validations": validations,
        },
    }


def _binding(identity: Identity, suffix: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": BINDING_KIND,
        "metadata": {"name": identity.policy_name(suffix)},
        "spec": {"policyName": identity.policy_name(suffix), "validationActions": ["Deny"]},
    }


def _setup_secrets(identity: Identity) -> dict[str, Any]:
    annotation = f"[?'{ANNOTATION_NODE_NAME}'].orValue('')"
    claim_uid = f"[?'{LABEL_CLAIM_UID}'].orValue('')"
    rules = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["secrets"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
        }
    ]
    variables = [
        {
            "name": "secretName",
            "expression": (
                "request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name"
            ),
        },
        {
            "name": "newNode",
            "expression": (
                f"request.operation == 'DELETE' ? '' : object.metadata.?annotations{annotation}"
            ),
        },
        {
            "name": "oldNode",
            "expression": (
                f"request.operation == 'CREATE' ? '' : oldObject.metadata.?annotations{annotation}"
            ),
        },
    ]
    validations = [
        _node_bound(),
        {
            "expression": (
                f"!variables.isDaemon || variables.secretName.endsWith('{SETUP_SECRET_SUFFIX}')"
            ),
            "message": f"the daemon writes only <claim>{SETUP_SECRET_SUFFIX} Secrets",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || request.operation == 'DELETE'"
                " || variables.newNode == variables.node"
            ),
            "message": (
                f"a setup Secret the daemon writes carries its own node in {ANNOTATION_NODE_NAME}"
            ),
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || request.operation == 'CREATE'"
                " || variables.oldNode == variables.node"
            ),
            "message": "the daemon may replace or delete only a setup Secret its own node made",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || request.operation == 'DELETE'"
                " || (size(object.metadata.?ownerReferences.orValue([])) == 1"
                " && object.metadata.ownerReferences.all(r, r.kind == 'ResourceClaim'"
                " && r.apiVersion.startsWith('resource.k8s.io/')"
                f" && r.name + '{SETUP_SECRET_SUFFIX}' == object.metadata.name"
                f" && r.uid == object.metadata.?labels{claim_uid}))"
            ),
            "message": (
                "a setup Secret is owned by the ResourceClaim it is named after, "
                f"with the UID in its {LABEL_CLAIM_UID} label"
            ),
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || request.operation != 'UPDATE'"
                f" || object.metadata.?labels{claim_uid}"
                f" == oldObject.metadata.?labels{claim_uid}"
            ),
            "message": "the daemon may replace a setup Secret only for the claim it was made for",
            "reason": "Forbidden",
        },
    ]
    return _policy(identity, "daemon-setup-secrets", rules, variables, validations)


def _client_rules(operations: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": [GROUP],
            "apiVersions": ["*"],
            "resources": [CLIENT_PLURAL, f"{CLIENT_PLURAL}/status"],
            "operations": operations,
        }
    ]


def _daemon_clients(identity: Identity) -> dict[str, Any]:
    validations = [
        _node_bound(),
        {
            "expression": (
                "!variables.isDaemon || request.operation == 'DELETE'"
                " || object.spec.nodeName == variables.node"
            ),
            "message": "the daemon writes only Clients whose spec.nodeName is its own node",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || request.operation == 'CREATE'"
                " || oldObject.spec.nodeName == variables.node"
            ),
            "message": "the daemon may change or delete only Clients of its own node",
            "reason": "Forbidden",
        },
    ]
    rules = _client_rules(["CREATE", "UPDATE", "DELETE"])
    return _policy(identity, "daemon-clients", rules, [], validations)


def _client_writers(identity: Identity) -> dict[str, Any]:
    daemon = f"{identity.namespace}/{identity.daemon_service_account}"
    operator = f"{identity.namespace}/{identity.operator_service_account}"
    finalizers = "metadata.?finalizers.orValue([])"
    validations = [
        {
            "expression": (
                "variables.isDaemon || request.userInfo.username == variables.operatorUser"
                " || (request.operation == 'UPDATE' && request.?subResource.orValue('') == ''"
                " && object.spec == oldObject.spec"
                " && object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})"
                " && object.metadata.?annotations.orValue({})"
                " == oldObject.metadata.?annotations.orValue({})"
                f" && object.{finalizers}.all(f, f in oldObject.{finalizers}))"
            ),
            "message": (
                f"Clients are written only by the driver (ServiceAccounts {daemon} and "
                f"{operator}); others may only remove finalizers"
            ),
            "reason": "Forbidden",
        }
    ]
    return _policy(identity, "client-writers", _client_rules(["CREATE", "UPDATE"]), [], validations)


def _request_class() -> str:
    """The one DeviceClass a top-level request selects, or '' when it names several.

    ``exactly``: its class. ``firstAvailable``: the class its subrequests all name, or ''
    when they name different classes (alternatives: only one of them is allocated)."""
    first = "r.firstAvailable[0].deviceClassName"
    return (
        "has(r.exactly) ? r.exactly.?deviceClassName.orValue('')"
        " : (has(r.firstAvailable) && size(r.firstAvailable) > 0"
        f" && r.firstAvailable.all(s, s.?deviceClassName.orValue('') == {first})"
        f" ? {first} : '')"
    )


def _one_model_per_claim(identity: Identity) -> dict[str, Any]:
    """A claim's devices come from one Thunder client, so from one GPU model.

    Refused: a ResourceClaim, or a ResourceClaimTemplate's claim, with two top-level
    requests whose DeviceClasses (``exactly``, or the one class all of a ``firstAvailable``
    request's subrequests name) are two different classes starting with the DeviceClass
    prefix; a Pod whose containers and init containers together limit or request two
    different extended resources starting with the extended resource prefix (the
    scheduler makes one claim for them). A prioritized list naming several models is
    accepted (one alternative is allocated), and so are other drivers' classes. An empty
    prefix turns its half of the check off. Only CREATE is checked: a claim's spec is
    immutable, a template's spec too, a Pod's containers'
    resources change only through resize, which the API server refuses for extended
    resources.
    """
    classes = _cel_string(identity.device_class_prefix)
    resources = _cel_string(identity.extended_resource_prefix)
    rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "operations": ["CREATE"],
        },
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
        },
    ]
    thunder_key = "k.startsWith(variables.resourcePrefix)"
    other_key = f"{thunder_key} && k != variables.firstResource"
    variables = [
        {"name": "classPrefix", "expression": classes},
        {"name": "resourcePrefix", "expression": resources},
        {"name": "isPod", "expression": "request.resource.resource == 'pods'"},
        {
            "name": "claimRequests",
            "expression": (
                "request.resource.resource == 'resourceclaimtemplates'"
                " ? object.spec.?spec.?devices.?requests.orValue([])"
                " : object.spec.?devices.?requests.orValue([])"
            ),
        },
        {
            "name": "thunderClasses",
            "expression": (
                f"variables.claimRequests.map(r, {_request_class()})"
                ".filter(c, variables.classPrefix != '' && c.startsWith(variables.classPrefix))"
            ),
        },
        {
            "name": "firstClass",
            "expression": ("size(variables.thunderClasses) > 0 ? variables.thunderClasses[0] : ''"),
        },
        {
            "name": "otherClasses",
            "expression": "variables.thunderClasses.filter(c, c != variables.firstClass)",
        },
        {
            "name": "resourceLists",
            "expression": (
                "(object.spec.?containers.orValue([])"
                " + object.spec.?initContainers.orValue([]))"
                ".map(c, c.?resources.?limits.orValue({}).map(k, k)"
                " + c.?resources.?requests.orValue({}).map(k, k))"
            ),
        },
        {
            "name": "thunderResources",
            "expression": (
                "variables.resourcePrefix == '' ? []"
                f" : variables.resourceLists.filter(l, l.exists(k, {thunder_key}))"
            ),
        },
        {
            "name": "firstResource",
            "expression": (
                "size(variables.thunderResources) > 0"
                f" ? variables.thunderResources[0].filter(k, {thunder_key})[0] : ''"
            ),
        },
        {
            "name": "otherResources",
            "expression": (
                f"variables.thunderResources.filter(l, l.exists(k, {other_key}))"
                f".map(l, l.filter(k, {other_key})[0])"
            ),
        },
    ]
    validations = [
        {
            "expression": "variables.isPod || size(variables.otherClasses) == 0",
            "messageExpression": (
                f"'{ONE_MODEL_REASON}: one claim may not request two Thunder GPU models ('"
                " + variables.firstClass + ', ' + variables.otherClasses[0]"
                " + '); use one claim per model'"
            ),
            "message": (
                f"{ONE_MODEL_REASON}: one claim may not request two Thunder GPU models;"
                " use one claim per model"
            ),
            "reason": "Invalid",
        },
        {
            "expression": "!variables.isPod || size(variables.otherResources) == 0",
            "messageExpression": (
                f"'{ONE_MODEL_REASON}: the resources of one Pod may not name two Thunder GPU"
                " models (' + variables.firstResource + ', ' + variables.otherResources[0]"
                " + '), the scheduler makes one claim for them; use one Pod per model'"
            ),
            "message": (
                f"{ONE_MODEL_REASON}: the resources of one Pod may not name two Thunder GPU"
                " models, the scheduler makes one claim for them; use one Pod per model"
            ),
            "reason": "Invalid",
        },
    ]
    return _policy(identity, "one-model-per-claim", rules, variables, validations)


def _no_admin_access(identity: Identity) -> dict[str, Any]:
    """No claim asks a Thunder GPU for admin access.

    Admin access (``exactly.adminAccess: true``, allowed in namespaces labelled
    ``resource.kubernetes.io/admin-access: "true"``) lets a claim get a device another
    claim already holds, for monitoring. A Thunder GPU has no monitoring-only side: the
    daemon would enroll a full Thunder client for it, so the zone would serve more
    clients than its pool publishes. Refused: a ResourceClaim, or a
    ResourceClaimTemplate's claim, with a request whose ``exactly`` sets ``adminAccess``
    for a DeviceClass starting with the DeviceClass prefix (a ``firstAvailable``
    subrequest has no ``adminAccess`` field). Other drivers' classes are accepted; an
    empty prefix turns the check off (the daemon still refuses to prepare such a claim).
    The rule names version ``v1`` only: a request in another served version reaches the
    policy converted to it (``matchPolicy: Equivalent``, the default). Only CREATE is
    checked: a claim's and a template's spec cannot change.
    """
    rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "operations": ["CREATE"],
        }
    ]
    admin = (
        "variables.classPrefix != '' && r.?exactly.?adminAccess.orValue(false)"
        " && r.exactly.?deviceClassName.orValue('').startsWith(variables.classPrefix)"
    )
    variables = [
        {"name": "classPrefix", "expression": _cel_string(identity.device_class_prefix)},
        {
            "name": "claimRequests",
            "expression": (
                "request.resource.resource == 'resourceclaimtemplates'"
                " ? object.spec.?spec.?devices.?requests.orValue([])"
                " : object.spec.?devices.?requests.orValue([])"
            ),
        },
        {
            "name": "adminRequests",
            "expression": (
                f"variables.claimRequests.filter(r, {admin})"
                ".map(r, r.name + ', DeviceClass ' + r.exactly.deviceClassName)"
            ),
        },
    ]
    validations = [
        {
            "expression": "size(variables.adminRequests) == 0",
            "messageExpression": (
                f"'{ADMIN_ACCESS_UNSUPPORTED} (request ' + variables.adminRequests[0]"
                f" + ' sets adminAccess): {ADMIN_ACCESS_REASON}'"
            ),
            "message": (
                f"{ADMIN_ACCESS_UNSUPPORTED} (a request for a Thunder DeviceClass sets"
                f" adminAccess): {ADMIN_ACCESS_REASON}"
            ),
            "reason": "Invalid",
        }
    ]
    return _policy(identity, "no-admin-access", rules, variables, validations)


def _daemon_claim_status(identity: Identity) -> dict[str, Any]:
    """The daemon changes only its own driver's entries in a claim's ``status.devices``.

    Its RBAC grants ``patch`` on ``resourceclaims/status`` and, on the synthetic
    subresource ``resourceclaims/driver``, ``arbitrary-node:patch`` for its driver alone
    (the allocation of a Thunder device names a zone, not a node, so
    ``associated-node:patch`` is never enough). With the API server's granular status
    authorization (``DRAResourceClaimGranularStatusAuthorization``, on by default since
    1.36) that already refuses other drivers' entries and ``allocation`` or
    ``reservedFor`` (``resourceclaims/binding``); this policy holds the same where that
    gate is off (older or configured control planes), and against any wider grant: an
    update by the daemon must leave ``allocation``, ``reservedFor`` and every entry of
    another driver exactly as they were. A claim whose allocation names a node (devices
    with ``bindsToNode``, enrollment before binding) is written only by the daemon of that
    node, which is what ``associated-node:patch`` alone would allow. Its token must be
    bound to its Pod on a node, as for its other writes.
    """
    rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["resourceclaims/status"],
            "operations": ["UPDATE"],
        }
    ]
    others = "d, d.driver != variables.driverName"
    variables = [
        {"name": "driverName", "expression": _cel_string(identity.driver_name)},
        {
            "name": "otherDevices",
            "expression": f"object.?status.?devices.orValue([]).filter({others})",
        },
        {
            "name": "oldOtherDevices",
            "expression": f"oldObject.?status.?devices.orValue([]).filter({others})",
        },
        {
            # An allocation of devices with bindsToNode names its node in one matchFields
            # term: what associated-node:patch would check, for the daemon's own node.
            "name": "otherNode",
            "expression": (
                "object.?status.?allocation.?nodeSelector.?nodeSelectorTerms.orValue([])"
                ".exists(t, t.?matchFields.orValue([]).exists(f,"
                " f.key == 'metadata.name' && f.operator == 'In'"
                " && !(variables.node in f.values)))"
            ),
        },
    ]
    validations = [
        _node_bound(),
        {
            "expression": (
                "!variables.isDaemon"
                " || (object.?status.?allocation == oldObject.?status.?allocation"
                " && object.?status.?reservedFor == oldObject.?status.?reservedFor)"
            ),
            "message": "the daemon may not change a claim's status.allocation or reservedFor",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.isDaemon || !variables.otherNode",
            "message": (
                "the daemon may write the status of a claim allocated to one node"
                " (bindsToNode) only from that node"
            ),
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.isDaemon || variables.otherDevices == variables.oldOtherDevices"
            ),
            "message": (
                "the daemon may change only the status.devices entries of its own driver"
                f" ({identity.driver_name})"
            ),
            "reason": "Forbidden",
        },
    ]
    return _policy(identity, "daemon-claim-status", rules, variables, validations)


def policies(identity: Identity) -> list[dict[str, Any]]:
    """Every policy and its binding, for one install."""
    out: list[dict[str, Any]] = []
    for policy in (
        _setup_secrets(identity),
        _daemon_clients(identity),
        _client_writers(identity),
        _one_model_per_claim(identity),
        _no_admin_access(identity),
        _daemon_claim_status(identity),
    ):
        out.append(policy)
        suffix = policy["metadata"]["name"][len(identity.name_prefix) + 1 :]
        out.append(_binding(identity, suffix))
    return out


# -- rendering for the chart and kustomize --------------------------------------------

_HEADER: Final = (
    "# Generated by `python -m thunder_dra.kube.admissionpolicy` from\n"
    "# thunder_dra/kube/admissionpolicy.py. Do not edit: change the module and regenerate.\n"
)
_LABELS: Final = "@@LABELS@@"


class _Dumper(yaml.SafeDumper):
    """CEL expressions as literal blocks, so quotes stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if ("'" in value or "\n" in value) and not value.startswith(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump_all(objects: Sequence[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=10**6)


def _with_labels(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    labelled = []
    for obj in objects:
        meta = {**obj["metadata"], "labels": _LABELS}
        labelled.append({**obj, "metadata": meta})
    return labelled


_CHART_PLACEHOLDERS: Final = {
    "@@NAMESPACE@@": "{{ .Release.Namespace }}",
    "@@DAEMON@@": '{{ include "tdp.daemonServiceAccount" . }}',
    "@@OPERATOR@@": '{{ include "tdp.operatorServiceAccount" . }}',
    "@@PREFIX@@": '{{ include "tdp.webhookConfiguration" . }}',
    "@@CLASSPREFIX@@": "{{ .Values.operator.deviceClassPrefix }}",
    "@@RESOURCEPREFIX@@": "{{ .Values.operator.extendedResourcePrefix }}",
}


def chart_template() -> str:
    """The chart's templates/admission-policies.yaml."""
    identity = Identity(
        "@@NAMESPACE@@",
        "@@DAEMON@@",
        "@@OPERATOR@@",
        "@@PREFIX@@",
        "@@CLASSPREFIX@@",
        "@@RESOURCEPREFIX@@",
    )
    text = _dump_all(_with_labels(policies(identity)))
    for token, helm in _CHART_PLACEHOLDERS.items():
        text = text.replace(token, helm)
    text = text.replace(
        f"  labels: '{_LABELS}'\n",
        '  labels:\n    {{- include "tdp.labels" . | nindent 4 }}\n',
    )
    header = "".join(f"{{{{- /* {line[2:]} */}}}}\n" for line in _HEADER.splitlines())
    return f"{header}{{{{- if .Values.rbac.create }}}}\n{text}{{{{- end }}}}\n"


CONFIG_IDENTITY: Final = Identity("system", "thunder-daemon", "thunder-operator", OPERATOR_PREFIX)
"""As in config/rbac: ``system`` is a placeholder; the replacements in
config/default/kustomization.yaml rewrite each policy's ``driverNamespace`` variable to
the install namespace. The names are those an operator applies itself (the OLM bundle),
so kustomize and OLM installs name the policies alike."""


def config_manifests() -> str:
    """config/policy/admission_policies.yaml."""
    objects = []
    for obj in policies(CONFIG_IDENTITY):
        meta = {**obj["metadata"], "labels": {naming.LABEL_COMPONENT: naming.COMPONENT_DAEMON}}
        objects.append({**obj, "metadata": meta})
    return _HEADER + _dump_all(objects)


def expected_files() -> dict[Path, str]:
    return {CHART_TEMPLATE: chart_template(), CONFIG_DIR / CONFIG_FILE: config_manifests()}


def drifted() -> list[Path]:
    return [
        path
        for path, text in expected_files().items()
        if not path.is_file() or path.read_text() != text
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m thunder_dra.kube.admissionpolicy",
        description="Write the chart template and config/policy manifests of the policies.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the files drifted")
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted()
        for path in stale:
            print(
                f"{path} is out of date with thunder_dra/kube/admissionpolicy.py", file=sys.stderr
            )
        return 1 if stale else 0
    for path, text in expected_files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
