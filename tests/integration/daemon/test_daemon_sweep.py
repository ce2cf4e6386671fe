"""The journal sweep keeps working through an API server that stops answering: the real
kube-apiserver is paused (SIGSTOP) for longer than the daemon's Kubernetes request timeout
while a journal entry waits to be rolled back, then resumed (SIGCONT). The sweep counts
its failed passes, backs off, and rolls the entry back once the API answers again."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    live_clients,
)
from hack.testbed.kube import Kube, wait_for

EXCHANGE = "/api/v1/enrollment-tokens/enroll"
UNENROLL = "/api/v1/enrollment-tokens/*/node"
KUBE_TIMEOUT = 1.0
SWEEP_ERRORS = 'thunder_dra_daemon_errors_total{operation="journal-sweep",reason="kubernetes"}'


@pytest.fixture
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(
        kube, fake, zone=pool.zone, extra_args=["--kube-timeout", str(KUBE_TIMEOUT)]
    ) as harness:
        harness.daemon.start().wait_serving()
        yield harness


@pytest.fixture
def apiserver(cluster: Cluster) -> Iterator[int]:
    pid = cluster.pids["kube-apiserver"]
    yield pid
    os.kill(pid, signal.SIGCONT)  # whatever happened, never leave it paused


def _sweep_failures(node: NodeHarness) -> list[int]:
    return [
        int(r.get("passes_failed_in_row", 0))
        for r in node.daemon.log_records()
        if r.get("message") == "journal sweep pass failed; retrying with backoff"
    ]


def test_the_sweep_rolls_back_after_the_apiserver_was_paused(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    node: NodeHarness,
    apiserver: int,
) -> None:
    daemon = node.daemon
    [claim] = allocated_claims(kube, namespace, pool, 1, prefix="sweep")
    # The exchange fails and so does the revocation meant to undo the mint: the entry
    # stays open for the sweep.
    fake.admin.add_fault(EXCHANGE, method="POST", status=503)
    fake.admin.add_fault(UNENROLL, method="DELETE", status=503)
    answer = dra_prepare(daemon, [claim])[claim.uid]
    assert "Thunder exchange failed" in answer.error
    assert len(daemon.journal_entries()) == 1
    before = daemon.metrics().get(SWEEP_ERRORS, 0.0)

    os.kill(apiserver, signal.SIGSTOP)
    try:
        # Thunder answers again; only the API server is gone. The rollback needs it (the
        # attempt's Client record is looked up before the entry is closed).
        fake.admin.clear_faults()
        wait_for(
            lambda: daemon.metrics().get(SWEEP_ERRORS, 0.0) >= before + 2,
            "the sweep to count failed passes while the API server is paused",
            timeout=120,
        )
        assert daemon.running()
        assert len(daemon.journal_entries()) == 1
        assert daemon.http("/healthz")[0] == 200
        assert max(_sweep_failures(node)) >= 2  # backing off, not giving up
    finally:
        os.kill(apiserver, signal.SIGCONT)

    wait_for(lambda: daemon.journal_entries() == [], "the sweep to roll the entry back", 120)
    assert fake.admin.audit()["leaks"] == []
    assert live_clients(fake, pool.zone_id) == []

    # And the daemon still serves the kubelet.
    answer = dra_prepare(daemon, [claim])[claim.uid]
    assert answer.error == ""
    assert dra_unprepare(daemon, [claim])[claim.uid].error == ""
    assert fake.admin.audit()["leaks"] == []
    assert live_clients(fake, pool.zone_id) == []
