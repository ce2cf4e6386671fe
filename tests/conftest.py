"""Shared pytest set-up: markers by folder, strict skips, and the fixtures of the local test
platform."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.cluster import Cluster, ClusterConfig
from hack.testbed.kube import Kube
from tests.support import skips

_TESTS = Path(__file__).parent
EXPECTED_SKIPS = _TESTS / "expected-skips.txt"


def pytest_configure(config: pytest.Config) -> None:
    """With THUNDER_STRICT_SKIPS=1 (`make test`), a skip not in expected-skips.txt fails the
    run (tests/support/skips.py). Under pytest-xdist the controller judges, not the workers."""
    if os.environ.get(skips.ENV, "") not in ("", "0") and not hasattr(config, "workerinput"):
        plugin = skips.StrictSkips(EXPECTED_SKIPS, skips.load(EXPECTED_SKIPS))
        config.pluginmanager.register(plugin, "thunder-strict-skips")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its top-level folder, so `-m unit` and friends select them."""
    for item in items:
        try:
            kind = Path(str(item.fspath)).relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The local control plane at the newest version, shared by the whole run."""
    with Cluster(workdir=tmp_path_factory.mktemp("control-plane"), config=ClusterConfig()) as c:
        yield c


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    return Kube(cluster.kubeconfig)
