"""Start-up recovery and the periodic journal sweep.

At start-up, under the node's serialize lock (so a second daemon instance mid rolling
update is never disturbed):

1. load the checkpoint (a corrupt file is set aside and reported, never silently used);
2. roll back this instance's open journal entries left by a crash, and those of any dead
   instance (one whose instance lock can be taken: the kernel released it when that
   process died);
3. finish unprepares that a crash interrupted;
4. remove this driver's temporary spec files that a crash mid-write left in the CDI
   directory (only names of our own specs: the directory is shared with other vendors),
   and re-verify the libthunder cache (corrupt files are removed and fetched again on
   use);
5. repair every prepared claim: rewrite missing CDI specs (``/var/run/cdi`` is emptied by
   a reboot), re-create missing ``Client`` records, re-enroll claims whose
   ``config.json`` is gone.

Between steps 2 and 3, when the checkpoint file was set aside as corrupt or is missing
(lost, or never written), the node's ``Client`` records that it lacks are re-adopted or
revoked (:mod:`rebuild`) and the checkpoint is written; the same runs whenever a later
load finds the file set aside or gone.

Thunder or API failures here are logged and left to the sweep (journal entries, the
rebuild) or to the kubelet's next prepare of the claim (repairs); they never stop the
daemon.

The sweep repeats step 2 every ``--sweep-interval`` for entries whose rollback failed
and for instances that died since (a rolling update's old pod killed mid-prepare),
retries a rebuild that failed, and finishes the unprepares whose record removal after the
kubelet's answer gave up (step 3 for them). It survives every error a pass can meet (API timeouts,
reset connections, 5xx from either API, file system errors): each failed pass is counted
in ``thunder_dra_daemon_errors_total{operation="journal-sweep"}`` and the next pass waits
longer (doubling, jittered, up to 8 intervals), back to the interval after a clean pass.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from thunder_dra import fsutil
from thunder_dra.backoff import backoff_delay
from thunder_dra.kube.errors import KubeError
from thunder_dra.plugin.claims.prepare import Preparer
from thunder_dra.plugin.claims.rebuild import Rebuilder
from thunder_dra.plugin.claims.repair import Repairer
from thunder_dra.plugin.claims.rollback import Undo
from thunder_dra.plugin.claims.unprepare import Unpreparer
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.cdi import CdiSpecStore
from thunder_dra.plugin.files.libcache import LibthunderCache
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import CheckpointStore, ClaimState
from thunder_dra.plugin.state.journal import JournalCorruptError, JournalEntry, MintJournal
from thunder_dra.plugin.state.locks import InstanceLock, KeyedLocks, NodeSerializeLock
from thunder_dra.thunder import ThunderError

INSTANCE_LOCK = ".instance.lock"
SWEEP_OPERATION = "journal-sweep"
SWEEP_MAX_BACKOFF_INTERVALS = 8

log = logging.getLogger(__name__)


class InstanceJournal:
    """A daemon instance's journal directory and the lock that says it is alive."""

    def __init__(self, root: Path, instance_id: str) -> None:
        self.directory = root / instance_id
        self.journal = MintJournal(self.directory)
        self.lock = InstanceLock(self.directory / INSTANCE_LOCK)


def error_reason(err: BaseException) -> ErrorReason:
    """The ``reason`` label of an error met in background work."""
    if isinstance(err, ClaimError):
        return err.reason
    if isinstance(err, KubeError):
        return ErrorReason.KUBERNETES
    if isinstance(err, ThunderError):
        return ErrorReason.THUNDER_REVOKE
    if isinstance(err, OSError):
        return ErrorReason.FILESYSTEM
    return ErrorReason.INTERNAL


def sweep_delay(interval: float, failures_in_row: int, rng: random.Random | None = None) -> float:
    """The wait before the next sweep pass: the interval after a clean pass; after failed
    passes the one backoff (:mod:`thunder_dra.backoff`) from twice the interval (a failed
    pass never brings the next one closer) up to 8 intervals, jittered (50-100%) so a
    fleet does not retry in step."""
    if failures_in_row <= 0:
        return interval
    return backoff_delay(
        failures_in_row,
        base=2 * interval,
        cap=SWEEP_MAX_BACKOFF_INTERVALS * interval,
        rng=rng,
    )


class Recovery:
    def __init__(
        self,
        *,
        own: InstanceJournal,
        journal_root: Path,
        checkpoint: CheckpointStore,
        undo: Undo,
        preparer: Preparer,
        repairer: Repairer,
        unpreparer: Unpreparer,
        cache: LibthunderCache,
        cdi: CdiSpecStore,
        node_lock: NodeSerializeLock,
        claim_locks: KeyedLocks,
        abandoned: set[str],
        unfinished: set[str],
    ) -> None:
        self._own = own
        self._root = journal_root
        self._checkpoint = checkpoint
        self._undo = undo
        self._repairer = repairer
        self._unpreparer = unpreparer
        self._cache = cache
        self._cdi = cdi
        self._node_lock = node_lock
        self._claim_locks = claim_locks
        self._abandoned = abandoned
        self._unfinished = unfinished
        self._rebuilder = Rebuilder(preparer.d, unpreparer, journal_root, claim_locks)
        self._metrics = undo.metrics
        self._started = False
        self._rebuild_pending = False

    async def startup(self) -> None:
        async with self._node_lock.held():
            failures: list[Exception] = []
            await self._roll_back_all(
                self._own.journal, await self._entries(self._own.journal), failures
            )
            await self._sweep_dead(failures)
            await self._rebuild(failures)
            for prepared in list(self._checkpoint.current.claims.values()):
                if prepared.state is not ClaimState.PREPARED:
                    await self._attempt(
                        "finish an interrupted unprepare",
                        prepared.uid,
                        self._unpreparer.finish(prepared),
                    )
            await self._remove_temp_specs()
            removed = await self._cache.verify_all()
            if removed:
                log.warning("removed corrupt cached libthunder files", extra={"digests": removed})
            for prepared in list(self._checkpoint.current.claims.values()):
                if prepared.state is ClaimState.PREPARED:
                    await self._attempt(
                        "repair a prepared claim", prepared.uid, self._repairer.repair(prepared)
                    )
            self._started = True

    async def _remove_temp_specs(self) -> None:
        # Every CDI spec write runs under the node lock, which this instance holds here:
        # a temporary spec file of ours is one a crash left, and nothing else removes it.
        try:
            removed = await self._cdi.remove_temp_files()
        except OSError as err:
            log.warning(
                "could not remove temporary CDI spec files left by a crash",
                extra={"cdi_dir": str(self._cdi.cdi_dir), "error": str(err)},
            )
            return
        if removed:
            log.warning(
                "removed temporary CDI spec files left by a crash",
                extra={"cdi_dir": str(self._cdi.cdi_dir), "count": removed},
            )

    async def _attempt(self, what: str, uid: str, work: Coroutine[Any, Any, object]) -> None:
        try:
            await work
        except Exception as err:
            log.warning(
                f"could not {what} at start-up; the next kubelet call retries",
                extra={"claim_uid": uid, "error": str(err)},
            )

    async def load_checkpoint(self) -> None:
        """Reload shared state when this process takes the node lock."""
        _, moved = await self._checkpoint.load_or_set_aside()
        if moved is not None:
            log.error(
                "the checkpoint was corrupt and was set aside; prepared claims are rebuilt "
                "from Client records and the mint journal",
                extra={"moved_to": str(moved)},
            )
        if self._checkpoint.found or self._rebuild_pending:
            return
        # Set aside, lost, or never written: reconcile the node's Client records with it.
        self._rebuild_pending = True
        if self._started:
            # Before the call that took the lock goes on: a prepare must find its claim
            # adopted, not enroll it a second time over its own record. A failure is
            # retried by the sweep.
            await self._rebuild([])

    async def _rebuild(self, failures: list[Exception]) -> None:
        """Adopt or revoke the Client records the checkpoint lacks (see :mod:`rebuild`),
        then write the checkpoint, so an intact file means nothing is left to reconcile."""
        if not self._rebuild_pending:
            return
        try:
            report = await self._rebuilder.run()
            if not self._checkpoint.found:
                await self._checkpoint.save(self._checkpoint.current)
        except Exception as err:
            failures.append(err)
            log.warning(
                "rebuilding lost checkpoint entries from Client records failed; the sweep retries",
                extra={"error": str(err)},
            )
            return
        self._rebuild_pending = False
        if report.adopted or report.revoked:
            log.warning(
                "reconciled Client records the checkpoint did not hold",
                extra={"adopted": report.adopted, "revoked": report.revoked},
            )

    async def _entries(self, journal: MintJournal) -> list[JournalEntry]:
        while True:
            try:
                return await journal.open_entries()
            except JournalCorruptError as err:
                moved = await fsutil.move_aside_async(err.path)
                log.error(
                    "a mint journal entry is unreadable and was set aside; check it by hand "
                    "for an enrollment to revoke",
                    extra={"moved_to": str(moved), "error": str(err)},
                )

    async def _roll_back_all(
        self, journal: MintJournal, entries: list[JournalEntry], failures: list[Exception]
    ) -> bool:
        """Roll back ``entries``; stops at the first failure (Thunder is likely down, and
        the sweep retries what is left), appended to ``failures``. True if all resolved."""
        for index, entry in enumerate(entries):
            try:
                async with self._claim_locks.hold(entry.claim_uid or f"entry:{entry.entry_id}"):
                    await self._undo.roll_back(journal, entry)
            except Exception as err:
                log.warning(
                    "journal rollback failed; the sweep retries",
                    extra={
                        "entry": entry.entry_id,
                        "claim_uid": entry.claim_uid,
                        "error": str(err),
                    },
                )
                if journal is self._own.journal:
                    self._abandoned.update(e.entry_id for e in entries[index:])
                failures.append(err)
                return False
            self._abandoned.discard(entry.entry_id)
        return True

    async def _sweep_dead(self, failures: list[Exception]) -> None:
        try:
            others = [p for p in self._root.iterdir() if p.is_dir() and p != self._own.directory]
        except FileNotFoundError:
            return
        for directory in others:
            lock = InstanceLock(directory / INSTANCE_LOCK)
            if not lock.try_acquire():
                continue  # its daemon is alive and owns its entries
            try:
                journal = MintJournal(directory)
                entries = await self._entries(journal)
                if entries:
                    log.info(
                        "rolling back the journal of a daemon instance that is gone",
                        extra={"instance": directory.name, "entries": len(entries)},
                    )
                if await self._roll_back_all(journal, entries, failures):
                    await asyncio.to_thread(shutil.rmtree, directory, True)
            finally:
                lock.release()

    async def sweep(self) -> list[Exception]:
        """One pass; returns what failed (left for the next pass)."""
        failures: list[Exception] = []
        async with self._node_lock.held():
            await self._rebuild(failures)
            if self._abandoned:
                wanted = set(self._abandoned)
                entries = [
                    e for e in await self._entries(self._own.journal) if e.entry_id in wanted
                ]
                self._abandoned.intersection_update(e.entry_id for e in entries)
                await self._roll_back_all(self._own.journal, entries, failures)
            await self._sweep_dead(failures)
            await self._finish_unfinished(failures)
        return failures

    async def _finish_unfinished(self, failures: list[Exception]) -> None:
        """Finish the unprepares whose record removal gave up after the kubelet's answer
        (the whole unprepare again, every step idempotent: the entry may have been
        prepared and unprepared anew since)."""
        for uid in sorted(self._unfinished):
            async with self._claim_locks.hold(uid):
                prepared = self._checkpoint.current.claims.get(uid)
                if prepared is not None and prepared.state is ClaimState.UNPREPARING:
                    try:
                        await self._unpreparer.finish(prepared)
                    except Exception as err:
                        failures.append(err)
                        log.warning(
                            "finishing an unprepared claim failed; the sweep retries",
                            extra={"claim_uid": uid, "error": str(err)},
                        )
                        continue
                self._unfinished.discard(uid)
                self._metrics.prepared_claims.set(len(self._checkpoint.current.claims))

    async def sweep_forever(self, interval: float) -> None:
        """:meth:`sweep` every ``interval`` seconds, until cancelled, whatever fails."""
        failures_in_row = 0
        while True:
            await asyncio.sleep(sweep_delay(interval, failures_in_row))
            try:
                failures = await self.sweep()
            except Exception as err:  # the node lock, the journal directory, anything
                failures = [err]
            if not failures:
                failures_in_row = 0
                continue
            failures_in_row += 1
            for failure in failures:
                reason = error_reason(failure).value
                self._metrics.errors.labels(SWEEP_OPERATION, reason).inc()
            log.warning(
                "journal sweep pass failed; retrying with backoff",
                extra={
                    "error": str(failures[0]),
                    "failures": len(failures),
                    "passes_failed_in_row": failures_in_row,
                },
            )
