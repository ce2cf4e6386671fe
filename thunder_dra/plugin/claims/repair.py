"""Claims already prepared: restore what is missing, so a repeated prepare gets the same answer.

Run for every prepared claim at start-up and again whenever the kubelet prepares a claim
the checkpoint already holds (then the ``Client`` record is checked right after the
answer, :meth:`Repairer.restore_record`: the kubelet's answer never depends on it, and a
claim enrolled before binding is prepared by the kubelet with files only):

- the CDI spec is rewritten from the checkpoint when missing (``/var/run/cdi`` is a
  tmpfs, emptied by a reboot);
- a cached ``libthunder.so`` that went missing is fetched again by its digest;
- a missing ``Client`` record is re-created from the checkpoint, and one still
  ``Pending`` (its status is written after the kubelet's answer) is set ``Enrolled``;
- a missing ``config.json`` cannot be rebuilt (its credential exists nowhere else), so
  the claim is enrolled again: the old enrollment is revoked first, then a new one is
  minted, exchanged and recorded through the journal like any prepare. The kubelet's
  answer (devices and CDI IDs) stays the same.

A VM's claim has nothing on the node; its Secret holds a single-use token that the guest
may already have spent, so a missing Secret is reported, not re-minted.
"""

from __future__ import annotations

import logging

from thunder_dra.api import ClientPhase
from thunder_dra.kube.errors import KubeError
from thunder_dra.plugin.claims.allocation import parse_claim
from thunder_dra.plugin.claims.prepare import Preparer
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import PreparedClaim
from thunder_dra.thunder import ThunderError

log = logging.getLogger(__name__)


def _fields(prepared: PreparedClaim) -> dict[str, str]:
    return {"claim_uid": prepared.uid, "namespace": prepared.namespace, "claim": prepared.name}


class Repairer:
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer
        self.d = preparer.d

    async def repair(self, prepared: PreparedClaim, *, record: bool = True) -> PreparedClaim:
        """Restore what a prepared claim is missing on the node and, with ``record`` or
        when its record is not known to exist (``PrepareDeps.unrecorded``: its create
        failed after the commit, or a check of it failed), its ``Client`` record (else
        :meth:`restore_record` is the caller's, later)."""
        d = self.d
        if prepared.consumer.kind == "pod":
            layout = d.config.claim_layout
            if not layout.config_json(prepared.uid).is_file():
                prepared = await self._reenroll(prepared)
            library = prepared.library
            if library is not None and not library.is_file():
                library = await d.library.by_digest(library.parent.name)
            if library is not None:
                files = layout.files(prepared.uid, library)
                if not files.cdi_spec.is_file():
                    await d.cdi.write_claim(
                        prepared,
                        config_json=files.config_json,
                        libthunder=files.library,
                        preload=await self._preload_of(prepared),
                    )
                    log.info("rewrote a missing CDI spec", extra=_fields(prepared))
        elif prepared.secret_name and not await d.records.guest_secret_exists(
            prepared.namespace, prepared.name, prepared.uid
        ):
            log.warning(
                "the VM's setup Secret is gone; its single-use token cannot be re-issued "
                "without re-preparing the claim",
                extra={**_fields(prepared), "secret": prepared.secret_name},
            )
        if record or prepared.uid in d.unrecorded:
            try:
                await self._restore_record(prepared)
            except Exception:
                # Until a check succeeds, the kubelet's next prepare makes it before its
                # answer: the record may be missing (a crash between the commit and the
                # create's answer), and no pod may run on an enrollment without one.
                d.unrecorded.add(prepared.uid)
                raise
            d.unrecorded.discard(prepared.uid)
        return prepared

    async def restore_record(self, prepared: PreparedClaim, *, created: bool = False) -> None:
        """After the kubelet's answer: with ``created`` (a prepare that just wrote the
        record), set its status to ``Enrolled``; otherwise check the record and restore
        what is missing. Only while the checkpoint still holds the claim as ``prepared``
        (an unprepare, or a new enrollment, may have come first). The caller holds the
        node lock, and the claim's lock unless ``created``: the status write touches the
        record of this enrollment only."""
        current = self.d.checkpoint.current.claims.get(prepared.uid)
        if current != prepared:
            return
        if created:
            await self.d.records.mark_enrolled(prepared)
        else:
            await self._restore_record(prepared)

    async def _restore_record(self, prepared: PreparedClaim) -> None:
        d = self.d
        record = await d.records.get_client(prepared.namespace, prepared.uid)
        if record is None:
            await d.records.record_client(prepared)
            log.info("re-created a missing Client record", extra=_fields(prepared))
        elif record.status is None or record.status.phase is ClientPhase.PENDING:
            # Written, but the status after the answer was not (a crash, the API down).
            await d.records.mark_enrolled(prepared)
            log.info("set a prepared claim's Client record Enrolled", extra=_fields(prepared))

    async def _preload_of(self, prepared: PreparedClaim) -> bool:
        # Not in the checkpoint: the claim itself is the source of truth for its options.
        try:
            claim = await self.d.kube.get_claim(prepared.namespace, prepared.name)
            return parse_claim(claim, prepared.uid, self.d.config.driver_name).preload
        except (KubeError, ClaimError):
            return True

    async def _reenroll(self, prepared: PreparedClaim) -> PreparedClaim:
        """config.json is gone: revoke the old client, enroll the claim anew (same answer)."""
        d = self.d
        log.warning("config.json is missing; enrolling the claim again", extra=_fields(prepared))
        try:
            await d.undo.revoke(prepared.enrollment_token_id, prepared.client_id)
        except ThunderError as err:
            raise ClaimError(
                f"revoking the enrollment whose config.json is gone failed: {err}",
                ErrorReason.THUNDER_REVOKE,
            ) from None
        library = prepared.library
        if library is None or not library.is_file():
            library = await d.library.current()
        preload = await self._preload_of(prepared)
        return await self._preparer.enroll(prepared, preload=preload, library=library)
