"""Resource models, the single source of truth for the CRDs in crds/ and docs/configuration.md."""

from thunder_dra.api.base import ApiModel, Condition, ObjectMeta, find_condition, set_condition
from thunder_dra.api.client import (
    ClaimReference,
    Client,
    ClientPhase,
    ClientSpec,
    ClientStatus,
    ConsumerKind,
    ZoneReference,
)
from thunder_dra.api.constants import API_VERSION, CLIENT_FINALIZER, GROUP, VERSION
from thunder_dra.api.duration import Duration, format_duration, parse_duration
from thunder_dra.api.thundercluster import (
    ConditionType,
    DaemonSpec,
    KubeletSpec,
    NvidiaSpec,
    OperatorSpec,
    PoolStatus,
    ThunderCluster,
    ThunderClusterSpec,
    ThunderClusterStatus,
    ThunderSpec,
)

__all__ = [
    "API_VERSION",
    "CLIENT_FINALIZER",
    "GROUP",
    "VERSION",
    "ApiModel",
    "ClaimReference",
    "Client",
    "ClientPhase",
    "ClientSpec",
    "ClientStatus",
    "Condition",
    "ConditionType",
    "ConsumerKind",
    "DaemonSpec",
    "Duration",
    "KubeletSpec",
    "NvidiaSpec",
    "ObjectMeta",
    "OperatorSpec",
    "PoolStatus",
    "ThunderCluster",
    "ThunderClusterSpec",
    "ThunderClusterStatus",
    "ThunderSpec",
    "ZoneReference",
    "find_condition",
    "format_duration",
    "parse_duration",
    "set_condition",
]
