"""Admission validation: every problem, each with its field path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from thunder_dra.webhooks.validation import (
    FieldError,
    field_path,
    format_errors,
    validate_client,
    validate_thundercluster,
)


def cluster(spec: dict[str, Any] | None = None, name: str = "thunder") -> dict[str, Any]:
    return {
        "apiVersion": "thundercompute.com/v1alpha1",
        "kind": "ThunderCluster",
        "metadata": {"name": name},
        "spec": spec or {},
    }


def messages(errors: list[FieldError]) -> list[str]:
    return [str(error) for error in errors]


def test_an_empty_spec_is_valid() -> None:
    assert validate_thundercluster(cluster()) == []


def test_duration_bounds_name_the_field_and_the_value() -> None:
    errors = validate_thundercluster(cluster({"operator": {"reconcileInterval": "0s"}}))
    assert messages(errors) == [
        'spec.operator.reconcileInterval: must be between 5s and 24h, got "0s"'
    ]


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [
        (
            {"operator": {"reconcileInterval": "soon"}},
            "spec.operator.reconcileInterval",
            "not a duration",
        ),
        (
            {"operator": {"orphanGracePeriod": "10s"}},
            "spec.operator.orphanGracePeriod",
            "30s and 168h",
        ),
        ({"thunder": {"apiURL": "http://thunder.example.com"}}, "spec.thunder.apiURL", "https"),
        ({"thunder": {"telemetryURL": "ftp://x"}}, "spec.thunder.telemetryURL", "https://"),
        ({"thunder": {"secretName": "Thunder_API"}}, "spec.thunder.secretName", "DNS subdomain"),
        ({"thunder": {"secretNamespace": "a.b"}}, "spec.thunder.secretNamespace", "DNS label"),
        (
            {"operator": {"extendedResourcePrefix": "kubernetes.io/gpu-"}},
            "spec.operator.extendedResourcePrefix",
            "kubernetes.io",
        ),
        ({"operator": {"deviceClassPrefix": "GPU-"}}, "spec.operator.deviceClassPrefix", "DNS"),
        ({"nvidia": {"minDriverVersion": 0}}, "spec.nvidia.minDriverVersion", "300"),
        ({"nvidia": {"minDriverVersion": 61000}}, "spec.nvidia.minDriverVersion", "9999"),
        (
            {"daemon": {"thunderdPortRange": {"start": 32100, "end": 32000}}},
            "spec.daemon.thunderdPortRange",
            "end >= start",
        ),
        (
            {"daemon": {"thunderdPortRange": {"start": 80, "end": 2000}}},
            "spec.daemon.thunderdPortRange.start",
            "1024",
        ),
        (
            {"daemon": {"tolerations": [{"operator": "Sometimes"}]}},
            "spec.daemon.tolerations[0].operator",
            "Exists",
        ),
        (
            {"daemon": {"nodeSelector": {"bad key!": "x"}}},
            "spec.daemon.nodeSelector",
            "label keys",
        ),
        (
            {"daemon": {"resources": {"limits": {"memory": "lots"}}}},
            "spec.daemon.resources.limits.memory",
            "quantity",
        ),
        (
            {"daemon": {"extraEnv": [{"name": "THUNDER_API_TOKEN", "value": "x"}]}},
            "spec.daemon.extraEnv[0].name",
            "Secret",
        ),
        ({"operator": "fast"}, "spec.operator", "dictionary"),
    ],
)
def test_field_rules(spec: dict[str, Any], path: str, fragment: str) -> None:
    errors = validate_thundercluster(cluster(spec))
    assert [e.path for e in errors] == [path], messages(errors)
    assert fragment in errors[0].message


def test_loopback_http_is_allowed_for_local_testing() -> None:
    spec = {"thunder": {"apiURL": "http://127.0.0.1:8080", "artifactBaseURL": "http://[::1]:81"}}
    assert validate_thundercluster(cluster(spec)) == []


def test_every_problem_is_reported_at_once() -> None:
    errors = validate_thundercluster(
        cluster(
            {
                "operator": {"reconcileInterval": "0s", "orphanGracePeriod": "-1m"},
                "thunder": {"apiURL": "http://x.example"},
            }
        ),
        existing_names=["other"],
    )
    assert {e.path for e in errors} == {
        "spec.operator.reconcileInterval",
        "spec.operator.orphanGracePeriod",
        "spec.thunder.apiURL",
        "metadata.name",
    }
    assert format_errors(errors).count("; ") == 3


def test_only_one_thundercluster_per_cluster() -> None:
    [error] = validate_thundercluster(cluster(name="second"), existing_names=["thunder"])
    assert str(error) == (
        'metadata.name: only one ThunderCluster may exist per cluster, and "thunder" already does'
    )
    assert validate_thundercluster(cluster(), existing_names=["thunder"]) == []
    assert validate_thundercluster(cluster(), old=cluster(), existing_names=["thunder"]) == []


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("operator", "driverName", "gpu.example.com"),
        ("operator", "extendedResourcePrefix", ""),
        ("operator", "deviceClassPrefix", "tgpu-"),
    ],
)
def test_naming_settings_are_frozen_once_objects_are_published(
    section: str, field: str, value: str
) -> None:
    new = cluster({section: {field: value}})
    assert validate_thundercluster(new, old=cluster(), objects_published=False) == []
    [error] = validate_thundercluster(new, old=cluster(), objects_published=True)
    assert error.path == f"spec.{section}.{field}"
    assert "immutable" in error.message
    assert f'got "{value}"' in error.message


def test_other_settings_may_change_while_published() -> None:
    new = cluster({"operator": {"reconcileInterval": "30s"}, "daemon": {"logLevel": "debug"}})
    assert validate_thundercluster(new, old=cluster(), objects_published=True) == []


def test_explicit_defaults_are_not_a_change() -> None:
    new = cluster({"operator": {"driverName": "thundercompute.com"}})
    assert validate_thundercluster(new, old=cluster(), objects_published=True) == []


def test_an_invalid_old_object_still_guards_the_names() -> None:
    old = cluster({"operator": {"reconcileInterval": "0s", "driverName": "a.example.com"}})
    new = cluster({"operator": {"driverName": "b.example.com"}})
    [error] = validate_thundercluster(new, old=old, objects_published=True)
    assert error.path == "spec.operator.driverName"


def client(**spec_changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "claim": {"namespace": "ml", "name": "train", "uid": "c0ffee"},
        "nodeName": "node-a",
        "zone": {"name": "us-east", "id": "zone-1"},
        "gpuType": "A6000",
        "gpuCount": 2,
        "enrollmentTokenId": "tok-1",
        "consumerKind": "Pod",
    }
    spec.update(spec_changes)
    return {"metadata": {"name": "train-c0ffee", "namespace": "ml"}, "spec": spec}


def test_a_valid_client() -> None:
    assert validate_client(client()) == []


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"claim": {"namespace": "ml", "name": "train"}}, "spec.claim.uid"),
        ({"claim": {"namespace": "", "name": "train", "uid": "u"}}, "spec.claim.namespace"),
        ({"gpuCount": 0}, "spec.gpuCount"),
        ({"gpuType": ""}, "spec.gpuType"),
        ({"zone": {"name": "us-east"}}, "spec.zone.id"),
        ({"consumerKind": "Container"}, "spec.consumerKind"),
    ],
)
def test_client_field_rules(changes: dict[str, Any], path: str) -> None:
    assert [e.path for e in validate_client(client(**changes))] == [path]


def test_a_missing_spec_is_reported() -> None:
    errors = validate_client({"metadata": {"name": "x"}})
    assert "spec.claim" in {e.path for e in errors}


@pytest.mark.parametrize(
    "changes",
    [
        {"gpuCount": 3},
        {"gpuType": "H100"},
        {"nodeName": "node-b"},
        {"claim": {"namespace": "ml", "name": "train", "uid": "other"}},
        {"zone": {"name": "us-east", "id": "zone-2"}},
        {"consumerKind": "VirtualMachine"},
    ],
)
def test_client_spec_is_immutable(changes: dict[str, Any]) -> None:
    errors = validate_client(client(**changes), old=client())
    assert len(errors) == 1
    assert "immutable" in errors[0].message


def test_set_once_fields_may_be_filled_in_but_not_changed() -> None:
    assert validate_client(client(), old=client(enrollmentTokenId="")) == []
    assert validate_client(client(consumerName="pod-1"), old=client()) == []
    [error] = validate_client(client(enrollmentTokenId="tok-2"), old=client())
    assert error.path == "spec.enrollmentTokenId"


def test_status_and_metadata_updates_pass() -> None:
    old = client()
    new = copy.deepcopy(old)
    new["status"] = {"phase": "Revoking", "orphanedSince": "2026-01-01T00:00:00Z"}
    new["metadata"]["finalizers"] = []
    assert validate_client(new, old=old) == []


def test_field_paths() -> None:
    assert field_path("spec", ("daemon", "tolerations", 0, "key")) == (
        "spec.daemon.tolerations[0].key"
    )
    assert field_path("spec", ("daemon", "nodeSelector", "kubernetes.io/os")) == (
        "spec.daemon.nodeSelector[kubernetes.io/os]"
    )
