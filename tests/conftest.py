"""Shared pytest set-up: markers by folder, and the fixtures of the local test platform."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.cluster import Cluster, ClusterConfig
from hack.testbed.kube import Kube

_TESTS = Path(__file__).parent


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
