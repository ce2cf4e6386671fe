"""Start-up recovery and the periodic journal sweep.

At start-up, under the node's serialize lock (so a second daemon instance mid rolling
update is never disturbed):

1. load the checkpoint (a corrupt file is set aside and reported, never silently used);
2. roll back this instance's open journal entries left by a crash, and those of any dead
   instance (one whose instance lock can be taken: the kernel released it when that
   process died);
3. finish unprepares that a crash interrupted;
4. re-verify the libthunder cache (corrupt files are removed and fetched again on use);
5. repair every prepared claim: rewrite missing CDI specs (``/var/run/cdi`` is emptied by
   a reboot), re-create missing ``Client`` records, re-enroll claims whose
   ``config.json`` is gone.

Thunder or API failures here are logged and left to the sweep (journal entries) or to
the kubelet's next prepare of the claim (repairs); they never stop the daemon.

The sweep repeats step 2 every ``--sweep-interval`` for entries whose rollback failed
and for instances that died since (a rolling update's old pod killed mid-prepare).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from thunder_dra import fsutil
from thunder_dra.plugin.checkpoint import CheckpointStore, ClaimState
from thunder_dra.plugin.journal import JournalCorruptError, JournalEntry, MintJournal
from thunder_dra.plugin.libcache import LibthunderCache
from thunder_dra.plugin.locks import InstanceLock, KeyedLocks, NodeSerializeLock
from thunder_dra.plugin.prepare import Preparer
from thunder_dra.plugin.repair import Repairer
from thunder_dra.plugin.rollback import Undo
from thunder_dra.plugin.unprepare import Unpreparer

INSTANCE_LOCK = ".instance.lock"

log = logging.getLogger(__name__)


class InstanceJournal:
    """A daemon instance's journal directory and the lock that says it is alive."""

    def __init__(self, root: Path, instance_id: str) -> None:
        self.directory = root / instance_id
        self.journal = MintJournal(self.directory)
        self.lock = InstanceLock(self.directory / INSTANCE_LOCK)


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
        node_lock: NodeSerializeLock,
        claim_locks: KeyedLocks,
        abandoned: set[str],
    ) -> None:
        self._own = own
        self._root = journal_root
        self._checkpoint = checkpoint
        self._undo = undo
        self._preparer = preparer
        self._repairer = repairer
        self._unpreparer = unpreparer
        self._cache = cache
        self._node_lock = node_lock
        self._claim_locks = claim_locks
        self._abandoned = abandoned

    async def startup(self) -> None:
        async with self._node_lock.held():
            await self._roll_back_all(self._own.journal, await self._entries(self._own.journal))
            await self._sweep_dead()
            for prepared in list(self._checkpoint.current.claims.values()):
                if prepared.state is not ClaimState.PREPARED:
                    await self._attempt(
                        "finish an interrupted unprepare",
                        prepared.uid,
                        self._unpreparer.finish(prepared),
                    )
            removed = await self._cache.verify_all()
            if removed:
                log.warning("removed corrupt cached libthunder files", extra={"digests": removed})
            for prepared in list(self._checkpoint.current.claims.values()):
                if prepared.state is ClaimState.PREPARED:
                    await self._attempt(
                        "repair a prepared claim", prepared.uid, self._repairer.repair(prepared)
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
                "from Client records and the kubelet's calls",
                extra={"moved_to": str(moved)},
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

    async def _roll_back_all(self, journal: MintJournal, entries: list[JournalEntry]) -> bool:
        """Roll back ``entries``; stops at the first failure (Thunder is likely down, and
        the sweep retries what is left). True if all were resolved."""
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
                return False
            self._abandoned.discard(entry.entry_id)
        return True

    async def _sweep_dead(self) -> None:
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
                if await self._roll_back_all(journal, entries):
                    await asyncio.to_thread(shutil.rmtree, directory, True)
            finally:
                lock.release()

    async def sweep(self) -> None:
        async with self._node_lock.held():
            if self._abandoned:
                wanted = set(self._abandoned)
                entries = [
                    e for e in await self._entries(self._own.journal) if e.entry_id in wanted
                ]
                self._abandoned.intersection_update(e.entry_id for e in entries)
                await self._roll_back_all(self._own.journal, entries)
            await self._sweep_dead()

    async def sweep_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except Exception as err:
                log.warning("journal sweep failed", extra={"error": str(err)})
