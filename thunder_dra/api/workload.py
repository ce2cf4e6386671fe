"""Kubernetes pod-spec shapes the ThunderCluster uses to describe the daemon's pods.

Typed subsets of the core API (only what a node daemon needs), so the CRD schema
stays structural without `x-kubernetes-preserve-unknown-fields`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from thunder_dra.api.base import ApiModel, DnsSubdomain, LabelValue, QualifiedName, Quantity

DEFAULT_IMAGE_REPOSITORY = "ghcr.io/thunder-compute/thunder-device-plugin"
TOLERATION_SECONDS_MAX = 2**31 - 1
"""About 68 years: longer is the same as forever (leave the field empty)."""
RESERVED_ENV_PREFIXES: Final = ("THUNDER_", "PYTHON", "LD_")
"""Names the daemon reads for itself (its token, any THUNDER_* setting, test hooks) or
that change the code the privileged daemon runs (the interpreter's and the loader's)."""
RESERVED_ENV_NAMES: Final = ("NODE_NAME", "POD_UID", "POD_NAMESPACE", "KUBECONFIG")
"""The daemon's identity and API access, set by the DaemonSet itself."""
_RESERVED_ENV_RULE: Final = " && ".join(
    [f"!self.startsWith('{prefix}')" for prefix in RESERVED_ENV_PREFIXES]
    + ["!(self in [" + ", ".join(f"'{name}'" for name in RESERVED_ENV_NAMES) + "])"]
)
_RESERVED_ENV_MESSAGE: Final = (
    "is reserved: names starting with "
    + ", ".join(RESERVED_ENV_PREFIXES)
    + " and "
    + ", ".join(RESERVED_ENV_NAMES)
    + " are set by the driver itself (the API token comes from the Secret named by "
    "spec.thunder.secretName)"
)


def reserved_env_name(name: str) -> bool:
    """Whether `name` may not be set through `spec.daemon.extraEnv`."""
    return name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES


RESOURCE_NAMES_MAX = 16
"""Most resource names in requests or limits (cpu, memory, ephemeral-storage, ...)."""


class ImageSpec(ApiModel):
    """The container image the daemon runs."""

    repository: Annotated[
        str, Field(min_length=1, max_length=255, pattern=r"^[a-z0-9]([-a-z0-9._/:]*[a-z0-9])?$")
    ] = DEFAULT_IMAGE_REPOSITORY
    """Image repository, without tag or digest."""
    tag: Annotated[str, Field(max_length=128, pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)?$")] = ""
    """Image tag; empty means the operator's own version, so both always match."""
    digest: Annotated[str, Field(max_length=135, pattern=r"^(sha256:[a-f0-9]{64})?$")] = ""
    """Optional sha256 digest; when set it pins the image and the tag is informative only."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""


class LocalObjectReference(ApiModel):
    """A reference to an object in the operator's namespace, by name."""

    name: DnsSubdomain
    """Name of the object (for imagePullSecrets, a kubernetes.io/dockerconfigjson Secret)."""


class Toleration(ApiModel):
    """A pod toleration, as in the core API."""

    key: QualifiedName | None = None
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists matches any value; Equal matches `value`."""
    value: LabelValue | None = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: Annotated[int, Field(ge=0, le=TOLERATION_SECONDS_MAX)] | None = None
    """For NoExecute: how long the pod stays bound after the taint appears; empty is forever."""


class ResourceRequirements(ApiModel):
    """CPU and memory requests and limits of the daemon container."""

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=RESOURCE_NAMES_MAX)
    """Minimum resources the scheduler reserves, e.g. cpu: 50m, memory: 64Mi."""
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=RESOURCE_NAMES_MAX)
    """Maximum resources the container may use."""


class EnvVar(ApiModel):
    """A plain environment variable added to the daemon container."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=256,
            pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": _RESERVED_ENV_RULE, "message": _RESERVED_ENV_MESSAGE}
                ]
            },
        ),
    ]
    """Variable name. Reserved: names starting with THUNDER_, PYTHON or LD_, and NODE_NAME,
    POD_UID, POD_NAMESPACE, KUBECONFIG (the driver sets them; the API token comes from the
    Secret only)."""
    value: Annotated[str, Field(max_length=32768)] = ""
    """Variable value."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if reserved_env_name(name):
            raise PydanticCustomError(
                "reserved_env", '"{name}" ' + _RESERVED_ENV_MESSAGE, {"name": name}
            )
        return name


class PortRange(ApiModel):
    """An inclusive range of host ports; the defaults are thunderd's own."""

    start: Annotated[int, Field(ge=1024, le=65535)] = 32000
    """First port of the range."""
    end: Annotated[int, Field(ge=1024, le=65535)] = 32199
    """Last port of the range (inclusive)."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        # thunderd binds a data and a control port per attached client.
        if self.end - self.start + 1 < 2:
            raise PydanticCustomError(
                "port_range",
                "must hold at least 2 ports with end >= start, got {start}-{end}",
                {"start": self.start, "end": self.end},
            )
        return self

    def __str__(self) -> str:
        """The `start-end` form thunderd's installer takes."""
        return f"{self.start}-{self.end}"
