"""make preflight against the local control plane at 1.37 and at a stock 1.34."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.cluster import Cluster, ClusterConfig
from hack.testbed.kube import Kube
from ops import preflight

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def stock_134(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The launcher switches DRAExtendedResource on for emulated 1.34; a stock 1.34
    # cluster has it off.
    config = ClusterConfig(emulated_version="1.34", feature_gates={"DRAExtendedResource": False})
    with Cluster(workdir=tmp_path_factory.mktemp("cp-134"), config=config) as c:
        yield c


def test_at_137_extended_resources_work(cluster: Cluster) -> None:
    report = preflight.run(kubeconfig=str(cluster.kubeconfig))
    assert report.get("kubernetes-version").status is preflight.Status.OK
    assert report.get("resource.k8s.io/v1").status is preflight.Status.OK
    extended = report.get("extended-resources")
    assert extended.status is preflight.Status.OK, extended
    assert "survives" in extended.summary
    assert report.get("kubevirt").status is preflight.Status.INFO


def test_at_stock_134_the_gate_is_reported_off(stock_134: Cluster) -> None:
    report = preflight.run(kubeconfig=str(stock_134.kubeconfig))
    version = report.get("kubernetes-version")
    assert version.status is preflight.Status.OK
    assert "emulating 1.34" in version.summary
    extended = report.get("extended-resources")
    assert extended.status is preflight.Status.WARN
    assert "DRAExtendedResource" in extended.summary
    assert any("extendedResourcePrefix=''" in d for d in extended.details)
    assert not report.failed


def test_serving_nodes_without_a_zone_fail_the_report(stock_134: Cluster) -> None:
    kube = Kube(stock_134.kubeconfig)
    specs: dict[str, dict[str, Any]] = {
        "gpu-a": {"zone": "zone-a", "serving": True},
        "gpu-b": {"zone": None, "serving": True},
        "consumer": {"zone": None, "serving": False},
    }
    with kube.nodes(specs):
        report = preflight.run(kubeconfig=str(stock_134.kubeconfig))
        nodes = report.get("serving-nodes")
        assert nodes.status is preflight.Status.FAIL
        assert "1 of 2 serving node(s) have no zone label" in nodes.summary
        assert any("gpu-b" in d for d in nodes.details)
        assert report.failed
        # The readable report, as `make preflight` prints it.
        env = {**os.environ, "KUBECONFIG": str(stock_134.kubeconfig)}
        done = subprocess.run(
            [sys.executable, "-m", "ops.preflight"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 1
        assert "[FAIL] 1 of 2 serving node(s) have no zone label" in done.stdout
        assert "[warn] extended resources unavailable (DRAExtendedResource off)" in done.stdout
        assert "NOT READY" in done.stdout
