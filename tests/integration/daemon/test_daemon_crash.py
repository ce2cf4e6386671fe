"""Crash safety: the daemon killed right after each step of prepare, unprepare and node
enrollment (``python -m hack.daemon_under_test --crash-at``: ``os._exit(137)``, as abrupt
as SIGKILL), then restarted, converges with zero leaked enrollments by the fake service's
audit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    NodeHarness,
    Workloads,
    ZonePool,
    enrolled_record,
    files_under,
)
from hack.testbed.kube import Kube, wait_for
from thunder_dra.plugin.state.crashpoints import ENROLL_STEPS, PREPARE_STEPS, UNPREPARE_STEPS

CRASHED = 137
POD_PREPARE = [s for s in PREPARE_STEPS if s != "prepare:secret-written"]
VM_PREPARE = [
    "prepare:token-recorded",
    "prepare:secret-written",
    "prepare:client-recorded",
    "prepare:checkpoint-committed",
]
POD_UNPREPARE = [s for s in UNPREPARE_STEPS if s != "unprepare:secret-removed"]
VM_UNPREPARE = ["unprepare:token-revoked", "unprepare:secret-removed", "unprepare:client-removed"]


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        yield harness


@pytest.fixture(scope="module")
def pods(kube: Kube, namespace: str, pool: ZonePool) -> Workloads:
    return Workloads(kube, namespace, pool)


@pytest.fixture
def daemon_stopped(node: NodeHarness, pods: Workloads) -> Iterator[NodeHarness]:
    yield node
    # A failed test must not leave its pod to the next one: unprepare it with a daemon
    # that is not armed, then stop.
    if not node.daemon.running():
        node.daemon.start()
    for pod in pods.kube.list_objects("v1", "Pod", pods.namespace):
        name = pod["metadata"]["name"]
        pods.delete(name)
        pods.wait_gone(node, name)
    node.daemon.stop()


def _crashed_at(node: NodeHarness, step: str) -> None:
    code = node.daemon.wait_exit(timeout=90)
    assert code == CRASHED, node.daemon.log_text()[-3000:]
    assert f"crash hook: exiting at {step}" in node.daemon.log_text()


def _assert_clean(kube: Kube, fake: FakeThunderProcess, node: NodeHarness, pods: Workloads) -> None:
    audit = fake.admin.audit()
    assert audit["leaks"] == []
    assert audit["orphanClients"] == []
    # The record and the checkpoint entry go right after an unprepare's answer.
    wait_for(
        lambda: kube.list_objects(CLIENT_API, "Client", pods.namespace) == [],
        "the Client records removed",
        timeout=30,
    )
    assert (
        kube.list_objects("v1", "Secret", pods.namespace, "app.kubernetes.io/component=daemon")
        == []
    )
    assert not list(files_under(node.daemon.cdi_dir))
    assert not list(files_under(node.daemon.state_dir / "claims"))
    wait_for(lambda: node.daemon.journal_entries() == [], "the mint journal empty", timeout=30)
    wait_for(lambda: node.daemon.checkpoint_claims() == [], "the checkpoint empty", timeout=30)


def _live_clients_named(fake: FakeThunderProcess, hostname: str) -> int:
    clients = fake.admin.state()["clients"]
    return sum(1 for c in clients if c["displayName"] == hostname and not c["decommissionedAt"])


@pytest.mark.parametrize(
    ("step", "vm"),
    [(s, False) for s in POD_PREPARE] + [(s, True) for s in VM_PREPARE],
)
def test_a_crash_during_prepare_converges_without_leaks(
    kube: Kube,
    fake: FakeThunderProcess,
    daemon_stopped: NodeHarness,
    pods: Workloads,
    step: str,
    vm: bool,
) -> None:
    node = daemon_stopped
    node.daemon.start(crash_at=step)
    name, _ = pods.create(node, vm=vm)
    _crashed_at(node, step)

    node.daemon.start()
    pod = pods.wait_running(node, name)
    client = enrolled_record(kube, pods.namespace, pod.claim_uid)
    assert client["spec"].get("clientId", "") == client["status"].get("clientId", "")
    leaks = fake.admin.leaks()
    if vm:
        # The VM's own token waits, unspent, for the guest to exchange it; nothing else.
        assert [leak["enrollmentTokenId"] for leak in leaks] == [
            client["spec"]["enrollmentTokenId"]
        ]
    else:
        assert leaks == []
        # Exactly one live Thunder client serves the claim; a crashed attempt's is revoked.
        assert _live_clients_named(fake, name) == 1
        assert (node.daemon.state_dir / "claims" / pod.claim_uid / "config.json").is_file()

    pods.delete(name)
    pods.wait_gone(node, name)
    _assert_clean(kube, fake, node, pods)


@pytest.mark.parametrize(
    ("step", "vm"),
    [(s, False) for s in POD_UNPREPARE] + [(s, True) for s in VM_UNPREPARE],
)
def test_a_crash_during_unprepare_converges_without_leaks(
    kube: Kube,
    fake: FakeThunderProcess,
    daemon_stopped: NodeHarness,
    pods: Workloads,
    step: str,
    vm: bool,
) -> None:
    node = daemon_stopped
    node.daemon.start(crash_at=step)
    name, _ = pods.create(node, vm=vm)
    pods.wait_running(node, name)
    pods.delete(name)
    _crashed_at(node, step)

    node.daemon.start()
    pods.wait_gone(node, name)
    _assert_clean(kube, fake, node, pods)


@pytest.fixture
def serving(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone, serving=True) as harness:
        harness.daemon.host.set_nvidia(gpus=["NVIDIA H100 80GB HBM3"] * 2)
        yield harness


@pytest.mark.parametrize("step", ENROLL_STEPS)
def test_a_crash_during_node_enrollment_converges_without_leaks(
    fake: FakeThunderProcess, serving: NodeHarness, step: str
) -> None:
    daemon = serving.daemon
    daemon.start(crash_at=step)
    _crashed_at(serving, step)
    daemon.start().wait_serving()
    wait_for(lambda: daemon.http("/readyz")[0] == 200, "the serving daemon ready", timeout=60)
    hosts = [h for h in fake.admin.state()["hosts"] if h["hostname"] == serving.name]
    assert len(hosts) == 1
    assert fake.admin.leaks() == []
    wait_for(lambda: daemon.journal_entries() == [], "the mint journal empty", timeout=30)
