"""The Client reaper: revoke enrollments whose ResourceClaim is gone.

Described in docs/operator.md#client-cleanup.

The daemon records a `Client` (finalizer `thundercompute.com/client-cleanup`) for every
enrollment it makes and removes it at unprepare. When that never happens (the node
died, the daemon was removed), the Client outlives its claim and the Thunder
enrollment leaks. The reaper finds such Clients: the claim named by `spec.claim` is
missing, or exists with another UID (a new claim reusing the name).

- First seen orphaned: `status.orphanedSince` is set to now. It is stored on the object,
  so an operator restart does not restart the grace period.
- The claim is back (same UID): `orphanedSince` is cleared.
- Orphaned for `orphanGracePeriod`: the enrollment is revoked in Thunder
  (thunder-api.md 2.7 with the token ID, and 2.8 with the client ID; 404/410 count as
  done), the Client is marked Revoked, deleted, and the finalizer removed.
- A Client being deleted by a user while its claim still exists keeps its finalizer:
  the enrollment is still in use, and removing the record would leave it with nothing
  to revoke it later. It stays Terminating until the claim goes (then the daemon, or
  the reaper after the grace period, revokes it). The seed's troubleshooting table
  describes exactly this.

A revocation that fails (Thunder down) is recorded in `status.message` and a Warning
event, and tried again on the next reaper pass.

Only enrollments this driver recorded are revoked. Anyone allowed to create a Client
could name another tenant's enrollment token ID in it, so before revoking, the reaper
checks the Client's provenance signature (`thunder_dra.kube.provenance`: an HMAC the
daemon computes over the namespace, name, claim UID, token ID and client ID with a key
derived from the Thunder API token). A Client without a valid one is not revoked: the
reaper posts a Warning event (`NotRecordedByDriver`), deletes the record and drops its
finalizer, and counts it as `unverified` in `thunder_dra_operator_clients_reaped_total`.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from thunder_dra.api.client import Client, ClientPhase
from thunder_dra.api.constants import CLIENT_FINALIZER
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.objects import ClaimIndex
from thunder_dra.controllers.shared.status import utcnow
from thunder_dra.kube import bodies
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError, NotFound
from thunder_dra.kube.events import EventRecorder, ObjectRef
from thunder_dra.kube.provenance import ANNOTATION, ProvenanceKey
from thunder_dra.kube.resources import CLIENTS
from thunder_dra.thunder import ThunderClient, ThunderError

_log = logging.getLogger(__name__)


class Verdict(StrEnum):
    NOTHING = "nothing"
    MARK_ORPHANED = "mark-orphaned"
    CLEAR_ORPHANED = "clear-orphaned"
    WAIT = "wait"
    REVOKE = "revoke"
    HELD = "held"
    """Deletion requested while the claim exists: the finalizer keeps holding it."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    remaining: timedelta = timedelta(0)


def decide(client: Client, claim_uid: str | None, now: datetime, grace: timedelta) -> Decision:
    """What to do with `client`, whose claim currently has `claim_uid` (None: no claim)."""
    orphaned_since = client.status.orphaned_since if client.status else None
    being_deleted = client.metadata.deletion_timestamp is not None
    if being_deleted and CLIENT_FINALIZER not in client.metadata.finalizers:
        return Decision(Verdict.NOTHING)
    if claim_uid is not None and claim_uid == client.spec.claim.uid:
        if orphaned_since is not None:
            return Decision(Verdict.CLEAR_ORPHANED)
        return Decision(Verdict.HELD if being_deleted else Verdict.NOTHING)
    if orphaned_since is None:
        return Decision(Verdict.MARK_ORPHANED, grace)
    remaining = orphaned_since + grace - now
    if remaining > timedelta(0):
        return Decision(Verdict.WAIT, remaining)
    return Decision(Verdict.REVOKE)


@dataclass(slots=True)
class ReaperPass:
    """What one reaper pass saw and did; `next_check` is the soonest deadline."""

    clients: int = 0
    orphaned: int = 0
    revoked: int = 0
    failed: int = 0
    unverified: int = 0
    """Orphans removed without revoking: not recorded by this driver."""
    next_check: timedelta | None = None
    phases: Counter[str] | None = None


def _ref(client: Client) -> ObjectRef:
    return ObjectRef(
        api_version=client.api_version,
        kind=client.kind,
        name=client.metadata.name,
        uid=client.metadata.uid or "",
        namespace=client.metadata.namespace,
    )


def recorded_by_driver(client: Client, provenance: ProvenanceKey) -> bool:
    """Whether the daemon of this driver signed `client` as it stands."""
    return provenance.verify(
        client.metadata.annotations.get(ANNOTATION),
        namespace=client.metadata.namespace or "",
        name=client.metadata.name,
        claim_uid=client.spec.claim.uid,
        enrollment_token_id=client.spec.enrollment_token_id,
        client_id=client.client_id,
    )


def _timestamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class Reaper:
    """Runs reaper passes against the API server and Thunder."""

    def __init__(self, kube: KubeClient, events: EventRecorder, metrics: OperatorMetrics) -> None:
        self._kube = kube
        self._events = events
        self._metrics = metrics
        self._held_reported: set[str] = set()

    async def run_pass(
        self,
        clients: Sequence[Mapping[str, Any]],
        claims: ClaimIndex,
        grace: timedelta,
        thunder: ThunderClient | None,
        provenance: ProvenanceKey | None,
    ) -> ReaperPass:
        """Decide and act for every Client.

        `thunder` None means revocation must wait; `provenance` (derived from the same API
        token) tells the driver's own records from others, and None makes revocation wait.
        """
        result = ReaperPass(phases=Counter())
        now = utcnow()
        for raw in clients:
            try:
                client = Client.model_validate(raw)
            except ValidationError as exc:
                name = bodies.name(raw)
                _log.warning(
                    "skipping an unreadable Client", extra={"client": name, "error": str(exc)}
                )
                continue
            result.clients += 1
            assert result.phases is not None
            result.phases[
                (client.status.phase if client.status else ClientPhase.PENDING).value
            ] += 1
            key = (client.metadata.namespace or "", client.spec.claim.name)
            decision = decide(client, claims.uids.get(key), now, grace)
            try:
                await self._act(client, decision, now, thunder, provenance, result)
            except NotFound:
                pass  # gone meanwhile: nothing left to do for it
            except KubeError as exc:
                _log.warning(
                    "client reaper write failed",
                    extra={"client": client.metadata.name, "error": str(exc)},
                )
            if decision.verdict in (Verdict.MARK_ORPHANED, Verdict.WAIT):
                result.orphaned += 1
                if result.next_check is None or decision.remaining < result.next_check:
                    result.next_check = decision.remaining
        return result

    async def _act(
        self,
        client: Client,
        decision: Decision,
        now: datetime,
        thunder: ThunderClient | None,
        provenance: ProvenanceKey | None,
        result: ReaperPass,
    ) -> None:
        meta = client.metadata
        path = CLIENTS.item(meta.name, meta.namespace, "status")
        fields = {"client": meta.name, "namespace": meta.namespace, "claim": client.spec.claim.name}
        if decision.verdict is Verdict.MARK_ORPHANED:
            await self._kube.merge_patch(path, {"status": {"orphanedSince": _timestamp(now)}})
            _log.info("client's claim is gone, grace period started", extra=fields)
            await self._events.post(
                _ref(client),
                "Normal",
                "ClaimGone",
                f"ResourceClaim {client.spec.claim.name} (uid {client.spec.claim.uid}) is gone; "
                f"the enrollment is revoked after {decision.remaining}",
            )
        elif decision.verdict is Verdict.CLEAR_ORPHANED:
            await self._kube.merge_patch(path, {"status": {"orphanedSince": None}})
            _log.info("client's claim is back, grace period cleared", extra=fields)
        elif decision.verdict is Verdict.HELD:
            if meta.uid and meta.uid not in self._held_reported:
                self._held_reported.add(meta.uid)
                _log.info("client deletion held while its claim exists", extra=fields)
                await self._events.post(
                    _ref(client),
                    "Normal",
                    "DeletionHeld",
                    f"ResourceClaim {client.spec.claim.name} still exists; the finalizer holds "
                    "this Client until its enrollment is revoked",
                )
        elif decision.verdict is Verdict.REVOKE:
            if thunder is None or provenance is None:
                result.failed += 1
                return
            if not recorded_by_driver(client, provenance):
                await self._disown(client, fields)
                result.unverified += 1
                return
            if await self._revoke(client, thunder, path, fields):
                result.revoked += 1
            else:
                result.failed += 1

    async def _revoke(
        self, client: Client, thunder: ThunderClient, status_path: str, fields: dict[str, Any]
    ) -> bool:
        token_id = client.spec.enrollment_token_id
        client_id = client.client_id
        try:
            if token_id:
                unenrolled = await thunder.unenroll(token_id)
                client_id = client_id or unenrolled.client_id
            if client_id:
                await thunder.revoke_client(client_id)
        except ThunderError as exc:
            self._metrics.clients_reaped.labels("failed").inc()
            message = f"revoking the enrollment failed, retrying: {exc}"
            _log.warning("client revocation failed", extra={**fields, "error": str(exc)})
            await self._kube.merge_patch(status_path, {"status": {"message": message[:4096]}})
            await self._events.post(_ref(client), "Warning", "RevocationFailed", message)
            return False
        revoked_at = _timestamp(utcnow())
        await self._kube.merge_patch(
            status_path,
            {
                "status": {
                    "phase": ClientPhase.REVOKED.value,
                    "revokedAt": revoked_at,
                    "message": "enrollment revoked by the operator: the claim was gone for "
                    "longer than the grace period",
                }
            },
        )
        await self._events.post(
            _ref(client),
            "Normal",
            "EnrollmentRevoked",
            f"revoked enrollment token {token_id or '-'} and client {client_id or '-'}: "
            f"ResourceClaim {client.spec.claim.name} was gone for longer than the grace period",
        )
        await self._release(client)
        self._metrics.clients_reaped.labels("revoked").inc()
        _log.info(
            "orphaned client revoked",
            extra={**fields, "enrollment_token_id": token_id, "client_id": client_id},
        )
        return True

    async def _disown(self, client: Client, fields: dict[str, Any]) -> None:
        """Remove an orphaned Client this driver did not record, revoking nothing."""
        token_id = client.spec.enrollment_token_id
        _log.warning(
            "orphaned client has no valid provenance signature; removed without revoking",
            extra={**fields, "enrollment_token_id": token_id},
        )
        await self._events.post(
            _ref(client),
            "Warning",
            "NotRecordedByDriver",
            f"this Client was not recorded by the Thunder DRA daemon (no valid {ANNOTATION} "
            f"signature), so enrollment token {token_id or '-'} is not revoked; the record "
            "is removed",
        )
        await self._release(client)
        self._metrics.clients_reaped.labels("unverified").inc()

    async def _release(self, client: Client) -> None:
        """Delete the Client (if not already) and drop the finalizer that holds it."""
        meta = client.metadata
        path = CLIENTS.item(meta.name, meta.namespace)
        if meta.deletion_timestamp is None:
            with contextlib.suppress(NotFound):
                await self._kube.delete(path)
        current = await self._kube.get_optional(path)
        if current is None:
            return
        finalizers = bodies.finalizers(current)
        if CLIENT_FINALIZER not in finalizers:
            return
        index = finalizers.index(CLIENT_FINALIZER)
        # The test makes the removal fail rather than drop another finalizer if the
        # list changed since it was read.
        await self._kube.json_patch(
            path,
            [
                {"op": "test", "path": f"/metadata/finalizers/{index}", "value": CLIENT_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"},
            ],
        )
