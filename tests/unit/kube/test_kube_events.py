"""The one event recorder of both processes: what an event holds, the repeat rule, secrets,
and that posting never fails the caller. The recorder's clock is a test's own, so no test
waits or reads the wall clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.fakekube import FakeKube
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.events import (
    CLUSTER_SCOPED_EVENTS_NAMESPACE,
    CORRELATION_WINDOW,
    FLUSH_INTERVAL,
    MESSAGE_MAX,
    EventRecorder,
    ObjectRef,
)
from thunder_dra.process.logs import SecretScrubber

pytestmark = pytest.mark.unit

TOKEN = "tr_enroll-4f1c9a7d2b"
CLAIM = ObjectRef("resource.k8s.io/v1", "ResourceClaim", "gpu", "claim-uid", "work")
CLUSTER = ObjectRef("thundercompute.com/v1alpha1", "ThunderCluster", "thunder", "tc-uid")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class World:
    def __init__(self, *, host: str | None = None) -> None:
        self.fake = FakeKube()
        self.clock = Clock()
        self.scrubber = SecretScrubber()
        self.scrubber.add(TOKEN)
        self.recorder = EventRecorder(
            KubeClient(self.fake),
            component="thunder-dra-daemon",
            instance="node-a",
            host=host,
            scrub=self.scrubber.scrub,
            clock=self.clock,
        )

    def events(self, namespace: str = "work") -> list[dict[str, object]]:
        return [
            obj
            for (_, plural, where, _), obj in self.fake.objects.items()
            if plural == "events" and where == namespace
        ]

    def writes(self) -> list[str]:
        return [r.method for r in self.fake.requests if "/events" in r.path]


@pytest.fixture
def world() -> World:
    return World(host="node-a")


async def test_an_event_names_its_object_writer_and_node(world: World) -> None:
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    (event,) = world.events()
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "gpu",
        "uid": "claim-uid",
        "namespace": "work",
    }
    assert (event["type"], event["reason"], event["count"]) == (
        "Warning",
        "ThunderPrepareFailed",
        1,
    )
    assert event["source"] == {"component": "thunder-dra-daemon", "host": "node-a"}
    assert (event["reportingComponent"], event["reportingInstance"]) == (
        "thunder-dra-daemon",
        "node-a",
    )
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-12-01T12:00:00Z"


async def test_a_cluster_scoped_objects_events_go_to_default() -> None:
    world = World()
    await world.recorder.post(CLUSTER, "Normal", "PoolsAdded", "2 pools")
    (event,) = world.events(CLUSTER_SCOPED_EVENTS_NAMESPACE)
    assert "namespace" not in event["involvedObject"]  # type: ignore[operator]
    assert event["source"] == {"component": "thunder-dra-daemon"}


async def test_repeats_are_counted_and_written_at_most_once_a_flush_interval(
    world: World,
) -> None:
    for _ in range(5):
        await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
        world.clock.advance(FLUSH_INTERVAL / 4)
    # One create, then one patch once FLUSH_INTERVAL has passed since it.
    assert world.writes() == ["POST", "PATCH"]
    (event,) = world.events()
    assert event["count"] == 5
    assert event["lastTimestamp"] == "2026-12-01T12:01:00Z"


async def test_a_different_message_or_a_silence_past_the_window_is_a_new_event(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "Thunder mint failed")
    world.clock.advance(CORRELATION_WINDOW)
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    assert world.writes() == ["POST", "POST", "POST"]
    assert sorted(e["count"] for e in world.events()) == [1, 1, 1]  # type: ignore[type-var]
    assert "could not record an event" not in caplog.text


async def test_an_event_the_api_server_expired_is_started_again(world: World) -> None:
    """A problem that outlives the event's TTL (an hour) is not reported into the void."""
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    world.fake.objects.clear()  # the API server's TTL removed it
    world.clock.advance(FLUSH_INTERVAL)
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    world.clock.advance(FLUSH_INTERVAL / 4)
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    assert world.writes() == ["POST", "PATCH", "POST"]
    assert len(world.events()) == 1


async def test_a_failed_patch_is_not_retried_on_every_repeat(world: World) -> None:
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    world.fake.fail("PATCH", "/events/", status=500, times=None)
    world.clock.advance(FLUSH_INTERVAL)
    for _ in range(4):
        await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "zone lookup failed")
    assert world.writes().count("PATCH") == 1


async def test_no_event_carries_a_registered_secret(world: World) -> None:
    message = f"installer said: THUNDER_TOKEN={TOKEN} rejected"
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", message)
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", message)
    (event,) = world.events()
    assert TOKEN not in str(event)
    assert "THUNDER_TOKEN=**********" in str(event["message"])
    assert event["count"] == 1  # the repeat counts against the scrubbed text


async def test_a_long_message_is_cut_to_the_limit(world: World) -> None:
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", "x" * 5000)
    (event,) = world.events()
    assert len(str(event["message"])) == MESSAGE_MAX


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 403},
        {"status": 500},
        {"error": ConnectionResetError("reset")},
        {"error": RuntimeError("a transport bug")},
    ],
)
async def test_posting_never_fails_the_caller(
    world: World, fault: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    world.fake.fail("POST", "/events", times=None, **fault)  # type: ignore[arg-type]
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", f"failed: {TOKEN}")
    assert world.events() == []
    assert "could not record an event" in caplog.text
    # Not counted as posted: the next attempt creates it.
    world.fake.faults.clear()
    await world.recorder.post(CLAIM, "Warning", "ThunderPrepareFailed", f"failed: {TOKEN}")
    assert len(world.events()) == 1
