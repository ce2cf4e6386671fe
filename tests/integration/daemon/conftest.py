"""Fixtures of the daemon tests: CRDs in the session cluster, a fake Thunder per module,
and a zone pool published the way the operator would (the operator itself does not run)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.daemon import API_TOKEN, REPO, ZonePool
from hack.testbed.kube import Kube, wait_for
from tests.support.runc import build_cdi_check


def _established(kube: Kube, name: str) -> bool:
    crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) or {}
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="session")
def crds(kube: Kube) -> None:
    resource = kube.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    for path in sorted((REPO / "crds").glob("*.yaml")):
        body: dict[str, Any] = yaml.safe_load(path.read_text())
        kube.dyn.server_side_apply(  # type: ignore[no-untyped-call]
            resource, body=body, field_manager="thunder-dra-tests", force_conflicts=True
        )
        name: str = body["metadata"]["name"]

        def established(name: str = name) -> bool:
            return _established(kube, name)

        wait_for(established, f"CRD {name} established")


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeThunderProcess]:
    log_path = tmp_path_factory.mktemp("fake-thunder") / "fake-thunder.log"
    with start_fake_thunder(tokens=[API_TOKEN], log_path=log_path, log_level="WARNING") as f:
        yield f


@pytest.fixture(scope="module")
def pool(kube: Kube, crds: None, fake: FakeThunderProcess) -> Iterator[ZonePool]:
    published = ZonePool(kube, fake).publish()
    try:
        yield published
    finally:
        published.withdraw()


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    with kube.namespace("daemon") as name:
        yield name


@pytest.fixture(scope="session")
def cdi_check() -> Path:
    if shutil.which("go") is None:
        pytest.skip("Go toolchain not found: cdi-check (hack/build-cdi-check.sh) needs it")
    return build_cdi_check()
