"""The ThunderCluster resource: every runtime setting of the driver, and its status.

Section and field names follow the seed's Helm values (`thunder.apiURL`,
`operator.reconcileInterval`, `nvidia.minDriverVersion`, ...), so `spec.<value>`
here is `<value>` in the chart.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from thunder_dra.api import syntax
from thunder_dra.api.base import (
    AbsolutePath,
    ApiModel,
    Condition,
    Count,
    DnsLabel,
    DnsSubdomain,
    DriverName,
    LabelValue,
    ObjectMeta,
    QualifiedName,
    ThunderURL,
)
from thunder_dra.api.constants import API_VERSION, DEFAULT_DRIVER_NAME, DOMAIN
from thunder_dra.api.duration import Duration, DurationRange
from thunder_dra.api.workload import (
    EnvVar,
    ImageSpec,
    LocalObjectReference,
    PortRange,
    ResourceRequirements,
    Toleration,
)

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", min_length=64, max_length=64)]
"""A SHA-256 digest as 64 lower-case hexadecimal digits."""

DEVICE_CLASS_PREFIX_MAX = 190
"""Leaves room for a 63-character model label within a 253-character DeviceClass name."""
EXTENDED_RESOURCE_NAME_PREFIX_MAX = 40
"""Longest name part (after the '/') of the extended-resource prefix, so models fit in 63."""
MAX_LIST_ITEMS = 64
"""Most entries of a list or map setting (tolerations, extraEnv, nodeSelector, ...)."""
MAX_POOLS = 100000
"""Upper bound of `spec.operator.limits.maxPools`, and so of the pools in status."""


class ThunderSpec(ApiModel):
    """Where Thunder is and which Secret holds the API token."""

    secret_name: DnsSubdomain = "thunder-api"
    """Existing Secret holding THUNDER_API_TOKEN. The token is never a field of this resource."""
    secret_namespace: DnsLabel = "thunder-system"
    """Namespace of that Secret."""
    api_url: ThunderURL = Field(default="https://registry.thundercompute.com", alias="apiURL")
    """Thunder API endpoint. https only; http is accepted for loopback addresses."""
    artifact_base_url: ThunderURL = Field(
        default="https://get.thundercompute.com", alias="artifactBaseURL"
    )
    """Where the Thunder installer and client library are downloaded from."""
    telemetry_url: ThunderURL = Field(
        default="https://telemetry.thundercompute.com:2096", alias="telemetryURL"
    )
    """Telemetry collector written into each container's client config."""
    installer_sha256: Sha256 | None = Field(default=None, alias="installerSHA256")
    """Optional pinned SHA-256 (64 lower-case hex digits) of the Thunder installer script.
    When set, a downloaded installer with another digest is refused and nothing runs."""
    library_sha256: Sha256 | None = Field(default=None, alias="librarySHA256")
    """Optional pinned SHA-256 (64 lower-case hex digits) of libthunder.so. When set, it
    must also match the digest the installer pins; a mismatch stages nothing."""


class InventoryProtectionSpec(ApiModel):
    """How the operator treats a Thunder answer that would withdraw published devices, and
    devices Thunder stops backing."""

    max_shrink_percent: Annotated[int, Field(ge=0, le=100)] = 50
    """A pool that would lose more than this percentage of its published devices in one
    pass is suspect, as are an empty zone list and a zone or pool that vanishes."""
    confirm_passes: Annotated[int, Field(ge=1, le=1000)] = 3
    """Consecutive passes a suspect answer must repeat before published devices are
    withdrawn. Devices allocated to a ResourceClaim are never withdrawn."""
    no_execute_after: Annotated[Duration, DurationRange("30s", "168h")] | None = None
    """Off when unset (the default). When set, a device whose
    thundercompute.com/unbacked NoSchedule taint is at least this old (by its timeAdded)
    also gets that taint with effect NoExecute, so Kubernetes evicts the pods whose claims
    hold it (30s to 168h)."""


class InventoryLimitsSpec(ApiModel):
    """Caps on the numbers Thunder reports; a larger answer is clamped with a Warning."""

    max_gpus_per_host: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=64, alias="maxGPUsPerHost"
    )
    """Most GPUs one Thunder host may contribute."""
    max_devices_per_pool: Annotated[int, Field(ge=1, le=65536)] = 4096
    """Most devices published in one pool (a zone and a GPU model)."""
    max_pools: Annotated[int, Field(ge=1, le=MAX_POOLS)] = 4096
    """Most pools published in total."""
    max_devices: Annotated[int, Field(ge=1, le=1048576)] = 131072
    """Most devices published across all pools."""


class EnrollBeforeBindingSpec(ApiModel):
    """Thunder enrollment made while the scheduler waits to bind a pod, before the kubelet
    prepares its claim (docs/operator.md#enrollment-before-binding)."""

    enabled: bool = False
    """Off by default. When on, every published device carries bindsToNode and the
    binding conditions thundercompute.com/Enrolled and thundercompute.com/EnrollmentFailed:
    the scheduler binds a pod only once the daemon on the chosen node has enrolled its
    claim, which can add up to the scheduler's 5 s poll to each pod's start."""
    cooldown: Annotated[Duration, DurationRange("30s", "1h")] = Duration("2m")
    """How long a device whose enrollment Thunder refused stays tainted
    thundercompute.com/enrollment-refused:NoSchedule, so the scheduler's retry picks
    another device (30s to 1h)."""


class OperatorSpec(ApiModel):
    """How inventory is published and how often."""

    driver_name: DriverName = DEFAULT_DRIVER_NAME
    """DRA driver name on ResourceSlices, DeviceClass selectors and the kubelet plugin.
    Immutable once slices or classes are published."""
    extended_resource_prefix: Annotated[
        # The pattern goes to the CRD only; the validator below explains a mismatch.
        str,
        Field(max_length=300, json_schema_extra={"pattern": r"^([a-z0-9.-]+/[-A-Za-z0-9_.]*)?$"}),
    ] = f"{DOMAIN}/gpu-"
    """Prefix of per-model extended resources (prefix + model label, e.g.
    thundercompute.com/gpu-a6000). Empty publishes classes without extendedResourceName,
    for clusters below 1.36. Immutable once classes are published."""
    device_class_prefix: Annotated[
        str,
        Field(max_length=DEVICE_CLASS_PREFIX_MAX, json_schema_extra={"pattern": r"^[a-z0-9.-]*$"}),
    ] = "thunder-gpu-"
    """Prefix of per-model DeviceClass names (prefix + model label, e.g. thunder-gpu-a6000).
    Immutable once classes are published."""
    reconcile_interval: Annotated[Duration, DurationRange("5s", "24h")] = Duration("60s")
    """How often Thunder inventory and oversubscription targets are read (5s to 24h)."""
    orphan_grace_period: Annotated[Duration, DurationRange("30s", "168h")] = Duration("5m")
    """How long a Client may outlive its ResourceClaim before its enrollment is revoked
    (30s to 168h)."""
    inventory_concurrency: Annotated[int, Field(ge=1, le=64)] = 8
    """Most Thunder API reads in flight during an inventory pass."""
    inventory_protection: InventoryProtectionSpec = Field(default_factory=InventoryProtectionSpec)
    """When a shrinking inventory is trusted; when unbacked devices evict their pods."""
    limits: InventoryLimitsSpec = Field(default_factory=InventoryLimitsSpec)
    """Bounds on vendor-reported numbers."""
    enroll_before_binding: EnrollBeforeBindingSpec = Field(default_factory=EnrollBeforeBindingSpec)
    """Whether a claim's Thunder enrollment is made before its pod is bound (off by default)."""

    @field_validator("extended_resource_prefix")
    @classmethod
    def _extended_resource_prefix(cls, value: str) -> str:
        if value == "":
            return value
        # Check the prefix with the shortest model label appended: the name it will produce.
        problem = syntax.extended_resource_name_problem(value + "a")
        _, _, name_prefix = value.rpartition("/")
        if problem is None and len(name_prefix) > EXTENDED_RESOURCE_NAME_PREFIX_MAX:
            problem = (
                "must leave room for the model: at most "
                f"{EXTENDED_RESOURCE_NAME_PREFIX_MAX} characters after the '/'"
            )
        if problem is not None:
            raise PydanticCustomError(
                "extended_resource_prefix",
                'must be empty or an extended-resource prefix such as "example.com/gpu-": '
                '{problem}, got "{value}"',
                {"problem": problem, "value": value},
            )
        return value

    @field_validator("device_class_prefix")
    @classmethod
    def _device_class_prefix(cls, value: str) -> str:
        if not syntax.is_dns_subdomain(value + "a"):
            raise PydanticCustomError(
                "device_class_prefix",
                'must start a DNS subdomain (lower-case letters, digits, "-" and "."), '
                'got "{value}"',
                {"value": value},
            )
        return value


class NvidiaSpec(ApiModel):
    """Requirements on GPU-serving nodes."""

    min_driver_version: Annotated[int, Field(ge=300, le=9999)] = 610
    """Lowest NVIDIA driver major version the daemon accepts on a serving node."""


class KubeletSpec(ApiModel):
    """Where the kubelet keeps plugin sockets."""

    plugin_dir_root: AbsolutePath = "/var/lib/kubelet/plugins"
    """Kubelet plugin directory; change it on distributions that move the kubelet root.
    The registration directory is its sibling plugins_registry."""

    @property
    def registry_dir(self) -> str:
        """The kubelet's plugin registration directory, next to the plugin directory."""
        parent = self.plugin_dir_root.rstrip("/").rpartition("/")[0] or "/"
        return parent.rstrip("/") + "/plugins_registry"


def _default_tolerations() -> list[Toleration]:
    # A node without the plugin cannot prepare claims, and slices select nodes by the
    # daemon's nodeSelector only, so by default the daemon runs on every tainted node too.
    return [Toleration(operator="Exists")]


def _default_resources() -> ResourceRequirements:
    return ResourceRequirements(
        requests={"cpu": "50m", "memory": "64Mi"}, limits={"memory": "512Mi"}
    )


class DaemonSpec(ApiModel):
    """The node daemon DaemonSet: DRA kubelet plugin and, on serving nodes, Thunder enrollment."""

    image: ImageSpec = Field(default_factory=ImageSpec)
    """Daemon container image."""
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Secrets in the operator's namespace used to pull the image."""
    node_selector: dict[str, LabelValue] = Field(
        default_factory=lambda: {"kubernetes.io/os": "linux"}, max_length=MAX_LIST_ITEMS
    )
    """Nodes the daemon runs on. ResourceSlices select the same labels, so pods are only
    scheduled where a kubelet plugin can prepare their claims."""
    tolerations: list[Toleration] = Field(
        default_factory=_default_tolerations,
        max_length=MAX_LIST_ITEMS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Taints the daemon tolerates. The default tolerates all, so every selected node gets a
    plugin; narrowing it can publish devices for nodes that have none."""
    resources: ResourceRequirements = Field(default_factory=_default_resources)
    """Daemon container resources."""
    priority_class_name: Annotated[str, Field(max_length=253)] = "system-node-critical"
    """PriorityClass of the daemon pods; empty for none."""
    thunderd_port_range: PortRange = Field(default_factory=PortRange)
    """Host ports thunderd binds on serving nodes (a data and a control port per client)."""
    advertised_ip_label: QualifiedName = Field(
        default=f"{DOMAIN}/advertised-ip", alias="advertisedIPLabel"
    )
    """Node label whose value overrides the address Thunder clients use to reach the node."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Daemon log level."""
    extra_env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Extra environment variables for the daemon container (e.g. HTTPS_PROXY)."""
    pod_annotations: dict[str, Annotated[str, Field(max_length=65536)]] = Field(
        default_factory=dict, max_length=MAX_LIST_ITEMS
    )
    """Annotations added to the daemon pods."""

    @field_validator("node_selector", "pod_annotations")
    @classmethod
    def _keys_are_qualified(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not syntax.is_qualified_name(key):
                raise PydanticCustomError(
                    "label_key",
                    'keys must be label keys such as example.com/name, got "{key}"',
                    {"key": key},
                )
        return value


class ThunderClusterSpec(ApiModel):
    """Settings of the Thunder DRA driver for this cluster; every field has a default."""

    thunder: ThunderSpec = Field(default_factory=ThunderSpec)
    """Thunder API endpoints and credentials."""
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    """Inventory publishing."""
    nvidia: NvidiaSpec = Field(default_factory=NvidiaSpec)
    """GPU driver requirements."""
    kubelet: KubeletSpec = Field(default_factory=KubeletSpec)
    """Kubelet paths."""
    daemon: DaemonSpec = Field(default_factory=DaemonSpec)
    """The node daemon."""


class ConditionType(StrEnum):
    """Condition types the operator maintains on the ThunderCluster."""

    READY = "Ready"
    INVENTORY_SYNCED = "InventorySynced"
    THUNDER_REACHABLE = "ThunderReachable"
    DAEMON_READY = "DaemonReady"
    INVENTORY_SUSPECT = "InventorySuspect"
    """True while a shrinking Thunder answer is held back until it repeats."""
    SPEC_VALID = "SpecValid"
    """False while the spec is invalid; the operator keeps serving the last valid one."""


class PoolStatus(ApiModel):
    """Figures of one published pool (a zone and a GPU model)."""

    zone: Annotated[str, Field(max_length=256)]
    """Zone display name, as Thunder spells it."""
    model: Annotated[str, Field(max_length=256)]
    """GPU model, as Thunder spells it."""
    pool: Annotated[str, Field(max_length=253)]
    """ResourceSlice pool name, <zone label>/<model label>."""
    physical: Count
    """GPUs on healthy, uncordoned hosts."""
    target: Annotated[str, Field(max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?$")]
    """Oversubscription target applied, e.g. 1.5."""
    published: Count
    """Devices published: max(floor(physical x target), live client GPUs)."""
    live_clients: Count
    """GPUs held by live (not decommissioned) Thunder clients."""


class ThunderClusterStatus(ApiModel):
    """What the operator last observed and published."""

    observed_generation: Count | None = None
    """The metadata.generation of the spec the operator last acted on."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready, InventorySynced, ThunderReachable and DaemonReady."""
    pools: list[PoolStatus] = Field(
        default_factory=list,
        max_length=MAX_POOLS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["pool"]},
    )
    """Per-pool figures of the last successful inventory pass."""
    pool_count: Count = 0
    """Pools published."""
    device_count: Count = 0
    """Devices published across all pools."""
    last_sync_time: datetime | None = None
    """End of the last successful inventory pass."""


class ThunderCluster(ApiModel):
    """A whole ThunderCluster object, as read from the API server."""

    api_version: str = API_VERSION
    kind: Literal["ThunderCluster"] = "ThunderCluster"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ThunderClusterSpec = Field(default_factory=ThunderClusterSpec)
    status: ThunderClusterStatus | None = None
