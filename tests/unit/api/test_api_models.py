"""The resource models: seed defaults, wire names and field rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from thunder_dra.api import (
    CLIENT_FINALIZER,
    Client,
    ClientPhase,
    ClientSpec,
    Condition,
    ConditionType,
    ThunderCluster,
    ThunderClusterSpec,
    find_condition,
    set_condition,
)
from thunder_dra.api.thundercluster import KubeletSpec, OperatorSpec, ThunderSpec
from thunder_dra.api.workload import EnvVar, PortRange, ResourceRequirements
from thunder_dra.kube import naming


def test_defaults_are_the_seeds() -> None:
    spec = ThunderClusterSpec()
    assert spec.thunder.secret_name == "thunder-api"
    assert spec.thunder.secret_namespace == "thunder-system"
    assert spec.thunder.api_url == "https://registry.thundercompute.com"
    assert spec.thunder.artifact_base_url == "https://get.thundercompute.com"
    assert spec.thunder.telemetry_url == "https://telemetry.thundercompute.com:2096"
    assert spec.operator.driver_name == naming.DRIVER_NAME == "thundercompute.com"
    assert spec.operator.extended_resource_prefix == "thundercompute.com/gpu-"
    assert spec.operator.device_class_prefix == "thunder-gpu-"
    assert spec.operator.reconcile_interval.to_timedelta() == timedelta(seconds=60)
    assert spec.operator.orphan_grace_period.to_timedelta() == timedelta(minutes=5)
    assert spec.nvidia.min_driver_version == 610
    assert spec.kubelet.plugin_dir_root == "/var/lib/kubelet/plugins"
    assert str(spec.daemon.thunderd_port_range) == "32000-32199"
    assert spec.daemon.advertised_ip_label == naming.NODE_LABEL_ADVERTISED_IP
    assert CLIENT_FINALIZER == "thundercompute.com/client-cleanup"


def test_wire_names_mirror_the_helm_values() -> None:
    wire = ThunderClusterSpec().to_json_dict()
    assert set(wire["thunder"]) == {
        "secretName",
        "secretNamespace",
        "apiURL",
        "artifactBaseURL",
        "telemetryURL",
    }
    assert {"extendedResourcePrefix", "reconcileInterval", "orphanGracePeriod"} <= set(
        wire["operator"]
    )
    assert wire["nvidia"] == {"minDriverVersion": 610}
    assert wire["kubelet"] == {"pluginDirRoot": "/var/lib/kubelet/plugins"}
    assert "advertisedIPLabel" in wire["daemon"]


def test_a_stored_object_round_trips() -> None:
    wire = ThunderClusterSpec().to_json_dict()
    wire["operator"]["reconcileInterval"] = "1h30m"
    wire["daemon"]["nodeSelector"] = {"thundercompute.com/node": "true"}
    spec = ThunderClusterSpec.model_validate(wire)
    assert spec.to_json_dict() == wire


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    spec = ThunderClusterSpec.model_validate({"operator": {"futureSetting": 1}})
    assert spec == ThunderClusterSpec()


def test_whole_object_parses() -> None:
    obj = ThunderCluster.model_validate(
        {
            "apiVersion": "thundercompute.com/v1alpha1",
            "kind": "ThunderCluster",
            "metadata": {"name": "thunder", "generation": 3, "uid": "u"},
            "spec": {},
        }
    )
    assert obj.metadata.name == "thunder"
    assert obj.metadata.generation == 3
    assert obj.spec == ThunderClusterSpec()


@pytest.mark.parametrize(
    "url",
    [
        "https://registry.thundercompute.com",
        "https://api.thundercompute.com:2096/",
        "http://127.0.0.1:8080",
        "http://127.9.9.9",
        "http://[::1]:9000/base",
        "http://localhost:1234",
    ],
)
def test_accepted_urls(url: str) -> None:
    assert ThunderSpec(api_url=url).api_url == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://registry.thundercompute.com", "must use https"),
        ("http://10.0.0.1", "must use https"),
        ("ftp://example.com", "absolute https:// URL"),
        ("registry.thundercompute.com", "absolute https:// URL"),
        ("https://user:pw@example.com", "credentials"),
        ("https://example.com/?token=x", "query"),
        ("https://example.com:99999", "not a valid URL"),
    ],
)
def test_refused_urls(url: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ThunderSpec(api_url=url)


@pytest.mark.parametrize("prefix", ["", "thundercompute.com/gpu-", "example.com/", "a.b/gpu."])
def test_accepted_extended_resource_prefixes(prefix: str) -> None:
    assert OperatorSpec(extended_resource_prefix=prefix).extended_resource_prefix == prefix


@pytest.mark.parametrize(
    ("prefix", "reason"),
    [
        ("gpu-", "needs a domain prefix"),
        ("kubernetes.io/gpu-", "kubernetes.io"),
        ("requests.example.com/gpu-", "requests."),
        ("Example.com/gpu-", "DNS subdomain|qualified name|extended-resource prefix"),
        ("example.com/" + "g" * 41, "leave room"),
    ],
)
def test_refused_extended_resource_prefixes(prefix: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        OperatorSpec(extended_resource_prefix=prefix)


@pytest.mark.parametrize("prefix", ["-gpu-", "GPU-", "gpu_", "a" * 191])
def test_refused_device_class_prefixes(prefix: str) -> None:
    with pytest.raises(ValidationError):
        OperatorSpec(device_class_prefix=prefix)


def test_driver_name_is_a_short_dns_subdomain() -> None:
    assert OperatorSpec(driver_name="gpu.example.com").driver_name == "gpu.example.com"
    with pytest.raises(ValidationError, match="at most 63"):
        OperatorSpec(driver_name="a" * 60 + ".example.com")


def test_port_range_needs_room_for_a_client() -> None:
    assert str(PortRange(start=40000, end=40001)) == "40000-40001"
    with pytest.raises(ValidationError, match="at least 2 ports"):
        PortRange(start=40000, end=40000)
    with pytest.raises(ValidationError, match="at least 2 ports"):
        PortRange(start=40000, end=30000)


def test_the_token_cannot_be_smuggled_in_through_extra_env() -> None:
    with pytest.raises(ValidationError, match="Secret"):
        EnvVar(name="THUNDER_API_TOKEN", value="secret")


@pytest.mark.parametrize("value", [1, "100m", "64Mi", "1.5", "2e3"])
def test_quantities_accept_both_forms(value: int | str) -> None:
    assert ResourceRequirements(requests={"cpu": value}).requests["cpu"] == value


@pytest.mark.parametrize("value", ["lots", "1 Gi", True, 1.5])
def test_quantities_reject_nonsense(value: Any) -> None:
    with pytest.raises(ValidationError, match="quantity"):
        ResourceRequirements(requests={"cpu": value})


def test_registry_dir_is_the_plugin_dirs_sibling() -> None:
    assert KubeletSpec().registry_dir == "/var/lib/kubelet/plugins_registry"
    assert KubeletSpec(plugin_dir_root="/data/kubelet/plugins/").registry_dir == (
        "/data/kubelet/plugins_registry"
    )


def _client_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "claim": {"namespace": "ml", "name": "train-gpu", "uid": "1234"},
        "nodeName": "node-a",
        "zone": {"name": "us-east", "id": "zone-1"},
        "gpuType": "A6000",
        "gpuCount": 2,
        "enrollmentTokenId": "tok-1",
    }
    spec.update(changes)
    return spec


def test_client_parses_with_status() -> None:
    client = Client.model_validate(
        {
            "metadata": {"name": "c", "namespace": "ml", "finalizers": [CLIENT_FINALIZER]},
            "spec": _client_spec(),
            "status": {"phase": "Enrolled", "clientId": "cl-1", "orphanedSince": None},
        }
    )
    assert client.spec.consumer_kind == "Pod"
    assert client.status is not None
    assert client.status.phase is ClientPhase.ENROLLED
    assert client.status.orphaned_since is None


@pytest.mark.parametrize(
    "change",
    [
        {"gpuCount": 0},
        {"claim": {"namespace": "ml", "name": "x"}},
        {"claim": {"namespace": "ml", "name": "x", "uid": ""}},
        {"consumerKind": "Container"},
        {"nodeName": "Node_A"},
    ],
)
def test_client_spec_rules(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ClientSpec.model_validate(_client_spec(**change))


def _condition(status: str, when: datetime) -> Condition:
    return Condition.model_validate(
        {"type": "Ready", "status": status, "reason": "Synced", "lastTransitionTime": when}
    )


def test_set_condition_keeps_the_transition_time_while_status_holds() -> None:
    first = datetime(2026, 1, 1, tzinfo=UTC)
    later = first + timedelta(minutes=5)
    conditions = set_condition([], _condition("True", first))
    conditions = set_condition(conditions, _condition("True", later))
    ready = find_condition(conditions, ConditionType.READY)
    assert ready is not None
    assert ready.last_transition_time == first
    conditions = set_condition(conditions, _condition("False", later))
    ready = find_condition(conditions, ConditionType.READY)
    assert ready is not None
    assert (ready.status, ready.last_transition_time) == ("False", later)
    assert len(conditions) == 1
