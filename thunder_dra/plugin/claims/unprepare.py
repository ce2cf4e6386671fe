"""Unpreparing one claim: revoke and remove everything prepare made; missing is not an error.

The checkpoint entry is first marked ``unpreparing`` (so a prepare that races a crashed
unprepare knows the files and the enrollment are no longer to be trusted), then, in two
stages whose steps are independent and run at once:

1. unenroll the token and decommission the client (thunder-api.md 2.7, 2.8), and delete
   the CDI spec, the claim's directory and a VM's Secret (the files are unlinked while the
   revocations are in flight, without the directories' fsyncs);
2. delete the ``Client`` record, the last trace of the claim outside the checkpoint (a
   lost checkpoint is rebuilt from the records), and drop the entry last, by a
   checkpoint write that first fsyncs the two directories, so the removals survive a
   power loss before the entry is gone. Until the drop, the entry is marked, so a
   restart after a power loss that brought a removed file back removes it again.

A stage starts only when the one before it completed; a failed step fails the claim
after its stage's other steps ran (so a file that cannot be removed never keeps the
enrollment from being revoked), and leaves the entry marked for the retry.
Every step is idempotent, so a crash anywhere is finished by the kubelet's next call or
by the daemon's start-up.

The kubelet's answer waits for the mark and stage 1 (:meth:`Unpreparer.release`): an
unprepare that answers success has revoked the enrollment and removed every file and the
Secret, and one that fails says which step failed. Stage 2 (:meth:`Unpreparer.forget`)
follows the answer (:class:`thunder_dra.plugin.kubelet.handler.ClaimService`): by then the
record names an enrollment that is revoked, so it holds nothing left to revoke, and the
entry, still marked, has every later call of the claim, the sweep and the start-up
finish it.

A claim this daemon has no checkpoint entry for (a previous instance's state was lost,
say) is still cleaned when a ``Client`` record on this node names it.
"""

from __future__ import annotations

import logging

from thunder_dra.api import ConsumerKind
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.claims.rollback import Undo
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.clientconfig import remove_claim_dir
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import CheckpointStore, ClaimRef, ClaimState, PreparedClaim
from thunder_dra.plugin.state.crashpoints import CrashPoints, Step
from thunder_dra.thunder import ThunderError

log = logging.getLogger(__name__)


class Unpreparer:
    def __init__(
        self,
        *,
        node_name: str,
        checkpoint: CheckpointStore,
        records: Records,
        undo: Undo,
        crash: CrashPoints,
    ) -> None:
        self._node = node_name
        self._checkpoint = checkpoint
        self._records = records
        self._undo = undo
        self._crash = crash

    async def unprepare(self, ref: ClaimRef) -> PreparedClaim | None:
        """What the kubelet's answer waits for: the claim revoked and its files removed.
        Returns the entry whose record and checkpoint entry are still to go
        (:meth:`forget`), or None when nothing is left."""
        prepared = self._checkpoint.current.claims.get(ref.uid)
        if prepared is None:
            await self.clean_unknown(ref)
            return None
        return await self.release(prepared)

    async def finish(self, prepared: PreparedClaim) -> None:
        """Complete the unprepare of a checkpointed claim, both stages (start-up, the
        sweep, a prepare that finds the claim's unprepare unfinished)."""
        await self.forget(await self.release(prepared))

    async def release(self, prepared: PreparedClaim) -> PreparedClaim:
        """Mark the entry, then stage 1; returns the marked entry."""
        if prepared.state is not ClaimState.UNPREPARING:
            prepared = prepared.model_copy(update={"state": ClaimState.UNPREPARING})
            await self._checkpoint.put(prepared)
            self._crash.reached("unprepare:marked")
        steps: list[Step] = [
            (self._unenroll(prepared.enrollment_token_id), "unprepare:token-revoked"),
            (self._revoke_client(prepared.client_id), "unprepare:client-revoked"),
            # Removed while the revocations are in flight, on the event loop and without
            # the directories' fsyncs: stage 2 makes them durable before it drops the
            # entry, and until then the entry, marked, has a restart remove them again.
            (self._undo.cdi.remove(prepared.uid, durable=False), "unprepare:cdi-removed"),
            (
                remove_claim_dir(self._undo.layout.directory(prepared.uid), durable=False),
                "unprepare:claim-dir-removed",
            ),
        ]
        if prepared.consumer.kind == "vm":
            secret = self._records.delete_guest_secret(
                prepared.namespace, prepared.name, prepared.uid
            )
            steps.append((secret, "unprepare:secret-removed"))
        try:
            await self._crash.together(*steps)
        except ThunderError as err:
            # The revocations come first among the steps, so their error is the one raised.
            raise ClaimError(
                f"Thunder revocation failed: {err}", ErrorReason.THUNDER_REVOKE
            ) from None
        return prepared

    async def forget(self, prepared: PreparedClaim) -> None:
        """Stage 2 of a released claim (:meth:`release`): its record, then its entry,
        once the removals of stage 1 are durable."""
        await self._records.delete_client(prepared.namespace, prepared.uid)
        self._crash.reached("unprepare:client-removed")
        # The write that drops the entry first fsyncs the directories stage 1 removed from.
        await self._checkpoint.drop(
            prepared.uid, synced_first=(self._undo.cdi.cdi_dir, self._undo.layout.claims_dir)
        )
        self._crash.reached("unprepare:checkpoint-dropped")
        log.info(
            "claim unprepared",
            extra={
                "claim_uid": prepared.uid,
                "namespace": prepared.namespace,
                "claim": prepared.name,
            },
        )

    async def _unenroll(self, token_id: str | None) -> None:
        if token_id:
            await self._undo.thunder.unenroll(token_id)

    async def _revoke_client(self, client_id: str | None) -> None:
        if client_id:
            await self._undo.thunder.revoke_client(client_id)

    async def clean_unknown(self, ref: ClaimRef) -> None:
        """Revoke and remove a claim the checkpoint does not hold, from its ``Client``
        record on this node (if any); also used for records a lost checkpoint left."""
        record = await self._records.get_client(ref.namespace, ref.uid)
        ours = (
            record is not None
            and record.spec.node_name == self._node
            and record.spec.claim.uid == ref.uid
        )
        if record is not None and ours:
            log.warning(
                "unpreparing a claim missing from the checkpoint, from its Client record",
                extra={"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name},
            )
            try:
                await self._undo.revoke(record.spec.enrollment_token_id or None, record.client_id)
            except ThunderError as err:
                raise ClaimError(
                    f"Thunder revocation failed: {err}", ErrorReason.THUNDER_REVOKE
                ) from None
        await self._undo.remove_claim_files(ref.uid)
        if record is not None and ours:
            if record.spec.consumer_kind is ConsumerKind.VIRTUAL_MACHINE:
                await self._records.delete_guest_secret(ref.namespace, ref.name, ref.uid)
            await self._records.delete_client(ref.namespace, ref.uid)
