"""The daemon signs every Client it records, so the operator's reaper can tell its own
records from forgeries (see thunder_dra.kube.provenance)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    API_TOKEN,
    CLIENT_API,
    NodeHarness,
    Workloads,
    ZonePool,
)
from hack.testbed.kube import Kube
from thunder_dra.api.client import Client
from thunder_dra.controllers.reaper import recorded_by_driver
from thunder_dra.kube.provenance import ANNOTATION, ProvenanceKey
from thunder_dra.thunder import Secret


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start()
        yield harness


@pytest.fixture(scope="module")
def pods(kube: Kube, namespace: str, pool: ZonePool) -> Workloads:
    return Workloads(kube, namespace, pool)


@pytest.mark.parametrize("vm", [False, True], ids=["pod", "vm"])
def test_a_client_recorded_by_the_daemon_carries_a_signature_the_reaper_accepts(
    kube: Kube, node: NodeHarness, namespace: str, pods: Workloads, vm: bool
) -> None:
    name, _ = pods.create(node, vm=vm)
    pod = pods.wait_running(node, name)
    raw = kube.get(CLIENT_API, "Client", f"claim-{pod.claim_uid}", namespace)
    assert raw is not None
    client = Client.model_validate(raw)
    signature = client.metadata.annotations[ANNOTATION]
    assert signature.startswith("v1:")
    assert API_TOKEN not in str(raw)
    assert recorded_by_driver(client, ProvenanceKey(Secret(API_TOKEN)))
    assert not recorded_by_driver(client, ProvenanceKey(Secret("another-api-token")))
    pods.delete(name)
    pods.wait_gone(node, name)
