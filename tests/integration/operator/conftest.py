"""Fixtures of the operator's integration tests: per module, one fake Thunder process and
one operator process with its own namespace and ThunderCluster (see harness.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.kube import Kube
from hack.testbed.operator import API_TOKEN, OperatorEnv, operator_env


@pytest.fixture(scope="module")
def fake_thunder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeThunderProcess]:
    log_path = tmp_path_factory.mktemp("fake-thunder") / "fake-thunder.log"
    with start_fake_thunder(tokens=[API_TOKEN], log_path=log_path) as process:
        yield process


@pytest.fixture(scope="module")
def env(
    request: pytest.FixtureRequest,
    kube: Kube,
    cluster: Cluster,
    fake_thunder: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    """The module's operator; a module that sets ``OPERATOR_ARGS`` runs it with those
    flags too."""
    args: Sequence[str] = getattr(request.module, "OPERATOR_ARGS", ())
    with operator_env(
        kube, cluster, fake_thunder, tmp_path_factory.mktemp("operator"), extra_args=args
    ) as made:
        yield made
