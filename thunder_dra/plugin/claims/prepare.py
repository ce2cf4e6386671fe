"""Preparing one claim: from its allocation to a Thunder client, files, records and a CDI spec.

The order (docs/daemon.md#preparing-a-claim), every step safe to crash after:

1. read the claim and its allocation for this driver; map the pool to Thunder's zone and
   model spellings; find the consumer (a KubeVirt virt-launcher pod means a VM; only a
   pod named as KubeVirt names them is read to find out);
2. for pods, make sure the verified ``libthunder.so`` is in the node cache *before*
   minting, so a bad download never costs an enrollment;
3. journal the mint (the entry begun while step 1's read is in flight: it needs only the
   claim's identity; a VM's claim has its purpose changed before the mint, a claim that
   fails before the mint has it closed), mint a client token (thunder-api.md 2.6), record
   its ID;
4. pods: exchange it (thunder-api.md 2.9, hostname = the pod's name); VMs: write the
   ``<claim>-thunder-setup`` Secret instead;
5. record the ``Client`` (finalizer, provenance, spec with the token and client IDs);
   its request is sent first, and for pods the client ID's journal line, the claim's
   ``config.json`` and its CDI spec are written meanwhile (none of the four depends on
   another);
6. once the files are written, commit the checkpoint, without waiting for the record's
   answer; then wait for it, close the journal entry and answer. A record that fails
   after the commit undoes the commit (the checkpoint file's earlier entry for the claim,
   or none) and the attempt is rolled back; if that write fails too, the claim stays
   committed and its next prepare re-creates the record before answering. A crash
   between the commit and the record's answer leaves a committed claim whose record the
   start-up repair re-creates;
7. after the answer, set the ``Client`` status to ``Enrolled``
   (:meth:`thunder_dra.plugin.kubelet.handler.ClaimService`): a record still ``Pending``
   holds everything its revocation needs, and the daemon's start-up repair finishes it.

Any failure rolls the attempt back through the journal (:mod:`rollback`), and the error
says which step failed. The rollback reads the entry back from disk and decides from the
checkpoint file, never from memory a failed write left behind; IDs this attempt learned
but could not journal (a disk that filled up between mint and record) are revoked too.
The enrollment token lives only in memory between mint and exchange (or until the VM's
Secret is written); it is registered with the log scrubber for that time.

A claim already in the checkpoint gets the same answer again, after :meth:`Preparer.repair`
restored what is missing: the CDI spec (e.g. ``/var/run/cdi`` emptied by a reboot), the
``Client`` record, and, when ``config.json`` is gone, the enrollment itself: the old one is
revoked and the claim enrolled anew, because the client's credential cannot be recovered.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from thunder_dra.kube import errors as kube_errors
from thunder_dra.kube.client import JSON, KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.plugin.claims.allocation import (
    PoolResolver,
    ZoneIds,
    is_virt_launcher,
    may_be_virt_launcher,
    parse_claim,
    vm_name,
)
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.claims.rollback import Undo
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.cdi import CdiError, CdiSpecStore
from thunder_dra.plugin.files.clientconfig import (
    ClientConfig,
    ClientConfigError,
    client_config_from_exchange,
    write_client_config,
)
from thunder_dra.plugin.files.guest import guest_install_script, guest_secret_name
from thunder_dra.plugin.files.layout import ClaimFiles
from thunder_dra.plugin.files.library import LibraryProvider
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import (
    CheckpointStore,
    ClaimRef,
    ClaimState,
    Consumer,
    PreparedClaim,
)
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.plugin.state.journal import (
    JournalEntry,
    JournalEntryNotFound,
    MintJournal,
    MintPurpose,
    MintRole,
)
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.thunder import MintedToken, NotFound, ThunderClient, ThunderError

log = logging.getLogger(__name__)


@dataclass
class PrepareDeps:
    config: DaemonConfig
    kube: KubeClient
    thunder: ThunderClient
    journal: MintJournal
    checkpoint: CheckpointStore
    cdi: CdiSpecStore
    library: LibraryProvider
    records: Records
    undo: Undo
    pools: PoolResolver
    zones: ZoneIds
    crash: CrashPoints
    scrubber: SecretScrubber
    abandoned: set[str] = field(default_factory=set)
    unrecorded: set[str] = field(default_factory=set)
    """Committed claims whose ``Client`` record may be missing (its create and the undoing
    of the commit both failed, or a check of the record failed, at start-up say): their
    next prepare restores the record before it answers."""


@dataclass
class Attempt:
    """IDs one enrollment attempt learned, in memory, whether or not they reached the
    journal: a rollback revokes them even when the journal write failed."""

    token_id: str | None = None
    client_id: str | None = None


class Preparer:
    def __init__(self, deps: PrepareDeps) -> None:
        self.d = deps

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedClaim, JSON]:
        """A fresh claim, end to end (the caller handles claims already checkpointed); with
        the ResourceClaim as read, for the claim's status write.

        The journal entry is begun while the claim is read: it needs only the claim's
        identity, and has to be on disk before the mint, not before the read. A claim
        that turns out to be a VM's has its entry's purpose changed before the mint; a
        claim that fails before the mint has its entry closed (nothing was minted)."""
        d = self.d
        begun = asyncio.ensure_future(self._begin(ref, MintPurpose.POD))
        try:
            claim, preload, library, resource_claim = await self._read(ref)
            entry = await begun
            d.crash.reached("prepare:journal-begun")
            if claim.is_vm:
                entry = await d.journal.record_purpose(entry.entry_id, MintPurpose.VM)
        except Exception:
            # An entry that could not be written needs nothing (when the read succeeded,
            # its error is the claim's); one written is closed, nothing was minted.
            await asyncio.wait([begun])
            if not begun.cancelled() and begun.exception() is None:
                await self._close_unminted(ref.uid, begun.result())
            raise
        prepared = await self.enroll(claim, preload=preload, library=library, entry=entry)
        return prepared, resource_claim

    async def _read(self, ref: ClaimRef) -> tuple[PreparedClaim, bool, Path | None, JSON]:
        """The claim to enroll (from the ResourceClaim, its pool and its consumer), its
        ``ldPreload`` option, the library it mounts (None for a VM) and the claim as read."""
        d = self.d
        try:
            resource_claim = await d.kube.get_claim(ref.namespace, ref.name)
        except kube_errors.NotFound:
            raise ClaimError("the ResourceClaim does not exist") from None
        except KubeError as err:
            raise ClaimError(str(err), ErrorReason.KUBERNETES) from None
        allocation = parse_claim(resource_claim, ref.uid, d.config.driver_name)
        identity = await d.pools.resolve(allocation.pool)
        consumer = await self._consumer(ref, allocation.reserved_pods)
        library = None if consumer.kind == "vm" else await d.library.current()
        zone_id = await d.zones.resolve(identity.zone_name)
        claim = PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            consumer=consumer,
            zone_name=identity.zone_name,
            zone_id=zone_id,
            gpu_type=identity.gpu_type,
            gpu_count=len(allocation.devices),
            devices=allocation.devices_for(vm=consumer.kind == "vm"),
        )
        return claim, allocation.preload, library, resource_claim

    async def _begin(self, claim: ClaimRef, purpose: MintPurpose) -> JournalEntry:
        """Begin the journal entry of a client mint for ``claim``."""
        return await self.d.journal.begin(
            role=MintRole.CLIENT,
            purpose=purpose,
            claim_uid=claim.uid,
            claim_namespace=claim.namespace,
            claim_name=claim.name,
        )

    async def _close_unminted(self, claim_uid: str, entry: JournalEntry) -> None:
        """Close the entry of a mint that will not be made."""
        try:
            await self.d.journal.close(entry.entry_id)
        except Exception as err:
            # Left open, the entry is closed by the next start-up, which reports it as a
            # mint whose token ID never came back: this line says that nothing was minted.
            log.warning(
                "closing the journal entry of a claim that failed before its mint failed; "
                "nothing was minted",
                extra={"claim_uid": claim_uid, "entry": entry.entry_id, "error": str(err)},
            )

    async def _consumer(self, ref: ClaimRef, pods: tuple[str, ...]) -> Consumer:
        if not pods:
            return Consumer(kind="pod", name="")
        if not may_be_virt_launcher(pods[0]):
            return Consumer(kind="pod", name=pods[0])  # not a VM's pod: nothing to read
        try:
            pod = await self.d.kube.get_pod(ref.namespace, pods[0])
        except kube_errors.NotFound:
            log.warning(
                "the pod the claim is reserved for is gone; preparing for a pod",
                extra={"claim_uid": ref.uid, "pod": pods[0]},
            )
            return Consumer(kind="pod", name=pods[0])
        except KubeError as err:
            raise ClaimError(f"reading the consuming pod: {err}", ErrorReason.KUBERNETES) from None
        if is_virt_launcher(pod):
            return Consumer(kind="vm", name=vm_name(pod))
        return Consumer(kind="pod", name=pods[0])

    async def _mint(self, claim: PreparedClaim, entry: JournalEntry) -> MintedToken:
        d = self.d
        try:
            return await d.thunder.mint_client_token(claim.zone_id, claim.gpu_type, claim.gpu_count)
        except ThunderError as err:
            await d.undo.settle_failed_mint(d.journal, entry, err)
            if isinstance(err, NotFound):
                d.zones.forget(claim.zone_name)
            raise ClaimError(f"Thunder mint failed: {err}", ErrorReason.THUNDER_MINT) from None

    async def enroll(
        self,
        claim: PreparedClaim,
        *,
        preload: bool,
        library: Path | None,
        entry: JournalEntry | None = None,
    ) -> PreparedClaim:
        """Enroll ``claim`` (fresh, or again from its checkpoint entry) and commit it.

        ``preload`` is the claim's option for its CDI spec; ``library`` the cached
        ``libthunder.so`` it mounts (pods; None for a VM); ``entry`` the claim's journal
        entry when one is begun already (nothing minted yet, the purpose the claim's),
        else one is begun here."""
        d = self.d
        files = None
        if not claim.is_vm:
            assert library is not None
            try:
                files = d.config.claim_layout.files(claim.uid, library)
            except (ClientConfigError, CdiError) as err:
                if entry is not None:
                    await self._close_unminted(claim.uid, entry)
                raise ClaimError(str(err)) from None  # before anything is minted
        if entry is None:
            entry = await self._begin(claim, MintPurpose.VM if claim.is_vm else MintPurpose.POD)
            d.crash.reached("prepare:journal-begun")
        attempt = Attempt()
        try:
            prepared = await self._enroll_steps(claim, entry, attempt, preload, files)
        except Exception as err:
            await self._roll_back(entry, attempt)
            if isinstance(err, ClaimError):
                raise
            if isinstance(err, KubeError):
                raise ClaimError(str(err), ErrorReason.KUBERNETES) from err
            if isinstance(err, OSError | ClientConfigError):
                raise ClaimError(
                    f"writing claim files failed: {err}", ErrorReason.FILESYSTEM
                ) from err
            raise
        try:
            await d.journal.close(entry.entry_id)
        except OSError as err:
            # The claim is committed in the checkpoint file: an entry left open is closed
            # as committed by the next start-up or sweep, so this is not the claim's error.
            log.warning(
                "closing the journal entry of a committed claim failed; left for recovery",
                extra={"claim_uid": claim.uid, "entry": entry.entry_id, "error": str(err)},
            )
        d.crash.reached("prepare:journal-closed")
        return prepared

    async def _roll_back(self, entry: JournalEntry, attempt: Attempt) -> None:
        try:
            current = await self.d.journal.get(entry.entry_id)
        except JournalEntryNotFound:
            return  # settled already: nothing was minted
        except Exception as err:  # unreadable (EIO): what we began, plus what we learned
            log.warning(
                "reading back a journal entry for rollback failed",
                extra={"claim_uid": entry.claim_uid, "entry": entry.entry_id, "error": str(err)},
            )
            current = entry
        known = {
            key: value
            for key, value in (
                ("enrollment_token_id", attempt.token_id),
                ("client_id", attempt.client_id),
            )
            if value and not getattr(current, key)
        }
        if known:
            # Learned but never journaled (the write failed): revoked all the same. Not
            # persisted: if this rollback fails too, the log line below names the IDs.
            current = current.model_copy(update=known)
        try:
            await self.d.undo.roll_back(self.d.journal, current)
        except Exception as err:
            # Left open: the periodic sweep retries it.
            self.d.abandoned.add(entry.entry_id)
            log.error(
                "rolling back a failed prepare failed; will retry",
                extra={
                    "claim_uid": entry.claim_uid,
                    "entry": entry.entry_id,
                    "enrollment_token_id": current.enrollment_token_id,
                    "client_id": current.client_id,
                    "error": str(err),
                },
            )

    async def _enroll_steps(
        self,
        claim: PreparedClaim,
        entry: JournalEntry,
        attempt: Attempt,
        preload: bool,
        files: ClaimFiles | None,
    ) -> PreparedClaim:
        """``files``: the pod claim's files (:mod:`thunder_dra.plugin.files.layout`);
        None for a VM."""
        d = self.d
        minted = await self._mint(claim, entry)
        token_id = attempt.token_id = minted.enrollment_token_id
        key = d.scrubber.add(minted.enrollment_token)
        client_id: str | None = None
        try:
            # The token ID is on disk before the exchange makes a client of the token: a
            # crash before that write leaves an entry without a token ID, which nothing
            # can revoke, so no client may exist by then.
            await d.journal.record_token_id(entry.entry_id, token_id)
            d.crash.reached("prepare:token-recorded")
            if claim.is_vm:
                await d.records.write_guest_secret(
                    namespace=claim.namespace,
                    claim_name=claim.name,
                    claim_uid=claim.uid,
                    token=minted.enrollment_token,
                    token_id=token_id,
                    script=guest_install_script(
                        api_url=d.config.api_url,
                        install_url=d.config.installer_url,
                        installer_sha256=d.config.installer_sha256,
                    ),
                )
                d.crash.reached("prepare:secret-written")
            else:
                assert files is not None
                client_id, config = await self._exchange(claim, minted, attempt)
                d.crash.reached("prepare:exchanged")
        finally:
            d.scrubber.remove(key)
        enrolled = claim.model_copy(
            update={
                "enrollment_token_id": token_id,
                "client_id": client_id,
                "secret_name": guest_secret_name(claim.name) if claim.is_vm else None,
                "paths": files.paths if files is not None else (),
            }
        )
        prepared = enrolled.model_copy(update={"state": ClaimState.PREPARED})
        # The record's request goes out first: the API server's answer is what the rest
        # waits on longest, and the file writes' threads would delay its sending.
        record = asyncio.ensure_future(d.records.write_client(enrolled))
        try:
            if files is not None:
                assert client_id is not None
                # With the token ID journaled, the client ID's journal line and the files
                # depend on nothing but the exchange's answer: written at once, all done
                # before the checkpoint commits the claim. A rollback removes a
                # config.json that names another client than the committed one,
                # journaled or not (:meth:`Undo.roll_back`).
                await d.crash.together(
                    (
                        d.journal.record_client_id(entry.entry_id, client_id),
                        "prepare:client-id-recorded",
                    ),
                    (write_client_config(files.directory, config), "prepare:config-written"),
                    (
                        d.cdi.write_claim(
                            enrolled,
                            config_json=files.config_json,
                            libthunder=files.library,
                            preload=preload,
                        ),
                        "prepare:cdi-written",
                    ),
                )
            if record.done():
                record.result()  # failed already: nothing to commit
            previous = d.checkpoint.durable.claims.get(claim.uid)
            await d.checkpoint.put(prepared)
        except Exception:
            # The record is never abandoned half-way; the rollback removes it. Its own
            # error, if any, is the same attempt's and is not reported twice.
            await asyncio.wait([record])
            if not record.cancelled():
                record.exception()
            raise
        d.crash.reached("prepare:checkpoint-committed")
        await self._recorded(record, prepared, previous)
        d.crash.reached("prepare:client-recorded")
        return prepared

    async def _recorded(
        self, record: asyncio.Future[None], prepared: PreparedClaim, previous: PreparedClaim | None
    ) -> None:
        """Wait for the claim's ``Client`` record, which the checkpoint commit did not wait
        for. If its write failed, the commit is undone (``previous``: what the checkpoint
        file held for the claim before), so the rollback revokes the enrollment; if that
        write fails too, the claim stays committed and its next prepare re-creates the
        record before it answers."""
        try:
            await record
        except Exception:
            d = self.d
            try:
                if previous is None:
                    await d.checkpoint.drop(prepared.uid)
                else:
                    await d.checkpoint.put(previous)
            except Exception as undo_err:
                d.unrecorded.add(prepared.uid)
                log.error(
                    "undoing the commit of a claim whose Client record failed failed; the "
                    "claim stays prepared and its next prepare re-creates the record",
                    extra={"claim_uid": prepared.uid, "error": str(undo_err)},
                )
            raise

    async def _exchange(
        self, claim: PreparedClaim, minted: MintedToken, attempt: Attempt
    ) -> tuple[str, ClientConfig]:
        """Exchange the token (its client ID kept in ``attempt``); the client's ID and
        ``config.json``."""
        d = self.d
        try:
            exchange = await d.thunder.exchange(minted.enrollment_token, claim.hostname)
        except ThunderError as err:
            raise ClaimError(
                f"Thunder exchange failed: {err}", ErrorReason.THUNDER_EXCHANGE
            ) from None
        client_id = attempt.client_id = exchange.claims.client_id
        config = client_config_from_exchange(
            exchange, central_api_url=d.config.api_url, telemetry_collector=d.config.telemetry_url
        )
        return client_id, config
