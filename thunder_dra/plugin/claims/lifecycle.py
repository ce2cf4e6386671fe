"""The claim lifecycle of one daemon instance, wired together in one place.

:func:`assemble` builds the parts that prepare, repair, unprepare and roll back claims
(checkpoint, records, undo, library, preparer, repairer, unpreparer, recovery, and the
node and claim locks they share) from the process's clients (Kubernetes, Thunder,
artifacts) and this instance's journal. The kubelet's handler sits above it
(:func:`thunder_dra.plugin.kubelet.handler.claim_service`). The daemon
(:mod:`thunder_dra.plugin.daemon`) calls both at start-up; the lifecycle unit tests call
them with in-memory fakes, so both run the same wiring.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.events import EventRecorder
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
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.plugin.state.checkpoint import CheckpointStore, CheckpointWriter, write_file
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.plugin.state.locks import KeyedLocks, NodeSerializeLock
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.process.tracing import DAEMON_SERVICE
from thunder_dra.thunder import ArtifactFetcher, ThunderClient


@dataclass
class ClaimLifecycle:
    checkpoint: CheckpointStore
    records: Records
    cache: LibthunderCache
    library: LibraryProvider
    undo: Undo
    preparer: Preparer
    repairer: Repairer
    unpreparer: Unpreparer
    recovery: Recovery
    node_lock: NodeSerializeLock
    claim_locks: KeyedLocks
    abandoned: set[str]  # journal entries whose rollback failed, for the sweep
    # Claims whose unprepare the kubelet was answered for but whose record removal
    # failed after the answer (kubelet handler), for the sweep.
    unfinished: set[str]


def _library(
    cfg: DaemonConfig, fetcher: ArtifactFetcher
) -> tuple[LibthunderCache, LibraryProvider]:
    """The node's libthunder cache, and the verified installer's pins over it."""
    cache = LibthunderCache(
        cfg.library_cache_dir,
        lambda url, dest, sha: fetcher.download_library(url, sha, dest),
    )
    library = LibraryProvider(
        fetcher,
        cache,
        cfg.installer_url,
        installer_sha256=cfg.installer_sha256,
        library_sha256=cfg.library_sha256,
    )
    return cache, library


def _prepare_deps(
    *,
    cfg: DaemonConfig,
    node_name: str,
    kube: KubeClient,
    thunder: ThunderClient,
    library: LibraryProvider,
    own: InstanceJournal,
    metrics: DaemonMetrics,
    crash: CrashPoints,
    scrubber: SecretScrubber,
    checkpoint_writer: CheckpointWriter,
) -> PrepareDeps:
    """What a prepare works with, and shares with repair, unprepare and recovery: the
    checkpoint, the CDI specs, the ``Client`` records, the undo of enrollments."""
    checkpoint = CheckpointStore(cfg.checkpoint_dir, writer=checkpoint_writer)
    cdi = CdiSpecStore(cfg.cdi_dir, node_gpu_files=cfg.present_gpu_files, ca_bundle=cfg.ca_bundle)
    events = EventRecorder(
        kube,
        component=DAEMON_SERVICE,
        instance=node_name,
        host=node_name,
        scrub=scrubber.scrub,
    )
    records = Records(kube, node_name, ProvenanceKey(cfg.api_token), events=events)
    undo = Undo(
        thunder=thunder,
        cdi=cdi,
        layout=cfg.claim_layout,
        records=records,
        checkpoint=checkpoint,
        metrics=metrics,
    )
    return PrepareDeps(
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
        abandoned=set(),
    )


def assemble(
    *,
    config: DaemonConfig,
    node_name: str,
    kube: KubeClient,
    thunder: ThunderClient,
    fetcher: ArtifactFetcher,
    own: InstanceJournal,
    metrics: DaemonMetrics,
    crash: CrashPoints,
    scrubber: SecretScrubber,
    checkpoint_writer: CheckpointWriter = write_file,
) -> ClaimLifecycle:
    cfg = config
    cache, library = _library(cfg, fetcher)
    deps = _prepare_deps(
        cfg=cfg,
        node_name=node_name,
        kube=kube,
        thunder=thunder,
        library=library,
        own=own,
        metrics=metrics,
        crash=crash,
        scrubber=scrubber,
        checkpoint_writer=checkpoint_writer,
    )
    preparer = Preparer(deps)
    repairer = Repairer(preparer)
    unpreparer = Unpreparer(
        node_name=node_name,
        checkpoint=deps.checkpoint,
        records=deps.records,
        undo=deps.undo,
        crash=crash,
    )
    claim_locks = KeyedLocks()
    unfinished: set[str] = set()
    recovery: Recovery | None = None

    async def reload_shared_state() -> None:
        assert recovery is not None
        await recovery.load_checkpoint()

    node_lock = NodeSerializeLock(cfg.serialize_lock, reload_shared_state)
    recovery = Recovery(
        own=own,
        journal_root=cfg.journal_root,
        checkpoint=deps.checkpoint,
        undo=deps.undo,
        preparer=preparer,
        repairer=repairer,
        unpreparer=unpreparer,
        cache=cache,
        cdi=deps.cdi,
        node_lock=node_lock,
        claim_locks=claim_locks,
        abandoned=deps.abandoned,
        unfinished=unfinished,
    )
    return ClaimLifecycle(
        checkpoint=deps.checkpoint,
        records=deps.records,
        cache=cache,
        library=library,
        undo=deps.undo,
        preparer=preparer,
        repairer=repairer,
        unpreparer=unpreparer,
        recovery=recovery,
        node_lock=node_lock,
        claim_locks=claim_locks,
        abandoned=deps.abandoned,
        unfinished=unfinished,
    )
