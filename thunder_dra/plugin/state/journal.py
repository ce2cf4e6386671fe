"""The mint journal: every enrollment-token mint is written down before it happens.

A mint whose answer is lost, or whose result is never recorded because the daemon
crashed, would leave an enrollment nobody can revoke. So (thunder-api.md 7.3):

1. :meth:`MintJournal.begin` durably writes an entry (claim, role, purpose) and only then
   may the caller mint;
2. :meth:`MintJournal.record_token_id` adds the ``enrollmentTokenId`` of the answer,
   :meth:`MintJournal.record_client_id` the ``clientId`` after an exchange
   (:meth:`MintJournal.record_purpose` changes the purpose of an entry begun before its
   claim's consumer was known, before the mint);
3. once the result is recorded on the Client resource and in the checkpoint,
   :meth:`MintJournal.close` deletes the entry;
4. at start-up :meth:`MintJournal.open_entries` lists what is left, for rollback
   (revoke token and client, delete the Secret or claim files, then close).

One file per entry (``<entry id>.json``). :meth:`MintJournal.begin` writes it atomically
(temporary file, fsync, rename, directory fsync); each later change is one line appended to
it and fsync'ed (no rename, no directory fsync: the file already exists durably). The file
is the entry as begun (a JSON object, as the whole-rewrite format of earlier versions also
wrote it) followed by zero or more ``\n``-terminated JSON objects of changed fields, applied
in order. A last line without its ``\n`` is an append a crash interrupted: it is ignored, as
if the change had never been made (the same state as a crash just before it), and the next
change truncates it away. :meth:`MintJournal.close` deletes the file; the directory is
fsync'ed only for an entry without a token ID, because an entry with one that comes back
after a power loss is resolved by the rollback exactly as it was (committed, or revoked
again; revocations accept "already gone"). The journal never holds a token: no method takes
one and the entry model has no field for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from thunder_dra import fsutil
from thunder_dra.spans import step_span

ENTRY_SUFFIX = ".json"
_tracer = trace.get_tracer(__name__)


class JournalError(Exception):
    """A journal operation failed; the message names the entry or file."""


class JournalEntryNotFound(JournalError):
    """No open entry with that ID (already closed, or never begun)."""


class JournalCorruptError(JournalError):
    """An entry file cannot be parsed; it is left in place for the caller to set aside."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"mint journal entry {path}: {problem}")
        self.path = path


class MintRole(StrEnum):
    CLIENT = "client"
    SERVER = "server"


class MintPurpose(StrEnum):
    POD = "pod"
    VM = "vm"
    NODE_ENROLLMENT = "node-enrollment"


class JournalEntry(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    entry_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    role: MintRole
    purpose: MintPurpose
    created_at: datetime
    # Absent for node enrollment; namespace and name let a rollback find the VM's Secret.
    claim_uid: str | None = None
    claim_namespace: str | None = None
    claim_name: str | None = None
    enrollment_token_id: str | None = None
    client_id: str | None = None

    def to_json(self) -> bytes:
        return (self.model_dump_json(by_alias=True, indent=2) + "\n").encode()


class MintJournal:
    """Open mint entries in one directory (root-only, mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Serialise read-modify-write per entry; entries of different claims never wait.
        self._locks: dict[str, asyncio.Lock] = {}
        # Entries known to carry a token ID on disk: their close needs no directory fsync.
        self._revocable: set[str] = set()

    def _path(self, entry_id: str) -> Path:
        return self.directory / f"{entry_id}{ENTRY_SUFFIX}"

    async def begin(
        self,
        *,
        role: MintRole,
        purpose: MintPurpose,
        claim_uid: str | None = None,
        claim_namespace: str | None = None,
        claim_name: str | None = None,
    ) -> JournalEntry:
        """Durably record an intended mint; returns once the entry is on disk."""
        if purpose is not MintPurpose.NODE_ENROLLMENT and not claim_uid:
            raise JournalError(f"a {purpose} mint needs the claim UID")
        entry = JournalEntry(
            entry_id=uuid.uuid4().hex,
            role=role,
            purpose=purpose,
            created_at=datetime.now(UTC),
            claim_uid=claim_uid,
            claim_namespace=claim_namespace,
            claim_name=claim_name,
        )
        with step_span(
            _tracer,
            "thunder_dra.journal.begin",
            attributes={"thunder_dra.mint.purpose": str(purpose)},
        ):
            await asyncio.to_thread(self._store_sync, entry)
        return entry

    async def record_token_id(self, entry_id: str, enrollment_token_id: str) -> JournalEntry:
        """Add the minted token's ID (the revocation handle) to an open entry."""
        if not enrollment_token_id:
            raise JournalError(f"entry {entry_id}: empty enrollmentTokenId")
        return await self._update(entry_id, enrollment_token_id=enrollment_token_id)

    async def record_purpose(self, entry_id: str, purpose: MintPurpose) -> JournalEntry:
        """Change the purpose of an open entry before its mint (one begun while the
        claim's consumer was not known yet); a rollback goes by the purpose on disk."""
        return await self._update(entry_id, purpose=purpose)

    async def record_client_id(self, entry_id: str, client_id: str) -> JournalEntry:
        """Add the client ID an exchange created to an open entry."""
        if not client_id:
            raise JournalError(f"entry {entry_id}: empty clientId")
        return await self._update(entry_id, client_id=client_id)

    async def close(self, entry_id: str) -> bool:
        """Delete an entry once its result is recorded elsewhere; True if it was open.

        An entry known to hold a token ID needs no directory fsync, so its close is one
        unlink, made on the event loop: a thread hand-off would cost more than the call."""
        async with self._lock_for(entry_id):
            with step_span(_tracer, "thunder_dra.journal.close"):
                if entry_id in self._revocable:
                    removed = self._close_sync(entry_id)
                else:
                    removed = await asyncio.to_thread(self._close_sync, entry_id)
        self._locks.pop(entry_id, None)
        return removed

    async def get(self, entry_id: str) -> JournalEntry:
        return await asyncio.to_thread(self._read_sync, self._path(entry_id))

    async def open_entries(self) -> list[JournalEntry]:
        """Every open entry, oldest first (for start-up rollback).

        A file that cannot be parsed raises :class:`JournalCorruptError` naming it; the
        caller decides (typically :func:`thunder_dra.fsutil.move_aside_async` and an alert),
        because an entry silently skipped could be a leaked enrollment.
        """
        entries = await asyncio.to_thread(self._list_sync)
        return sorted(entries, key=lambda e: (e.created_at, e.entry_id))

    def open_entries_sync(self) -> list[JournalEntry]:
        """The open entries, unsorted, read in the calling thread (a worker thread)."""
        return self._list_sync()

    def _lock_for(self, entry_id: str) -> asyncio.Lock:
        return self._locks.setdefault(entry_id, asyncio.Lock())

    async def _update(self, entry_id: str, **changes: str) -> JournalEntry:
        async with self._lock_for(entry_id):
            try:
                # Read, change and durably rewrite in one worker-thread hop.
                with step_span(
                    _tracer,
                    "thunder_dra.journal.record",
                    attributes={"thunder_dra.journal.fields": sorted(changes)},
                ):
                    return await asyncio.to_thread(self._update_sync, entry_id, changes)
            except JournalEntryNotFound:
                self._locks.pop(entry_id, None)
                raise

    def _update_sync(self, entry_id: str, changes: dict[str, str]) -> JournalEntry:
        path = self._path(entry_id)
        data = _read_existing(path)
        updated = _parse_entry(path, data).model_copy(update=changes)
        line = (json.dumps({to_camel(k): v for k, v in changes.items()}) + "\n").encode()
        # Everything up to the last newline is whole; anything after it is a torn append.
        whole = data.rfind(b"\n") + 1
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            if whole < len(data):
                os.ftruncate(fd, whole)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                # Leave the file as it was (a partial line would be ignored anyway).
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, whole)
                raise
        finally:
            os.close(fd)
        if updated.enrollment_token_id:
            self._revocable.add(entry_id)
        return updated

    def _close_sync(self, entry_id: str) -> bool:
        path = self._path(entry_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        if entry_id in self._revocable:
            self._revocable.discard(entry_id)
        else:
            fsutil.fsync_dir(self.directory)
        return True

    def _store_sync(self, entry: JournalEntry) -> None:
        if not self.directory.is_dir():
            fsutil.ensure_dir(self.directory, 0o700)
        fsutil.write_atomic(self._path(entry.entry_id), entry.to_json(), mode=0o600)

    def _read_sync(self, path: Path) -> JournalEntry:
        entry = _parse_entry(path, _read_existing(path))
        if entry.enrollment_token_id:
            self._revocable.add(entry.entry_id)
        return entry

    def _list_sync(self) -> list[JournalEntry]:
        try:
            paths = sorted(self.directory.glob(f"*{ENTRY_SUFFIX}"))
        except FileNotFoundError:
            return []
        entries = []
        for path in paths:
            try:
                entries.append(self._read_sync(path))
            except JournalEntryNotFound:
                continue  # closed while listing
        return entries


def _read_existing(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as err:
        raise JournalEntryNotFound(f"mint journal entry {path.stem} is not open") from err


def _parse_entry(path: Path, data: bytes) -> JournalEntry:
    """The entry a file holds: its first JSON object with the appended changes applied."""
    try:
        text = data.decode()
        document, end = json.JSONDecoder().raw_decode(text)
        if not isinstance(document, dict):
            raise ValueError("the entry is not a JSON object")
        rest = text[end:]
        # The piece after the last newline is a torn append (or empty): not applied.
        for number, line in enumerate(rest.split("\n")[:-1], start=1):
            if not line.strip():
                continue
            change = json.loads(line)
            if not isinstance(change, dict):
                raise ValueError(f"appended change {number} is not a JSON object")
            document.update(change)
        entry = JournalEntry.model_validate(document)
    except (ValueError, ValidationError) as err:
        raise JournalCorruptError(path, str(err)) from err
    if entry.entry_id != path.stem:
        raise JournalCorruptError(path, f"holds entry {entry.entry_id}")
    return entry
