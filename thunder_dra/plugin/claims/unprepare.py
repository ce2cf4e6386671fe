"""Unpreparing one claim: revoke, then remove everything prepare made; missing is not an error.

The checkpoint entry is first marked ``unpreparing`` (so a prepare that races a crashed
unprepare knows the files and the enrollment are no longer to be trusted), then:
unenroll the token and decommission the client (thunder-api.md 2.7, 2.8), delete the CDI
spec, the claim's directory, a VM's Secret and the ``Client`` record, and drop the entry
last.
Every step is idempotent, so a crash anywhere is finished by the kubelet's next call or
by the daemon's start-up.

A claim this daemon has no checkpoint entry for (a previous instance's state was lost,
say) is still cleaned when a ``Client`` record on this node names it.
"""

from __future__ import annotations

import logging

from thunder_dra.api import ConsumerKind
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.claims.rollback import Undo
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import CheckpointStore, ClaimRef, ClaimState, PreparedClaim
from thunder_dra.plugin.state.crashpoints import CrashPoints
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

    async def unprepare(self, ref: ClaimRef) -> None:
        prepared = self._checkpoint.current.claims.get(ref.uid)
        if prepared is None:
            await self.clean_unknown(ref)
            return
        await self.finish(prepared)

    async def finish(self, prepared: PreparedClaim) -> None:
        """Complete the unprepare of a checkpointed claim (also used at start-up)."""
        if prepared.state is not ClaimState.UNPREPARING:
            prepared = prepared.model_copy(update={"state": ClaimState.UNPREPARING})
            await self._checkpoint.put(prepared)
            self._crash.reached("unprepare:marked")
        try:
            if prepared.enrollment_token_id:
                await self._undo.thunder.unenroll(prepared.enrollment_token_id)
            self._crash.reached("unprepare:token-revoked")
            if prepared.client_id:
                await self._undo.thunder.revoke_client(prepared.client_id)
            self._crash.reached("unprepare:client-revoked")
        except ThunderError as err:
            raise ClaimError(
                f"Thunder revocation failed: {err}", ErrorReason.THUNDER_REVOKE
            ) from None
        await self._undo.cdi.remove(prepared.uid)
        self._crash.reached("unprepare:cdi-removed")
        await self._undo.remove_claim_files(prepared.uid)
        self._crash.reached("unprepare:claim-dir-removed")
        if prepared.consumer.kind == "vm":
            await self._records.delete_guest_secret(prepared.namespace, prepared.name, prepared.uid)
            self._crash.reached("unprepare:secret-removed")
        await self._records.delete_client(prepared.namespace, prepared.uid)
        self._crash.reached("unprepare:client-removed")
        await self._checkpoint.drop(prepared.uid)
        self._crash.reached("unprepare:checkpoint-dropped")
        log.info(
            "claim unprepared",
            extra={
                "claim_uid": prepared.uid,
                "namespace": prepared.namespace,
                "claim": prepared.name,
            },
        )

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
            client_id = record.status.client_id if record.status else None
            log.warning(
                "unpreparing a claim missing from the checkpoint, from its Client record",
                extra={"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name},
            )
            try:
                await self._undo.revoke(record.spec.enrollment_token_id or None, client_id)
            except ThunderError as err:
                raise ClaimError(
                    f"Thunder revocation failed: {err}", ErrorReason.THUNDER_REVOKE
                ) from None
        await self._undo.remove_claim_files(ref.uid)
        if record is not None and ours:
            if record.spec.consumer_kind is ConsumerKind.VIRTUAL_MACHINE:
                await self._records.delete_guest_secret(ref.namespace, ref.name, ref.uid)
            await self._records.delete_client(ref.namespace, ref.uid)
