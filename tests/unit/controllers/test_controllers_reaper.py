"""The reaper's decision for one Client, from its claim and the grace period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from thunder_dra.api.client import Client
from thunder_dra.controllers.reaper import Verdict, decide

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=5)
UID = "claim-uid-1"


def client(
    *, orphaned_since: datetime | None = None, deleting: bool = False, finalizer: bool = True
) -> Client:
    body: dict[str, Any] = {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "client-uid",
            "finalizers": ["thundercompute.com/client-cleanup"] if finalizer else [],
        },
        "spec": {
            "claim": {"namespace": "ns", "name": "gpu", "uid": UID},
            "nodeName": "n1",
            "zone": {"name": "z", "id": "zone-1"},
            "gpuType": "A6000",
            "gpuCount": 1,
            "enrollmentTokenId": "et-1",
        },
        "status": {"phase": "Enrolled"},
    }
    if orphaned_since is not None:
        body["status"]["orphanedSince"] = orphaned_since.isoformat()
    if deleting:
        body["metadata"]["deletionTimestamp"] = NOW.isoformat()
    return Client.model_validate(body)


def test_a_client_whose_claim_exists_is_left_alone() -> None:
    assert decide(client(), UID, NOW, GRACE).verdict is Verdict.NOTHING


def test_a_missing_claim_starts_the_grace_period() -> None:
    decision = decide(client(), None, NOW, GRACE)
    assert decision.verdict is Verdict.MARK_ORPHANED
    assert decision.remaining == GRACE


def test_a_claim_with_another_uid_counts_as_gone() -> None:
    assert decide(client(), "other-uid", NOW, GRACE).verdict is Verdict.MARK_ORPHANED


def test_the_grace_period_counts_from_the_recorded_time() -> None:
    waiting = decide(client(orphaned_since=NOW - timedelta(minutes=2)), None, NOW, GRACE)
    assert waiting.verdict is Verdict.WAIT
    assert waiting.remaining == timedelta(minutes=3)
    due = decide(client(orphaned_since=NOW - GRACE), None, NOW, GRACE)
    assert due.verdict is Verdict.REVOKE


def test_a_claim_that_comes_back_clears_the_record() -> None:
    decision = decide(client(orphaned_since=NOW - timedelta(hours=1)), UID, NOW, GRACE)
    assert decision.verdict is Verdict.CLEAR_ORPHANED


def test_deletion_is_held_while_the_claim_exists() -> None:
    assert decide(client(deleting=True), UID, NOW, GRACE).verdict is Verdict.HELD


def test_a_deleted_client_whose_claim_is_gone_is_revoked_after_the_grace_period() -> None:
    deleting = client(deleting=True, orphaned_since=NOW - GRACE - timedelta(seconds=1))
    assert decide(deleting, None, NOW, GRACE).verdict is Verdict.REVOKE


def test_a_client_released_by_someone_else_is_not_touched() -> None:
    released = client(deleting=True, finalizer=False)
    assert decide(released, None, NOW, GRACE).verdict is Verdict.NOTHING
