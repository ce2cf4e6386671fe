"""Undoing enrollments: unprepare's cleanup and the mint journal's rollback (thunder-api.md 7.3).

Every undo is safe to repeat: revocations accept 404/410, deletions accept "already gone",
so a crash half-way through is finished by simply running it again.

Rolling back an open journal entry (at start-up, after a failed prepare, or for a dead
daemon instance's journal):

- an entry whose claim is committed in the checkpoint *file* with the entry's token ID
  (:attr:`CheckpointStore.durable`: a change whose write failed does not count), or a
  node enrollment recorded in ``node-enrollment.json`` with it, succeeded: it is closed;
- an entry without a token ID cannot be undone (the API cannot list tokens): it is closed
  and reported, once, as an unrevocable mint; the code keeps that window to one write;
- otherwise the token and the client are revoked (thunder-api.md 2.7, 2.8), and what the
  attempt may have made is removed: the claim's files when no other attempt committed the
  claim, ``config.json`` when it holds another client than the committed claim's (the
  attempt's, whether or not its ID reached the journal), the ``Client`` record and the
  VM Secret when they name the attempt's token. Then the entry is closed.

A Thunder failure leaves the entry open for the next sweep.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.files.cdi import CdiSpecStore
from thunder_dra.plugin.files.clientconfig import (
    ClientConfigError,
    read_client_config,
    remove_claim_dir,
)
from thunder_dra.plugin.files.layout import ClaimLayout
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.plugin.node.enrollment import NodeEnrollmentView
from thunder_dra.plugin.state.checkpoint import CheckpointStore
from thunder_dra.plugin.state.journal import JournalEntry, MintJournal, MintPurpose
from thunder_dra.thunder import (
    ThunderAPIError,
    ThunderClient,
    ThunderError,
    ThunderResponseError,
    ThunderTransportError,
)

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"
    UNREVOCABLE = "unrevocable"
    NOTHING_MINTED = "nothing-minted"


def nothing_minted(err: ThunderError) -> bool:
    """Whether a failed mint certainly created nothing: Thunder refused it (4xx, 429
    included), or the request never left the node. A 5xx, a timeout or a dropped
    connection may come after Thunder minted."""
    if isinstance(err, ThunderAPIError):
        return 400 <= err.status < 500
    if isinstance(err, ThunderTransportError):
        return not err.request_sent
    return False


class Undo:
    def __init__(
        self,
        *,
        thunder: ThunderClient,
        cdi: CdiSpecStore,
        layout: ClaimLayout,
        records: Records,
        checkpoint: CheckpointStore,
        metrics: DaemonMetrics,
    ) -> None:
        self.thunder = thunder
        self.cdi = cdi
        self.layout = layout
        self.records = records
        self.checkpoint = checkpoint
        self.metrics = metrics
        self.node: NodeEnrollmentView | None = None

    async def revoke(self, token_id: str | None, client_id: str | None) -> None:
        """Unenroll the token, then decommission the client (thunder-api.md 2.7, 2.8); gone is
        fine."""
        if token_id:
            await self.thunder.unenroll(token_id)
        if client_id:
            await self.thunder.revoke_client(client_id)

    async def remove_claim_files(self, claim_uid: str) -> None:
        await self.cdi.remove(claim_uid)
        await remove_claim_dir(self.layout.directory(claim_uid))

    async def _config_client_id(self, claim_uid: str) -> str | None:
        try:
            config = await read_client_config(self.layout.directory(claim_uid))
        except (FileNotFoundError, ClientConfigError):
            return None
        return config.client_id

    async def settle_failed_mint(
        self, journal: MintJournal, entry: JournalEntry, err: ThunderError
    ) -> None:
        """Write down what a failed mint is known to have done: the token ID Thunder sent
        with an unusable answer (so it is revoked), or nothing at all (entry closed)."""
        created = err.created_id if isinstance(err, ThunderResponseError) else None
        if created:
            await journal.record_token_id(entry.entry_id, created)
        elif nothing_minted(err):
            await journal.close(entry.entry_id)
            self.metrics.rollbacks.labels(Outcome.NOTHING_MINTED.value).inc()

    async def roll_back(self, journal: MintJournal, entry: JournalEntry) -> Outcome:
        """Resolve one open entry (see the module docstring); raises if Thunder fails."""
        outcome = await self._resolve(entry)
        await journal.close(entry.entry_id)
        self.metrics.rollbacks.labels(outcome.value).inc()
        return outcome

    async def _resolve(self, entry: JournalEntry) -> Outcome:
        token_id = entry.enrollment_token_id
        fields = {
            "entry": entry.entry_id,
            "purpose": entry.purpose.value,
            "claim_uid": entry.claim_uid,
            "enrollment_token_id": token_id,
        }
        if token_id and self._committed(entry):
            return Outcome.COMMITTED
        if not token_id:
            log.error(
                "a mint was started but its token ID never came back; if Thunder minted it, "
                "that enrollment cannot be revoked from here",
                extra={**fields, "started_at": entry.created_at.isoformat()},
            )
            return Outcome.UNREVOCABLE
        await self.revoke(token_id, entry.client_id)
        if entry.purpose is MintPurpose.NODE_ENROLLMENT:
            if self.node is not None:
                self.node.on_rolled_back()
        elif entry.claim_uid:
            await self._remove_attempt(entry, token_id)
        log.info("rolled back an unfinished enrollment", extra=fields)
        return Outcome.ROLLED_BACK

    def _committed(self, entry: JournalEntry) -> bool:
        if entry.purpose is MintPurpose.NODE_ENROLLMENT:
            current = self.node.current_token_id() if self.node is not None else None
            return current == entry.enrollment_token_id
        prepared = self.checkpoint.durable.claims.get(entry.claim_uid or "")
        return prepared is not None and prepared.enrollment_token_id == entry.enrollment_token_id

    async def _remove_attempt(self, entry: JournalEntry, token_id: str) -> None:
        uid = entry.claim_uid or ""
        committed = self.checkpoint.durable.claims.get(uid)
        if committed is None:
            await self.remove_claim_files(uid)
        elif await self._config_client_id(uid) not in (None, committed.client_id):
            # A re-enrollment of a committed claim wrote a config of its own (this revoked
            # client's, its ID journaled or not yet): remove it, so the next prepare of
            # the claim enrolls it again.
            await remove_claim_dir(self.layout.directory(uid))
        if entry.claim_namespace:
            await self.records.delete_client(entry.claim_namespace, uid, only_token_id=token_id)
            if entry.purpose is MintPurpose.VM and entry.claim_name:
                await self.records.delete_guest_secret(
                    entry.claim_namespace, entry.claim_name, uid, only_token_id=token_id
                )
