"""Preparing one claim: from its allocation to a Thunder client, files, records and a CDI spec.

The order (architecture.md, Prepare), every step safe to crash after:

1. read the claim and its allocation for this driver; map the pool to Thunder's zone and
   model spellings; find the consumer (a KubeVirt virt-launcher pod means a VM);
2. for pods, make sure the verified ``libthunder.so`` is in the node cache *before*
   minting, so a bad download never costs an enrollment;
3. journal the mint, mint a client token (2.6), record its ID;
4. pods: exchange it (2.9, hostname = the pod's name), record the client ID, write the
   claim's ``config.json``; VMs: write the ``<claim>-thunder-setup`` Secret instead;
5. record the ``Client`` (finalizer, spec, status Enrolled);
6. pods: write the CDI spec;
7. commit the checkpoint, close the journal entry, answer.

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

import logging
from dataclasses import dataclass, field
from pathlib import Path

from thunder_dra.api import ConsumerKind
from thunder_dra.plugin.allocation import (
    ClaimError,
    PoolResolver,
    ZoneIds,
    is_virt_launcher,
    parse_claim,
    vm_name,
)
from thunder_dra.plugin.cdi import CdiSpecStore, ClaimCdiParams, NodeGpuFiles, qualified_device_id
from thunder_dra.plugin.checkpoint import (
    CheckpointStore,
    ClaimState,
    Consumer,
    PreparedClaim,
    PreparedDevice,
)
from thunder_dra.plugin.clientconfig import (
    ClientConfigError,
    claim_dir,
    client_config_from_exchange,
    write_client_config,
)
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.crashpoints import CrashPoints
from thunder_dra.plugin.guest import guest_install_script, guest_secret_name
from thunder_dra.plugin.journal import (
    JournalEntry,
    JournalEntryNotFound,
    MintJournal,
    MintPurpose,
    MintRole,
)
from thunder_dra.plugin.kubeapi import KubeApi, KubeError, KubeNotFound
from thunder_dra.plugin.library import LibraryProvider
from thunder_dra.plugin.logs import SecretScrubber
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.records import ClientRecord, Records
from thunder_dra.plugin.rollback import Undo
from thunder_dra.plugin.service import ClaimRef
from thunder_dra.thunder import MintedToken, NotFound, ThunderClient, ThunderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """Everything one enrollment needs, from the API (fresh) or the checkpoint (re-enroll)."""

    uid: str
    namespace: str
    name: str
    zone_name: str
    zone_id: str
    gpu_type: str
    gpu_count: int
    consumer: Consumer
    hostname: str
    devices: tuple[PreparedDevice, ...]
    preload: bool = True
    library: Path | None = None

    @property
    def is_vm(self) -> bool:
        return self.consumer.kind == "vm"


@dataclass
class PrepareDeps:
    config: DaemonConfig
    kube: KubeApi
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


@dataclass
class Attempt:
    """IDs one enrollment attempt learned, in memory, whether or not they reached the
    journal: a rollback revokes them even when the journal write failed."""

    token_id: str | None = None
    client_id: str | None = None


def library_of(prepared: PreparedClaim) -> Path | None:
    for entry in prepared.paths:
        if entry.endswith("/libthunder.so"):
            return Path(entry)
    return None


class Preparer:
    def __init__(self, deps: PrepareDeps) -> None:
        self.d = deps

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """A fresh claim, end to end (the caller handles claims already checkpointed)."""
        return await self.enroll(await self._plan(ref))

    async def _plan(self, ref: ClaimRef) -> Plan:
        d = self.d
        try:
            claim = await d.kube.get_claim(ref.namespace, ref.name)
        except KubeNotFound:
            raise ClaimError("the ResourceClaim does not exist") from None
        except KubeError as err:
            raise ClaimError(str(err), ErrorReason.KUBERNETES) from None
        allocation = parse_claim(claim, ref.uid, d.config.driver_name)
        identity = await d.pools.resolve(allocation.pool)
        consumer, hostname = await self._consumer(ref, allocation.reserved_pods)
        library = None if consumer.kind == "vm" else await d.library.current()
        zone_id = await d.zones.resolve(identity.zone_name)
        cdi_ids = () if consumer.kind == "vm" else (qualified_device_id(ref.uid),)
        devices = tuple(
            PreparedDevice(
                pool_name=dev.pool,
                device_name=dev.device,
                request_names=(dev.request,) if dev.request else (),
                cdi_device_ids=cdi_ids,
            )
            for dev in allocation.devices
        )
        return Plan(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            zone_name=identity.zone_name,
            zone_id=zone_id,
            gpu_type=identity.gpu_type,
            gpu_count=len(devices),
            consumer=consumer,
            hostname=hostname,
            devices=devices,
            preload=allocation.preload,
            library=library,
        )

    async def _consumer(self, ref: ClaimRef, pods: tuple[str, ...]) -> tuple[Consumer, str]:
        if not pods:
            return Consumer(kind="pod", name=""), ref.name
        try:
            pod = await self.d.kube.get_pod(ref.namespace, pods[0])
        except KubeNotFound:
            log.warning(
                "the pod the claim is reserved for is gone; preparing for a pod",
                extra={"claim_uid": ref.uid, "pod": pods[0]},
            )
            return Consumer(kind="pod", name=pods[0]), pods[0]
        except KubeError as err:
            raise ClaimError(f"reading the consuming pod: {err}", ErrorReason.KUBERNETES) from None
        if is_virt_launcher(pod):
            return Consumer(kind="vm", name=vm_name(pod)), pods[0]
        return Consumer(kind="pod", name=pods[0]), pods[0]

    def cdi_params(self, plan: Plan, config_json: Path, library: Path) -> ClaimCdiParams:
        cfg = self.d.config
        return ClaimCdiParams(
            claim_uid=plan.uid,
            namespace=plan.namespace,
            name=plan.name,
            gpu_type=plan.gpu_type,
            gpu_count=plan.gpu_count,
            config_json=config_json,
            libthunder=library,
            node_gpu_files=present_gpu_files(cfg),
            ca_bundle=cfg.ca_bundle,
            preload=plan.preload,
        )

    async def _mint(self, plan: Plan, entry: JournalEntry) -> MintedToken:
        d = self.d
        try:
            return await d.thunder.mint_client_token(plan.zone_id, plan.gpu_type, plan.gpu_count)
        except ThunderError as err:
            await d.undo.settle_failed_mint(d.journal, entry, err)
            if isinstance(err, NotFound):
                d.zones.forget(plan.zone_name)
            raise ClaimError(f"Thunder mint failed: {err}", ErrorReason.THUNDER_MINT) from None

    async def enroll(self, plan: Plan) -> PreparedClaim:
        d = self.d
        purpose = MintPurpose.VM if plan.is_vm else MintPurpose.POD
        entry = await d.journal.begin(
            role=MintRole.CLIENT,
            purpose=purpose,
            claim_uid=plan.uid,
            claim_namespace=plan.namespace,
            claim_name=plan.name,
        )
        d.crash.reached("prepare:journal-begun")
        attempt = Attempt()
        try:
            prepared = await self._enroll_steps(plan, entry, attempt)
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
                extra={"claim_uid": plan.uid, "entry": entry.entry_id, "error": str(err)},
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
        self, plan: Plan, entry: JournalEntry, attempt: Attempt
    ) -> PreparedClaim:
        d = self.d
        minted = await self._mint(plan, entry)
        token_id = attempt.token_id = minted.enrollment_token_id
        key = d.scrubber.add(minted.enrollment_token)
        client_id: str | None = None
        paths: tuple[str, ...] = ()
        try:
            await d.journal.record_token_id(entry.entry_id, token_id)
            d.crash.reached("prepare:token-recorded")
            if plan.is_vm:
                await d.records.write_guest_secret(
                    namespace=plan.namespace,
                    claim_name=plan.name,
                    claim_uid=plan.uid,
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
                client_id, paths = await self._exchange(plan, entry, minted, attempt)
        finally:
            d.scrubber.remove(key)
        record = ClientRecord(
            namespace=plan.namespace,
            claim_name=plan.name,
            claim_uid=plan.uid,
            node_name=d.config.node_name,
            zone_name=plan.zone_name,
            zone_id=plan.zone_id,
            gpu_type=plan.gpu_type,
            gpu_count=plan.gpu_count,
            enrollment_token_id=token_id,
            consumer_kind=ConsumerKind.VIRTUAL_MACHINE if plan.is_vm else ConsumerKind.POD,
            consumer_name=plan.consumer.name,
            client_id=client_id,
        )
        await d.records.record_client(record)
        d.crash.reached("prepare:client-recorded")
        if not plan.is_vm:
            assert plan.library is not None
            spec = await d.cdi.write_claim(self.cdi_params(plan, Path(paths[1]), plan.library))
            d.crash.reached("prepare:cdi-written")
            paths = (*paths, str(spec), str(plan.library))
        prepared = PreparedClaim(
            uid=plan.uid,
            namespace=plan.namespace,
            name=plan.name,
            consumer=plan.consumer,
            zone_name=plan.zone_name,
            zone_id=plan.zone_id,
            gpu_type=plan.gpu_type,
            gpu_count=plan.gpu_count,
            enrollment_token_id=token_id,
            client_id=client_id,
            secret_name=guest_secret_name(plan.name) if plan.is_vm else None,
            devices=plan.devices,
            paths=paths,
            state=ClaimState.PREPARED,
        )
        await d.checkpoint.put(prepared)
        d.crash.reached("prepare:checkpoint-committed")
        return prepared

    async def _exchange(
        self, plan: Plan, entry: JournalEntry, minted: MintedToken, attempt: Attempt
    ) -> tuple[str, tuple[str, ...]]:
        d = self.d
        try:
            exchange = await d.thunder.exchange(minted.enrollment_token, plan.hostname)
        except ThunderError as err:
            raise ClaimError(
                f"Thunder exchange failed: {err}", ErrorReason.THUNDER_EXCHANGE
            ) from None
        d.crash.reached("prepare:exchanged")
        client_id = attempt.client_id = exchange.claims.client_id
        await d.journal.record_client_id(entry.entry_id, client_id)
        d.crash.reached("prepare:client-id-recorded")
        config = client_config_from_exchange(
            exchange, central_api_url=d.config.api_url, telemetry_collector=d.config.telemetry_url
        )
        directory = claim_dir(d.config.claims_dir, plan.uid)
        config_path = await write_client_config(directory, config)
        d.crash.reached("prepare:config-written")
        return client_id, (str(directory), str(config_path))


def present_gpu_files(config: DaemonConfig) -> NodeGpuFiles:
    """The configured node GPU files that exist on the host (a missing bind source would
    make the runtime fail the container)."""
    files = config.node_gpu_files

    def present(path: Path | None) -> Path | None:
        if path is None:
            return None
        seen = config.host_root / path.relative_to("/")
        return path if seen.exists() else None

    return NodeGpuFiles(
        nvidia_smi=present(files.nvidia_smi),
        libcuda=present(files.libcuda),
        libnvidia_ml=present(files.libnvidia_ml),
    )
