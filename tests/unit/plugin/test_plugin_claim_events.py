"""The daemon's Warning events on ResourceClaims, written by the recorder both processes
share (thunder_dra/kube/events.py): what one holds, how repeats count, and that a token
in an error's text never reaches the API server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.support.fakekube import FakeKube
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.events import FLUSH_INTERVAL, EventRecorder
from thunder_dra.kube.provenance import ProvenanceKey
from thunder_dra.kube.resources import EVENTS
from thunder_dra.plugin.claims.records import Records
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.process.tracing import DAEMON_SERVICE
from thunder_dra.thunder import Secret

pytestmark = pytest.mark.unit

NODE = "gpu-node-1"
TOKEN = "tr_enroll-9c2e55d0a1"
EVENTS_PATH = EVENTS.collection("work")


class Node:
    def __init__(self) -> None:
        self.fake = FakeKube()
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
        scrubber = SecretScrubber()
        scrubber.add(TOKEN)
        kube = KubeClient(self.fake)
        events = EventRecorder(
            kube,
            component=DAEMON_SERVICE,
            instance=NODE,
            host=NODE,
            scrub=scrubber.scrub,
            clock=lambda: self.now,
        )
        self.records = Records(kube, NODE, ProvenanceKey(Secret("api-token")), events=events)

    async def fail(self, message: str) -> None:
        await self.records.claim_event("work", "gpu", "claim-uid", "ThunderPrepareFailed", message)

    def events(self) -> list[dict[str, object]]:
        return [o for (_, plural, _, _), o in self.fake.objects.items() if plural == "events"]


async def test_a_claim_event_names_the_claim_the_daemon_and_its_node() -> None:
    node = Node()
    await node.fail("zone lookup failed")
    (event,) = node.events()
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "gpu",
        "uid": "claim-uid",
        "namespace": "work",
    }
    assert event["type"] == "Warning"
    assert event["source"] == {"component": "thunder-dra-daemon", "host": NODE}
    assert event["reportingInstance"] == NODE


async def test_the_kubelets_retries_count_into_one_event() -> None:
    node = Node()
    for _ in range(5):  # every 15 s: the last one FLUSH_INTERVAL after the first
        await node.fail("zone lookup failed")
        node.now += FLUSH_INTERVAL / 4
    writes = [r.method for r in node.fake.requests if r.path.startswith(EVENTS_PATH)]
    assert writes == ["POST", "PATCH"]
    (event,) = node.events()
    assert event["count"] == 5


async def test_a_token_in_an_error_never_reaches_an_event() -> None:
    node = Node()
    await node.fail(f"installer exited 1: enrolling with {TOKEN} refused")
    (event,) = node.events()
    assert TOKEN not in str(event)
    assert all(TOKEN.encode() not in (r.body or b"") for r in node.fake.requests)


async def test_an_event_the_api_server_refuses_does_not_fail_the_prepare() -> None:
    node = Node()
    node.fake.fail("POST", "/events", status=403)
    await node.fail("zone lookup failed")  # returns: the prepare's answer is unaffected
    assert node.events() == []
