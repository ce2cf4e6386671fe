"""The node daemon DaemonSet, rendered from the ThunderCluster spec.

Described in docs/operator.md#the-daemon-daemonset.

One DaemonSet, `thunder-dra-daemon` in the operator's namespace, owned by the
ThunderCluster (a namespaced object may have a cluster-scoped owner), so deleting the
ThunderCluster removes it. Its pods run `python -m thunder_dra.plugin` with the agreed
command line, host PID and privileged (the daemon enters the host's namespaces with
nsenter to run thunderd's installer), and mount the kubelet plugin and registration
directories, the CDI spec directory and the daemon's state directory from the host.

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
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
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


def selector_labels() -> dict[str, str]:
    return naming.component_labels(naming.COMPONENT_DAEMON)


def image_reference(spec: ThunderClusterSpec) -> str:
    image = spec.daemon.image
    if image.digest:
        return f"{image.repository}@{image.digest}"
    return f"{image.repository}:{image.tag or __version__}"


def daemon_command(spec: ThunderClusterSpec) -> list[str]:
    """The agreed daemon command line.

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
        "nsenter",
        "--log-level",
        daemon.log_level,
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


def render(
    spec: ThunderClusterSpec,
    namespace: str,
    owner: ThunderClusterRef,
    service_account: str,
    *,
    tracing: DaemonTracing = NO_TRACING,
) -> dict[str, Any]:
    """The DaemonSet for `spec`, carrying the hash of its own rendering.

    `tracing` is the operator's own OpenTelemetry configuration, handed on to the pods
    (`workload.tracing`); a variable the spec's `daemon.extraEnv` sets wins over it.
    """
    daemon = spec.daemon
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
        "command": daemon_command(spec),
        "env": env,
        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 3),
        "securityContext": {"privileged": True},
        "resources": daemon.resources.to_json_dict(),
        "volumeMounts": [
            {"name": "plugins", "mountPath": spec.kubelet.plugin_dir_root},
            {"name": "plugins-registry", "mountPath": spec.kubelet.registry_dir},
            {"name": "cdi", "mountPath": CDI_DIR},
            {"name": "state", "mountPath": STATE_DIR},
        ],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "hostPID": True,
        "nodeSelector": dict(daemon.node_selector),
        "tolerations": [t.to_json_dict() for t in daemon.tolerations],
        "containers": [container],
        "volumes": [
            _host_volume("plugins", spec.kubelet.plugin_dir_root),
            _host_volume("plugins-registry", spec.kubelet.registry_dir),
            _host_volume("cdi", CDI_DIR),
            _host_volume("state", STATE_DIR),
        ],
    }
    if daemon.priority_class_name:
        pod_spec["priorityClassName"] = daemon.priority_class_name
    if daemon.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.to_json_dict() for ref in daemon.image_pull_secrets]
    labels = {**selector_labels(), naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
    template_metadata: dict[str, Any] = {
        "labels": selector_labels(),
        "annotations": {**SCRAPE_ANNOTATIONS, **daemon.pod_annotations},
    }
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": DAEMONSET_NAME,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": selector_labels()},
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


def readiness(stored: Mapping[str, Any] | None) -> Readiness:
    """DaemonReady from the DaemonSet's status."""
    if stored is None:
        return Readiness(False, "DaemonSetMissing", f"DaemonSet {DAEMONSET_NAME} does not exist")
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


async def reconcile_daemonset(
    kube: KubeClient, rendered: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """Bring the stored DaemonSet to `rendered`; returns it and what was done
    (`unchanged`, `created`, `updated` or `recreated`)."""
    namespace = rendered["metadata"]["namespace"]
    path = DAEMON_SETS.item(DAEMONSET_NAME, namespace)
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
