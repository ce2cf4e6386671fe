"""The claim lifecycle of one daemon instance, wired together in one place.

:func:`assemble` builds the parts that prepare, repair, unprepare and roll back claims
(checkpoint, records, undo, library, preparer, repairer, unpreparer, recovery) and the
kubelet-facing :class:`ClaimService` over them, from the process's clients (Kubernetes,
Thunder, artifacts) and this instance's journal. The daemon (:mod:`daemon`) calls it at
start-up; the lifecycle unit tests call it with in-memory fakes, so both run the same
wiring.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Tracer

from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.provenance import ProvenanceKey
from thunder_dra.plugin.claims.allocation import PoolResolver, ZoneIds
from thunder_dra.plugin.claims.prepare import PrepareDeps, Preparer
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.claims.recovery import InstanceJournal, Recovery
from thunder_dra.plugin.claims.repair import Repairer
from thunder_dra.plugin.claims.rollback import Undo
from thunder_dra.plugin.claims.unprepare import Unpreparer
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.files.cdi import CdiSpecStore
from thunder_dra.plugin.files.libcache import LibthunderCache
from thunder_dra.plugin.files.library import LibraryProvider
from thunder_dra.plugin.kubelet.handler import ClaimService, ClaimSlots
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.plugin.state.checkpoint import CheckpointStore, CheckpointWriter, write_file
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.plugin.state.locks import KeyedLocks, NodeSerializeLock
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.thunder import ArtifactFetcher, ThunderClient


@dataclass
class ClaimLifecycle:
    checkpoint: CheckpointStore
    cache: LibthunderCache
    library: LibraryProvider
    undo: Undo
    preparer: Preparer
    repairer: Repairer
    unpreparer: Unpreparer
    recovery: Recovery
    service: ClaimService
    abandoned: set[str]  # journal entries whose rollback failed, for the sweep


def assemble(
    *,
    config: DaemonConfig,
    node_name: str,
    kube: KubeClient,
    thunder: ThunderClient,
    fetcher: ArtifactFetcher,
    own: InstanceJournal,
    metrics: DaemonMetrics,
    tracer: Tracer,
    crash: CrashPoints,
    scrubber: SecretScrubber,
    checkpoint_writer: CheckpointWriter = write_file,
) -> ClaimLifecycle:
    cfg = config
    cache = LibthunderCache(
        cfg.library_cache_dir,
        lambda url, dest, sha: fetcher.download_library(url, sha, dest),
    )
    checkpoint = CheckpointStore(cfg.checkpoint_dir, writer=checkpoint_writer)
    cdi = CdiSpecStore(cfg.cdi_dir, node_gpu_files=cfg.present_gpu_files, ca_bundle=cfg.ca_bundle)
    records = Records(kube, node_name, ProvenanceKey(cfg.api_token))
    undo = Undo(
        thunder=thunder,
        cdi=cdi,
        layout=cfg.claim_layout,
        records=records,
        checkpoint=checkpoint,
        metrics=metrics,
    )
    abandoned: set[str] = set()
    library = LibraryProvider(
        fetcher,
        cache,
        cfg.installer_url,
        installer_sha256=cfg.installer_sha256,
        library_sha256=cfg.library_sha256,
    )
    deps = PrepareDeps(
        config=cfg,
        kube=kube,
        thunder=thunder,
        journal=own.journal,
        checkpoint=checkpoint,
        cdi=cdi,
        library=library,
        records=records,
        undo=undo,
        pools=PoolResolver(kube, cfg.driver_name),
        zones=ZoneIds(thunder),
        crash=crash,
        scrubber=scrubber,
        abandoned=abandoned,
    )
    preparer = Preparer(deps)
    repairer = Repairer(preparer)
    unpreparer = Unpreparer(
        node_name=node_name, checkpoint=checkpoint, records=records, undo=undo, crash=crash
    )
    claim_locks = KeyedLocks()
    recovery: Recovery | None = None

    async def reload_shared_state() -> None:
        assert recovery is not None
        await recovery.load_checkpoint()

    node_lock = NodeSerializeLock(cfg.serialize_lock, reload_shared_state)
    recovery = Recovery(
        own=own,
        journal_root=cfg.journal_root,
        checkpoint=checkpoint,
        undo=undo,
        preparer=preparer,
        repairer=repairer,
        unpreparer=unpreparer,
        cache=cache,
        node_lock=node_lock,
        claim_locks=claim_locks,
        abandoned=abandoned,
    )
    service = ClaimService(
        preparer=preparer,
        repairer=repairer,
        unpreparer=unpreparer,
        checkpoint=checkpoint,
        records=records,
        node_lock=node_lock,
        claim_locks=claim_locks,
        metrics=metrics,
        tracer=tracer,
        slots=ClaimSlots(cfg.claim_concurrency, metrics.registry),
    )
    return ClaimLifecycle(
        checkpoint=checkpoint,
        cache=cache,
        library=library,
        undo=undo,
        preparer=preparer,
        repairer=repairer,
        unpreparer=unpreparer,
        recovery=recovery,
        service=service,
        abandoned=abandoned,
    )
