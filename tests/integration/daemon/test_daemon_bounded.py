"""Bounded work per kubelet call: one NodePrepareResources call carrying 300 claims, through
the real daemon process. Every claim is prepared, no more than ``--claim-concurrency``
claims are ever worked on at once, the zone list is read once for the whole call, and the
daemon stays within its memory limit (its peak RSS is printed for docs/benchmarks.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    live_clients,
)
from hack.testbed.kube import Kube
from thunder_dra.plugin.claims.allocation import ZONE_ID_TTL

CLAIMS = 300
BOUND = 8
MEMORY_LIMIT_MIB = 512  # the DaemonSet's default memory limit
MINT = "/api/v1/enrollment-tokens"


@pytest.fixture
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(
        kube, fake, zone=pool.zone, extra_args=["--claim-concurrency", str(BOUND)]
    ) as harness:
        yield harness


def _sum(metrics: dict[str, float], family: str, *labels: str) -> float:
    return sum(
        value
        for key, value in metrics.items()
        if key.startswith(family + "{") and all(label in key for label in labels)
    )


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


def test_a_call_with_300_claims_runs_with_bounded_concurrency_and_one_zone_list(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    node: NodeHarness,
) -> None:
    claims = allocated_claims(kube, namespace, pool, CLAIMS, prefix="many")
    daemon_started = time.monotonic()
    daemon = node.daemon.start()
    daemon.wait_serving()
    assert daemon.process is not None
    # Every mint takes a while, so the claims really overlap and the bound is reached.
    fake.admin.add_fault(MINT, method="POST", latency_ms=40)
    try:
        started = time.monotonic()
        answers = dra_prepare(daemon, claims, timeout=600)
        elapsed = time.monotonic() - started
    finally:
        fake.admin.clear_faults()

    errors = {c.name: answers[c.uid].error for c in claims if answers[c.uid].error}
    assert errors == {}
    for claim in claims:
        [device] = answers[claim.uid].devices
        assert list(device.cdi_device_ids) == [f"thundercompute.com/gpu=claim-{claim.uid}"]
    assert len(live_clients(fake, pool.zone_id)) == CLAIMS

    metrics = daemon.metrics()
    assert metrics["thunder_dra_daemon_claim_concurrency_limit"] == BOUND
    assert metrics["thunder_dra_daemon_claims_in_flight_peak"] == BOUND
    assert metrics["thunder_dra_daemon_claims_in_flight"] == 0
    zone_lists = _sum(
        metrics,
        "thunder_dra_thunder_api_requests_total",
        'endpoint="/api/v1/zones"',
        'method="GET"',
    )
    # One list answers the whole call; only a call that outlives the zone-ID cache (a
    # loaded machine) may read it again, once per cache lifetime.
    lifetime = time.monotonic() - daemon_started
    assert 1 <= zone_lists <= 1 + int(lifetime // ZONE_ID_TTL), (zone_lists, lifetime)
    mints = _sum(
        metrics, "thunder_dra_thunder_api_requests_total", f'endpoint="{MINT}"', 'method="POST"'
    )
    assert mints == CLAIMS

    rss = _peak_rss_mib(daemon.process.pid)
    print(f"\n{CLAIMS} claims in one call, bound {BOUND}: {elapsed:.1f} s, peak RSS {rss:.0f} MiB")
    assert rss < MEMORY_LIMIT_MIB

    answers = dra_unprepare(daemon, claims, timeout=600)
    assert {c.name: answers[c.uid].error for c in claims if answers[c.uid].error} == {}
    assert daemon.metrics()["thunder_dra_daemon_claims_in_flight_peak"] == BOUND
    assert live_clients(fake, pool.zone_id) == []
    audit = fake.admin.audit()
    assert audit["leaks"] == []
    assert audit["orphanClients"] == []
