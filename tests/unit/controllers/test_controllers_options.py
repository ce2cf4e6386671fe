"""The operator's command line and environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hack import operator_under_test
from thunder_dra.controllers.process.options import ElectionTimings, parse_options


def test_defaults() -> None:
    options = parse_options([], environ={})
    assert options.namespace == "thunder-system"
    assert not options.standalone
    assert options.lease_name == "thunder-device-plugin"
    # The names kustomize and the OLM bundle give (docs/install-names.md).
    assert options.daemon_service_account == "thunder-daemon"
    assert options.operator_service_account == "thunder-operator"
    assert options.election == ElectionTimings(15, 10, 2)
    assert (options.health_port, options.metrics_port) == (8081, 8080)
    assert not options.webhook_enabled
    assert options.orphan_grace_period_override is None


def test_the_charts_environment_configures_the_process() -> None:
    options = parse_options(
        [],
        environ={
            "THUNDER_NAMESPACE": "gpu-system",
            "THUNDER_CLUSTER_NAME": "main",
            "THUNDER_LEADER_ELECTION_LEASE": "release-x",
            "THUNDER_HEALTH_PORT": "9000",
            "THUNDER_METRICS_PORT": "9001",
            "THUNDER_WEBHOOK_PORT": "9443",
            "THUNDER_WEBHOOK_CERT_DIR": "/certs",
            "THUNDER_DAEMON_SERVICE_ACCOUNT": "release-x-daemon",
            "THUNDER_LOG_FORMAT": "json",
        },
    )
    assert options.namespace == "gpu-system"
    assert options.cluster_name == "main"
    assert options.lease_name == "release-x"
    assert (options.health_port, options.metrics_port, options.webhook_port) == (9000, 9001, 9443)
    assert options.webhook_cert_file == Path("/certs/tls.crt")
    assert options.webhook_key_file == Path("/certs/tls.key")
    assert options.daemon_service_account == "release-x-daemon"
    assert options.log_format == "json"


def test_thunder_dra_namespace_wins_and_flags_win_over_the_environment() -> None:
    environ = {"THUNDER_DRA_NAMESPACE": "a", "THUNDER_NAMESPACE": "b"}
    assert parse_options([], environ=environ).namespace == "a"
    assert parse_options(["--namespace", "c"], environ=environ).namespace == "c"


def test_the_grace_override_is_not_a_production_flag() -> None:
    with pytest.raises(SystemExit):
        parse_options(["--orphan-grace-period-override", "4s"], environ={})
    assert parse_options([], environ={}).orphan_grace_period_override is None


def test_the_test_entry_point_sets_the_grace_override() -> None:
    options = operator_under_test.parse(["--orphan-grace-period-override", "4s", "--standalone"])
    assert options.orphan_grace_period_override == timedelta(seconds=4)
    assert options.standalone


def test_the_peering_flags_are_gone() -> None:
    for argv in (["--peering", "x"], ["--peering-priority", "1"], ["--peering-lifetime", "9"]):
        with pytest.raises(SystemExit):
            parse_options(argv, environ={})


def test_a_certificate_needs_its_key() -> None:
    with pytest.raises(SystemExit):
        parse_options(["--webhook-cert-file", "/c.crt"], environ={})
