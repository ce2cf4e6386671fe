"""The leader Lease through the operator's one Kubernetes client: each Lease request is
bounded by the renew deadline, not by the client's longer request timeout, and the
elector campaigns on that client against the in-memory apiserver."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from tests.support.fakekube import FakeKube
from thunder_dra.controllers.process.leader import LeaderElector
from thunder_dra.controllers.process.lease import (
    KubeLeaseStore,
    LeaseConflict,
    LeaseRecord,
    LeaseUnavailable,
)
from thunder_dra.controllers.process.main import Operator
from thunder_dra.controllers.process.options import ElectionTimings, parse_options
from thunder_dra.kube.client import KubeClient, Request, Response
from thunder_dra.kube.resources import LEASES, SECRETS

pytestmark = pytest.mark.unit

CLIENT_TIMEOUT = 60.0
RENEW_DEADLINE = 0.2
NAMESPACE = "thunder-system"
LEASE = "thunder-dra-operator"


def _shared(fake: FakeKube) -> KubeClient:
    return KubeClient(fake, timeout=CLIENT_TIMEOUT)


def _store(kube: KubeClient) -> KubeLeaseStore:
    return KubeLeaseStore(kube, NAMESPACE, LEASE, request_timeout=RENEW_DEADLINE)


async def test_every_lease_request_carries_the_renew_deadline_as_its_timeout() -> None:
    fake = FakeKube()
    kube = _shared(fake)
    store = _store(kube)
    assert await store.get() is None
    created = await store.create(LeaseRecord("a", 15, None, None, 0))
    await store.update(created)
    await kube.get_optional(SECRETS.item("other", NAMESPACE))

    lease_calls = fake.calls(path=LEASES.collection(NAMESPACE))
    assert [r.method for r in lease_calls] == ["GET", "POST", "PUT"]
    assert {r.timeout for r in lease_calls} == {RENEW_DEADLINE}
    # The client's other callers keep its own timeout.
    assert fake.calls(path=SECRETS.collection(NAMESPACE))[0].timeout == CLIENT_TIMEOUT


@pytest.mark.parametrize("method", ["GET", "POST", "PUT"])
async def test_a_hung_lease_request_fails_at_the_renew_deadline_naming_the_lease(
    method: str,
) -> None:
    fake = FakeKube()
    kube = _shared(fake)
    store = _store(kube)
    existing = await store.create(LeaseRecord("a", 15, None, None, 0))
    fake.fail(method, "/leases", hang=True)

    async def call() -> object:
        if method == "GET":
            return await store.get()
        if method == "POST":
            return await store.create(LeaseRecord("b", 15, None, None, 0))
        return await store.update(existing)

    # The guard is only there so a regression fails instead of hanging the suite; the
    # request itself must give up after RENEW_DEADLINE, long before CLIENT_TIMEOUT.
    async with asyncio.timeout(CLIENT_TIMEOUT / 2):
        with pytest.raises(LeaseUnavailable, match=f"Lease {NAMESPACE}/{LEASE}: .*within 0.2s"):
            await call()
    # The shared client is still usable afterwards.
    assert (await store.get()) == existing


async def test_a_stale_write_is_a_conflict_through_the_shared_client() -> None:
    kube = _shared(FakeKube())
    store = _store(kube)
    first = await store.create(LeaseRecord("a", 15, None, None, 0))
    await store.update(first)
    with pytest.raises(LeaseConflict):
        await store.update(first)
    with pytest.raises(LeaseConflict):
        await store.create(LeaseRecord("b", 15, None, None, 0))


async def test_the_elector_leads_and_releases_through_the_shared_client() -> None:
    fake = FakeKube()
    kube = _shared(fake)
    timings = ElectionTimings(lease_duration=2, renew_deadline=RENEW_DEADLINE, retry_period=0.05)
    elector = LeaderElector(_store(kube), "replica-a", timings)
    elector.start()
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT / 2):
            term = await elector.wait_for_term()
        stored = fake.get(LEASES.item(LEASE, NAMESPACE))
        assert stored is not None
        assert stored["spec"]["holderIdentity"] == "replica-a"
    finally:
        await elector.stop(release=True)
    assert term.lost.is_set()
    released = fake.get(LEASES.item(LEASE, NAMESPACE))
    assert released is not None
    assert released["spec"].get("holderIdentity") is None


@dataclass
class UnansweredRenewal(FakeKube):
    """Once armed, applies the next Lease PUT and never answers it: a renewal still in
    flight when the stop cancels it, which the apiserver carries out all the same."""

    armed: bool = False
    landed: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, request: Request) -> Response:
        answer = await super().send(request)
        if self.armed and request.method == "PUT" and "/leases/" in request.path:
            self.armed = False
            self.landed.set()
            await asyncio.Event().wait()
        return answer


async def test_a_release_racing_a_renewal_that_landed_unanswered_still_releases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="thunder_dra.controllers.process.leader")
    fake = UnansweredRenewal()
    kube = _shared(fake)
    # Deadlines far beyond the test, so the unanswered renewal is cut off by the stop
    # alone, never by its own timeout.
    timings = ElectionTimings(lease_duration=60, renew_deadline=30, retry_period=0.05)
    store = KubeLeaseStore(kube, NAMESPACE, LEASE, request_timeout=timings.renew_deadline)
    elector = LeaderElector(store, "replica-a", timings)
    elector.start()
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT / 2):
            await elector.wait_for_term()
            fake.armed = True
            await fake.landed.wait()
    finally:
        await elector.stop(release=True)
    released = fake.get(LEASES.item(LEASE, NAMESPACE))
    assert released is not None
    assert released["spec"].get("holderIdentity") is None
    assert released["spec"]["leaseDurationSeconds"] == 1
    # The release at the version read before the renewal conflicted ("Lease ... changed"):
    # read again, then released at the version the renewal left.
    lease_calls = fake.calls(path=LEASES.collection(NAMESPACE))
    assert [r.method for r in lease_calls][-3:] == ["PUT", "GET", "PUT"]
    assert "the Lease changed while releasing it" in caplog.text
    assert "released the Lease" in caplog.text
    assert "could not release the Lease" not in caplog.text


def test_the_operator_elects_through_its_own_client_bounded_by_the_renew_deadline() -> None:
    options = parse_options(
        ["--leader-election-renew-deadline", "7s", "--kube-request-timeout", "90s"],
        environ={"THUNDER_LEADER_ELECTION_LEASE": "release-x"},
    )
    operator = Operator(options)
    store = operator.lease_store()
    assert store.kube is operator.kube
    assert (store.namespace, store.name) == (options.namespace, "release-x")
    assert store.request_timeout == 7.0
    assert operator.kube.timeout == 90.0
