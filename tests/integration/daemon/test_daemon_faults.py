"""Thunder and artifact faults: what is retried, what is reported to the kubelet (clearly, per
claim), and that no failure leaks an enrollment or leaves anything staged."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    API_TOKEN,
    NodeHarness,
    Workloads,
    ZonePool,
    files_under,
    mints,
)
from hack.testbed.kube import Kube, wait_for

MINT = "/api/v1/enrollment-tokens"
EXCHANGE = "/api/v1/enrollment-tokens/enroll"
UNENROLL = "/api/v1/enrollment-tokens/*/node"


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        yield harness


@pytest.fixture(scope="module")
def pods(kube: Kube, namespace: str, pool: ZonePool) -> Workloads:
    return Workloads(kube, namespace, pool)


@pytest.fixture(autouse=True)
def no_faults_left(fake: FakeThunderProcess) -> Iterator[None]:
    yield
    fake.admin.clear_faults()
    fake.admin.set_switches(corruptLibrary=False)


def _retries(node: NodeHarness, method: str, endpoint: str, reason: str) -> float:
    labels = f'endpoint="{endpoint}",method="{method}",reason="{reason}"'
    key = f"thunder_dra_thunder_api_retries_total{{{labels}}}"
    return node.daemon.metrics().get(key, 0.0)


def _kubelet_error(node: NodeHarness, claim_hint: str, text: str) -> str:
    def found() -> str | None:
        for error in node.kubelet.errors:
            if claim_hint in error and text in error:
                return error
        return None

    return wait_for(found, f"a prepare error with {text!r}", timeout=60)


def _run_and_remove(node: NodeHarness, pods: Workloads, name: str) -> None:
    pods.wait_running(node, name)
    pods.delete(name)
    pods.wait_gone(node, name)


@pytest.mark.parametrize(
    ("method", "path", "status", "endpoint", "reason"),
    [
        ("POST", MINT, 429, MINT, "429"),
        ("POST", EXCHANGE, 503, EXCHANGE, "503"),
        ("POST", EXCHANGE, 429, EXCHANGE, "429"),
    ],
)
def test_transient_thunder_errors_are_retried_inside_one_prepare(
    fake: FakeThunderProcess,
    node: NodeHarness,
    pods: Workloads,
    method: str,
    path: str,
    status: int,
    endpoint: str,
    reason: str,
) -> None:
    before = _retries(node, method, endpoint, reason)
    errors_before = len(node.kubelet.errors)
    fake.admin.add_fault(path, method=method, status=status, times=2)
    name, _ = pods.create(node)
    _run_and_remove(node, pods, name)
    assert _retries(node, method, endpoint, reason) == before + 2
    assert node.kubelet.errors[errors_before:] == []
    assert fake.admin.leaks() == []


def test_a_timed_out_revocation_is_retried(
    fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    before = _retries(
        node, "DELETE", "/api/v1/enrollment-tokens/{enrollmentTokenId}/node", "timeout"
    )
    name, _ = pods.create(node)
    pods.wait_running(node, name)
    # Longer than the daemon's 2 s request timeout (--thunder-timeout), once.
    fake.admin.add_fault(UNENROLL, method="DELETE", latency_ms=3000, times=1)
    pods.delete(name)
    pods.wait_gone(node, name)
    after = _retries(
        node, "DELETE", "/api/v1/enrollment-tokens/{enrollmentTokenId}/node", "timeout"
    )
    assert after == before + 1
    assert fake.admin.leaks() == []


@pytest.mark.parametrize(
    ("path", "fault", "message"),
    [
        (MINT, {"status": 503}, "Thunder mint failed: Thunder API POST /api/v1/enrollment-tokens"),
        (EXCHANGE, {"status": 503}, "Thunder exchange failed: Thunder API POST "),
        (EXCHANGE, {"latency_ms": 3000}, "Thunder exchange failed: "),
        (EXCHANGE, {"status": 502, "after": True, "times": 1}, "enrollment token already used"),
    ],
)
def test_persistent_thunder_failures_are_reported_per_claim_and_leak_nothing(
    fake: FakeThunderProcess,
    node: NodeHarness,
    pods: Workloads,
    path: str,
    fault: dict[str, object],
    message: str,
) -> None:
    fake.admin.add_fault(path, method="POST", **fault)  # type: ignore[arg-type]
    name, _ = pods.create(node)
    claim_name, _ = pods.claim_of(name)
    error = _kubelet_error(node, f"claim {pods.namespace}/{claim_name}: ", message)
    if "status" in fault and "after" not in fault:
        assert f" {fault['status']} " in error
    fake.admin.clear_faults()
    # The kubelet's next try succeeds; every failed attempt before it was rolled back.
    pods.wait_running(node, name)
    assert fake.admin.leaks() == []
    assert fake.admin.audit()["orphanClients"] == []
    assert node.daemon.journal_entries() == []
    pods.delete(name)
    pods.wait_gone(node, name)
    assert fake.admin.leaks() == []


def test_a_lost_mint_answer_is_reported_as_unrevocable(
    fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    # Thunder minted, but the answer never arrived: the API cannot list tokens, so this is
    # the one enrollment the daemon cannot undo. It must fail the claim and say so.
    fake.admin.add_fault(MINT, method="POST", status=503, after=True, times=1)
    name, _ = pods.create(node)
    claim_name, claim_uid = pods.claim_of(name)
    _kubelet_error(node, f"claim {pods.namespace}/{claim_name}: ", "Thunder mint failed")
    wait_for(
        lambda: any(
            r.get("message", "").startswith("a mint was started but its token ID never came back")
            and r.get("claim_uid") == claim_uid
            for r in node.daemon.log_records()
        ),
        "the unrevocable mint reported",
    )
    _run_and_remove(node, pods, name)
    [leak] = fake.admin.leaks()
    assert leak["state"] == "unspent"
    # Cleaned up by hand, as an operator would from the log line.
    response = httpx.delete(
        f"{fake.base_url}/api/v1/enrollment-tokens/{leak['enrollmentTokenId']}/node",
        headers={"Authorization": f"Bearer {API_TOKEN}"},
    )
    assert response.status_code == 200
    assert fake.admin.leaks() == []


def test_a_corrupted_libthunder_is_refused_and_nothing_is_staged(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, pods: Workloads
) -> None:
    # A node of its own: its library cache is empty, so the download really happens.
    with NodeHarness(kube, fake, zone=pool.zone) as fresh:
        fresh.daemon.start().wait_serving()
        fake.admin.set_switches(corruptLibrary=True)
        writes_before = len(fake.admin.writes())
        name, _ = pods.create(fresh)
        claim_name, claim_uid = pods.claim_of(name)
        error = _kubelet_error(
            fresh, f"claim {pods.namespace}/{claim_name}: ", "libthunder.so digest mismatch"
        )
        assert "does not match the pinned" in error
        assert mints(fake, writes_before) == []
        assert not list(files_under(fresh.daemon.cdi_dir))
        assert not (fresh.daemon.state_dir / "claims" / claim_uid).exists()
        assert not list(files_under(fresh.daemon.state_dir / "libthunder"))
        metrics = fresh.daemon.metrics()
        assert (
            metrics['thunder_dra_daemon_errors_total{operation="prepare",reason="libthunder"}'] >= 1
        )

        fake.admin.set_switches(corruptLibrary=False)
        _run_and_remove(fresh, pods, name)
    assert fake.admin.leaks() == []


def test_a_rollback_that_fails_is_finished_by_the_sweep(
    fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    # The exchange fails and so does the revocation meant to undo the mint: the journal
    # entry stays open until Thunder answers again, then the sweep revokes the token.
    fake.admin.add_fault(EXCHANGE, method="POST", status=503)
    fake.admin.add_fault(UNENROLL, method="DELETE", status=503)
    name, _ = pods.create(node)
    claim_name, _ = pods.claim_of(name)
    _kubelet_error(node, f"claim {pods.namespace}/{claim_name}: ", "Thunder exchange failed")
    wait_for(lambda: node.daemon.journal_entries() != [], "an entry left open")
    assert fake.admin.leaks(), "the unrevoked token is visible until the sweep"
    fake.admin.clear_faults()
    wait_for(lambda: node.daemon.journal_entries() == [], "the sweep rolled it back")
    _run_and_remove(node, pods, name)
    assert fake.admin.leaks() == []
