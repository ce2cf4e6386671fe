"""The node daemon DaemonSets, rendered from the ThunderCluster spec.

Described in docs/operator.md#the-daemon-daemonset and docs/daemon.md#node-roles.

Two DaemonSets in the operator's namespace, one per node role, on disjoint node sets,
both owned by the ThunderCluster (a namespaced object may have a cluster-scoped owner),
so deleting the ThunderCluster removes them. Both run `python -m thunder_dra.plugin`
with the same driver name and ServiceAccount:

- `thunder-dra-daemon`, the serving role, on nodes labelled `thundercompute.com/node=true`:
  host PID and privileged (the daemon enters the host's namespaces with nsenter to run
  thunderd's installer), with the kubelet plugin and registration directories, the CDI
  spec directory and the daemon's state directory mounted from the host. It keeps the
  name the single DaemonSet of earlier releases had, and its selector, so an upgrade
  updates it in place.
- `thunder-dra-daemon-consumer`, the consumer role, on every other node: no privilege,
  no host namespaces, every capability dropped, a read-only root filesystem, and only
  the four host directories it writes (the plugin directory narrowed to the driver's
  own). Its command line says `--node-role consumer`: it never enrolls the node.

Both roles' pods carry the daemon's component labels (monitoring selects them), so the
serving DaemonSet's selector, which cannot change, matches consumer pods too. That is
harmless: a DaemonSet controller only adopts pods no controller owns, and the operator
deletes a DaemonSet with its pods, never orphaning them.

Neither runs on a control-plane node (`node-role.kubernetes.io/control-plane` or
`master`) unless the node carries the serving label or the opt-in label
`thundercompute.com/consumer=true`.

On an upgrade from the single DaemonSet, the consumer DaemonSet is created first, and the
serving one is narrowed to serving nodes only once every consumer pod is ready (the old
pod and the new one serve side by side meanwhile, as in a rolling update): no node is
left without a plugin (`reconcile_daemonsets`).

Rolling updates use `maxSurge: 1, maxUnavailable: 0`: the new pod starts beside the
old one (each registers its own per-pod socket), so every node keeps a serving kubelet
plugin throughout an upgrade.

The API token reaches the pods only through a `secretKeyRef`; it never appears in the
DaemonSet. A `secretKeyRef` can only name a Secret of the pod's own namespace, so the
Secret must live in the operator's namespace (the chart puts both in one).

The pods get the operator's own `OTEL_*` tracing settings under the daemon's service
name (`workload.tracing`); OTLP headers, which may carry credentials, again only through a
`secretKeyRef`.

Writes happen only when the rendered object differs from the stored one in what this
operator sets: the stored object must carry the hash of the current rendering (which
catches any spec change, removals included) and contain every rendered field (which
catches edits made to the DaemonSet by hand). Server defaults are ignored.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final

from thunder_dra.api.constants import DOMAIN
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.shared.ownership import ThunderClusterRef, update_body
from thunder_dra.controllers.workload.tracing import NO_TRACING, DaemonTracing
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import NotFound
from thunder_dra.kube.quantity import parse_quantity
from thunder_dra.kube.resources import DAEMON_SETS
from thunder_dra.version import __version__

DAEMONSET_NAME: Final = "thunder-dra-daemon"
"""The serving role's DaemonSet (the name of the single DaemonSet of earlier releases)."""
CONSUMER_DAEMONSET_NAME: Final = f"{DAEMONSET_NAME}-consumer"
ROLE_LABEL: Final = f"{DOMAIN}/daemon-role"
"""Pod label naming the daemon pod's role (`serving` or `consumer`)."""
CONSUMER_OPT_IN_LABEL: Final = f"{DOMAIN}/consumer"
"""With value `true`, a control-plane node runs the consumer daemon."""
CONTROL_PLANE_LABELS: Final = (
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
)
CONTAINER_NAME: Final = "daemon"
HEALTH_PORT: Final = 8081
CDI_DIR: Final = "/var/run/cdi"
STATE_DIR: Final = "/var/lib/thunder-dra"
HASH_ANNOTATION: Final = f"{DOMAIN}/rendered-hash"
TOKEN_ENV: Final = "THUNDER_API_TOKEN"
TOKEN_KEY: Final = "THUNDER_API_TOKEN"
METRICS_PATH: Final = "/metrics"
# Prometheus's usual pod annotations: a `kubernetes_sd_configs` job of role `pod` that
# keeps annotated pods scrapes every daemon. The daemon serves /metrics on its health
# port. The ThunderCluster's `daemon.podAnnotations` win (`prometheus.io/scrape: "false"`).
SCRAPE_ANNOTATIONS: Final = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(HEALTH_PORT),
    "prometheus.io/path": METRICS_PATH,
}


class Role(StrEnum):
    """A daemon DaemonSet's node role."""

    SERVING = "serving"
    CONSUMER = "consumer"


ROLES: Final = (Role.CONSUMER, Role.SERVING)
"""Every role, in the order the operator reconciles them (consumer first)."""


def daemonset_name(role: Role) -> str:
    return DAEMONSET_NAME if role is Role.SERVING else CONSUMER_DAEMONSET_NAME


def selector_labels() -> dict[str, str]:
    """The daemon pods' component labels (both roles carry them: monitoring selects them)."""
    return naming.component_labels(naming.COMPONENT_DAEMON)


def role_selector(role: Role) -> dict[str, str]:
    """A role's DaemonSet selector. The serving one keeps the selector of earlier releases
    (a selector cannot change in place); the consumer one adds the role label."""
    if role is Role.SERVING:
        return selector_labels()
    return {**selector_labels(), ROLE_LABEL: role.value}


def node_affinity(role: Role) -> dict[str, Any]:
    """Disjoint node sets: serving nodes (`thundercompute.com/node=true`) and the others,
    control-plane nodes left out of the latter unless they opt in."""
    serving = {"key": naming.NODE_LABEL_SERVING, "operator": "In", "values": ["true"]}
    if role is Role.SERVING:
        terms: list[dict[str, Any]] = [{"matchExpressions": [serving]}]
    else:
        other = {**serving, "operator": "NotIn"}
        not_control_plane = [
            {"key": key, "operator": "DoesNotExist"} for key in CONTROL_PLANE_LABELS
        ]
        opted_in = {"key": CONSUMER_OPT_IN_LABEL, "operator": "In", "values": ["true"]}
        terms = [
            {"matchExpressions": [other, *not_control_plane]},
            {"matchExpressions": [other, opted_in]},
        ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def image_reference(spec: ThunderClusterSpec) -> str:
    image = spec.daemon.image
    if image.digest:
        return f"{image.repository}@{image.digest}"
    return f"{image.repository}:{image.tag or __version__}"


def daemon_command(spec: ThunderClusterSpec, role: Role = Role.SERVING) -> list[str]:
    """The agreed daemon command line.

    A consumer daemon gets `--node-role consumer` (it never enrolls the node, whatever its
    labels say) and the local host runner: it has no access to the host's namespaces.
    Both roles get `--enroll-before-binding` while `spec.operator.enrollBeforeBinding` is
    on, and only then, so a daemon image of an earlier release, which lacks the flag,
    keeps starting while the setting stays off.

    No duration flag: the daemon's defaults hold. While an upgrade rolls out, this
    operator may run a daemon image of an earlier release, whose durations are bare
    seconds only, while this release's daemon takes Go durations ("30s") and warns about
    bare seconds; a command line without them reads the same in both."""
    daemon = spec.daemon
    # Pinned artifact digests, only when set (the daemon refuses anything else).
    pins = []
    if spec.thunder.installer_sha256:
        pins += ["--installer-sha256", spec.thunder.installer_sha256]
    if spec.thunder.library_sha256:
        pins += ["--library-sha256", spec.thunder.library_sha256]
    consumer = role is Role.CONSUMER
    return [
        "python",
        "-m",
        "thunder_dra.plugin",
        "--driver-name",
        spec.operator.driver_name,
        "--api-url",
        spec.thunder.api_url,
        "--artifact-base-url",
        spec.thunder.artifact_base_url,
        "--telemetry-url",
        spec.thunder.telemetry_url,
        "--plugin-dir-root",
        spec.kubelet.plugin_dir_root,
        "--registry-dir",
        spec.kubelet.registry_dir,
        "--cdi-dir",
        CDI_DIR,
        "--state-dir",
        STATE_DIR,
        "--min-driver-version",
        str(spec.nvidia.min_driver_version),
        "--thunderd-port-range",
        str(daemon.thunderd_port_range),
        "--advertised-ip-label",
        daemon.advertised_ip_label,
        "--health-port",
        str(HEALTH_PORT),
        "--host-runner",
        "local" if consumer else "nsenter",
        *(["--node-role", "consumer"] if consumer else []),
        "--log-level",
        daemon.log_level,
        *(["--enroll-before-binding"] if spec.operator.enroll_before_binding.enabled else []),
        *pins,
    ]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _host_volume(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "health"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


CONSUMER_SECURITY_CONTEXT: Final[Mapping[str, Any]] = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    # Root without capabilities: the kubelet's plugin and registration directories and
    # the CDI directory are root's (0750/0755), so only their owner may create the
    # sockets and files there; uid 0 writes them as their owner, with no capability.
    "runAsUser": 0,
    "runAsNonRoot": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _role_mounts(spec: ThunderClusterSpec, role: Role) -> list[tuple[str, str]]:
    """(volume name, host path) of each host directory a role mounts at the same path."""
    plugins = spec.kubelet.plugin_dir_root
    if role is Role.CONSUMER:
        # Only the driver's own plugin directory, where its DRA socket goes.
        plugins = f"{plugins.rstrip('/')}/{spec.operator.driver_name}"
    return [
        ("plugins", plugins),
        ("plugins-registry", spec.kubelet.registry_dir),
        ("cdi", CDI_DIR),
        ("state", STATE_DIR),
    ]


def render_all(
    spec: ThunderClusterSpec,
    namespace: str,
    owner: ThunderClusterRef,
    service_account: str,
    *,
    tracing: DaemonTracing = NO_TRACING,
) -> list[dict[str, Any]]:
    """Both roles' DaemonSets, in the order they are reconciled (`ROLES`)."""
    return [
        render(spec, namespace, owner, service_account, tracing=tracing, role=role)
        for role in ROLES
    ]


def render(
    spec: ThunderClusterSpec,
    namespace: str,
    owner: ThunderClusterRef,
    service_account: str,
    *,
    tracing: DaemonTracing = NO_TRACING,
    role: Role = Role.SERVING,
) -> dict[str, Any]:
    """The DaemonSet of `role` for `spec`, carrying the hash of its own rendering.

    `tracing` is the operator's own OpenTelemetry configuration, handed on to the pods
    (`workload.tracing`); a variable the spec's `daemon.extraEnv` sets wins over it.
    """
    daemon = spec.daemon
    serving = role is Role.SERVING
    mounts = _role_mounts(spec, role)
    extra_names = frozenset(var.name for var in daemon.extra_env)
    env = [
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("POD_UID", "metadata.uid"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {
            "name": TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": spec.thunder.secret_name, "key": TOKEN_KEY}},
        },
        *tracing.env(overridden=extra_names),
        *({"name": var.name, "value": var.value} for var in daemon.extra_env),
    ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image_reference(spec),
        "imagePullPolicy": daemon.image.pull_policy,
        "command": daemon_command(spec, role),
        "env": env,
        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 3),
        "securityContext": (
            {"privileged": True} if serving else copy.deepcopy(dict(CONSUMER_SECURITY_CONTEXT))
        ),
        "resources": daemon.resources.to_json_dict(),
        "volumeMounts": [{"name": name, "mountPath": path} for name, path in mounts],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        **({"hostPID": True} if serving else {}),
        "nodeSelector": dict(daemon.node_selector),
        "affinity": node_affinity(role),
        "tolerations": [t.to_json_dict() for t in daemon.tolerations],
        "containers": [container],
        "volumes": [_host_volume(name, path) for name, path in mounts],
    }
    if daemon.priority_class_name:
        pod_spec["priorityClassName"] = daemon.priority_class_name
    if daemon.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.to_json_dict() for ref in daemon.image_pull_secrets]
    pod_labels = {**selector_labels(), ROLE_LABEL: role.value}
    labels = {**pod_labels, naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
    template_metadata: dict[str, Any] = {
        "labels": pod_labels,
        "annotations": {**SCRAPE_ANNOTATIONS, **daemon.pod_annotations},
    }
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemonset_name(role),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": role_selector(role)},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {"metadata": template_metadata, "spec": pod_spec},
        },
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    body["metadata"]["annotations"] = {HASH_ANNOTATION: digest}
    return body


def _quantity(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None


def contains(stored: Any, rendered: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether `stored` holds every field of `rendered` with the same value.

    Mappings may hold more keys (server defaults); lists must have the same length and
    match item by item; resource quantities compare by value ("0.5" == "500m").
    """
    if isinstance(rendered, Mapping):
        return isinstance(stored, Mapping) and all(
            key in stored and contains(stored[key], value, (*path, str(key)))
            for key, value in rendered.items()
        )
    if isinstance(rendered, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(rendered)
            and all(contains(s, r, path) for s, r in zip(stored, rendered, strict=True))
        )
    if stored == rendered:
        return True
    if "resources" in path:
        left, right = _quantity(stored), _quantity(rendered)
        return left is not None and left == right
    return False


def up_to_date(stored: Mapping[str, Any], rendered: Mapping[str, Any]) -> bool:
    """No write is needed: the stored object has this rendering's hash and every field."""
    stored_hash = bodies.annotation(stored, HASH_ANNOTATION)
    want_hash = rendered["metadata"]["annotations"][HASH_ANNOTATION]
    if stored_hash != want_hash:
        return False
    meta = rendered["metadata"]
    owned_meta = {"labels": meta["labels"], "ownerReferences": meta["ownerReferences"]}
    return contains(bodies.metadata(stored), owned_meta) and contains(
        bodies.spec(stored), rendered["spec"]
    )


def needs_recreate(stored: Mapping[str, Any], rendered: Mapping[str, Any]) -> bool:
    """The selector is immutable: a DaemonSet selecting other labels is replaced."""
    selector: Any = bodies.spec(stored).get("selector")
    return bool(selector != rendered["spec"]["selector"])


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    message: str


def readiness(stored: Mapping[str, Any] | None, name: str = DAEMONSET_NAME) -> Readiness:
    """DaemonReady from one DaemonSet's status."""
    if stored is None:
        return Readiness(False, "DaemonSetMissing", f"DaemonSet {name} does not exist")
    status = bodies.status(stored)
    if int(status.get("observedGeneration") or 0) < (bodies.generation(stored) or 0):
        return Readiness(
            False, "RolloutPending", "the DaemonSet controller has not seen the change"
        )
    desired = int(status.get("desiredNumberScheduled") or 0)
    ready = int(status.get("numberReady") or 0)
    updated = int(status.get("updatedNumberScheduled") or 0)
    if desired == 0:
        return Readiness(False, "NoNodes", "no node matches the daemon's nodeSelector")
    if updated < desired:
        return Readiness(
            False, "RollingUpdate", f"{updated} of {desired} daemon pods run the current spec"
        )
    if ready < desired:
        return Readiness(False, "PodsNotReady", f"{ready} of {desired} daemon pods are ready")
    return Readiness(True, "AllPodsReady", f"{ready} of {desired} daemon pods are ready")


def rolled_out(stored: Mapping[str, Any] | None) -> bool:
    """The DaemonSet controller saw the current spec and every pod it wants runs it, ready
    (none wanted counts: a cluster may have no node of that role)."""
    state = readiness(stored)
    return state.ready or state.reason == "NoNodes"


def readiness_of_roles(stored: Mapping[Role, Mapping[str, Any] | None]) -> Readiness:
    """DaemonReady from both roles' DaemonSets: ready when each is rolled out and some
    node runs a daemon; otherwise the first role's reason that is not, with its name."""
    states = {role: readiness(body, daemonset_name(role)) for role, body in stored.items()}
    if all(state.reason == "NoNodes" for state in states.values()):
        return Readiness(False, "NoNodes", "no node matches the daemon's nodeSelector")
    for role, state in states.items():
        if not state.ready and state.reason != "NoNodes":
            return Readiness(False, state.reason, f"{daemonset_name(role)}: {state.message}")
    message = "; ".join(
        f"{daemonset_name(role)}: {state.message}" for role, state in states.items() if state.ready
    )
    return Readiness(True, "AllPodsReady", message)


def predates_roles(stored: Mapping[str, Any]) -> bool:
    """A DaemonSet of a release with one DaemonSet on every node: its pods carry no role."""
    template: Any = bodies.spec(stored).get("template") or {}
    labels: Any = (template.get("metadata") or {}).get("labels") or {}
    return ROLE_LABEL not in labels


async def reconcile_daemonsets(
    kube: KubeClient, rendered: Sequence[Mapping[str, Any]]
) -> list[tuple[Role, dict[str, Any] | None, str]]:
    """Bring both roles' DaemonSets to `rendered` (from `render_all`), consumer first.

    The serving DaemonSet of an earlier release runs on every node. It is narrowed to
    serving nodes only once the consumer DaemonSet is rolled out, so a consumer node keeps
    its old daemon until the new one is ready (`deferred`); the reconcile after that does
    it. Returns each role, its stored DaemonSet (None while a deferred one is missing) and
    what was done (`unchanged`, `created`, `updated`, `recreated` or `deferred`)."""
    done: list[tuple[Role, dict[str, Any] | None, str]] = []
    consumer_ready = True
    for body in rendered:
        role = Role(body["spec"]["template"]["metadata"]["labels"][ROLE_LABEL])
        if role is Role.SERVING and not consumer_ready:
            path = DAEMON_SETS.item(body["metadata"]["name"], body["metadata"]["namespace"])
            stored = await kube.get_optional(path)
            if stored is not None and predates_roles(stored):
                done.append((role, stored, "deferred"))
                continue
        stored, action = await reconcile_daemonset(kube, body)
        if role is Role.CONSUMER:
            consumer_ready = action == "unchanged" and rolled_out(stored)
        done.append((role, stored, action))
    return done


async def reconcile_daemonset(
    kube: KubeClient, rendered: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """Bring the stored DaemonSet to `rendered`; returns it and what was done
    (`unchanged`, `created`, `updated` or `recreated`)."""
    namespace = rendered["metadata"]["namespace"]
    path = DAEMON_SETS.item(rendered["metadata"]["name"], namespace)
    stored = await kube.get_optional(path)
    if stored is None:
        created = await kube.create(DAEMON_SETS.collection(namespace), rendered)
        return created, "created"
    if up_to_date(stored, rendered):
        return stored, "unchanged"
    if needs_recreate(stored, rendered):
        # Only a DaemonSet made by another version can select other labels. Its pods would
        # not be adopted by the new selector, so they go with it rather than linger.
        with contextlib.suppress(NotFound):
            await kube.delete(
                path,
                resource_version=bodies.resource_version(stored),
                propagation="Background",
            )
        created = await kube.create(DAEMON_SETS.collection(namespace), rendered)
        return created, "recreated"
    updated = await kube.replace(path, update_body(stored, rendered))
    return updated, "updated"
