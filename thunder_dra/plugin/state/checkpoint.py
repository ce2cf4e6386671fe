"""The checkpoint of prepared claims: what this node prepared, so it can be rebuilt.

Stored as one JSON file ``{"version": N, "checksum": "<sha256 hex>", "payload": {...}}``.
The checksum is the SHA-256 of the canonical payload (keys sorted, no whitespace, UTF-8),
so a truncated or edited file is detected instead of half-trusted. Writes are atomic.

Recovery policy, left to the caller: a checkpoint that fails to load is never silently
dropped. :meth:`CheckpointStore.load_or_set_aside` moves the bad file aside (kept for
inspection as ``<name>.corrupt-<time>``) and starts empty; the daemon then rebuilds its
view from what else survives (mint journal, Client resources, CDI spec files).

A failed write (disk full, EIO) changes nothing: the file keeps its previous content,
and the in-memory copy is put back to what the file holds for the claims the failed write
carried, so every decision taken afterwards (a rollback asking whether a claim was
committed) is taken from durable state. The writer is substitutable
(:data:`CheckpointWriter`) so tests can make it fail.

A checkpoint holds identifiers only (enrollment token ID, client ID), never a token:
the models have no field that could hold one and reject unknown fields.

:class:`PreparedClaim` is the daemon's one model of a claim, from the kubelet's request to
the checkpoint: prepare builds it (state ``preparing``) from the ResourceClaim, fills in
what each step learns and commits it; the kubelet's answer, the ``Client`` record and the
CDI spec are derived from it, and repair, unprepare and rebuild start from it. Only the
edges convert: the gRPC messages (:mod:`service`) and the Kubernetes objects as they are
read (:mod:`allocation`, :mod:`records`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from thunder_dra import fsutil
from thunder_dra.spans import step_span

CHECKPOINT_VERSION = 1
CHECKPOINT_FILE_NAME = "checkpoint.json"
_tracer = trace.get_tracer(__name__)

# (path, content, mode): replace the file atomically and durably, or raise OSError.
CheckpointWriter = Callable[[Path, bytes, int], None]


def write_file(path: Path, content: bytes, mode: int) -> None:
    """The production :data:`CheckpointWriter`: :func:`thunder_dra.fsutil.write_atomic`."""
    fsutil.write_atomic(path, content, mode=mode)


class CheckpointError(Exception):
    """The checkpoint file cannot be used; the message names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {path}: {problem}")
        self.path = path
        self.problem = problem


class CheckpointCorruptError(CheckpointError):
    """Unreadable JSON, a wrong checksum, or a payload that does not match the schema."""


class CheckpointVersionError(CheckpointError):
    """Written by a daemon with another checkpoint format version."""


class ClaimRef(Protocol):
    """What names a claim: the kubelet's request message, a ``Client``'s ``spec.claim``,
    or a :class:`PreparedClaim` itself."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class ClaimState(StrEnum):
    PREPARING = "preparing"
    PREPARED = "prepared"
    UNPREPARING = "unpreparing"


class Consumer(_Model):
    """Who uses the claim: a pod, or a KubeVirt VM (through its virt-launcher pod)."""

    kind: Literal["pod", "vm"]
    name: str


class PreparedDevice(_Model):
    """One allocated device as the kubelet gets it back (NodePrepareResourcesResponse)."""

    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()


class PreparedClaim(_Model):
    uid: str = Field(min_length=1)
    namespace: str
    name: str
    consumer: Consumer
    zone_name: str
    zone_id: str
    gpu_type: str  # as Thunder spells it
    gpu_count: int = Field(gt=0)
    enrollment_token_id: str | None = None
    client_id: str | None = None
    secret_name: str | None = None  # the VM's <claim>-thunder-setup Secret
    devices: tuple[PreparedDevice, ...] = ()
    paths: tuple[str, ...] = ()  # files and directories this claim wrote on the node
    state: ClaimState = ClaimState.PREPARING

    @property
    def is_vm(self) -> bool:
        return self.consumer.kind == "vm"

    @property
    def hostname(self) -> str:
        """What the exchange names the client after (thunder-api.md 2.9): pod, else claim."""
        return self.consumer.name or self.name

    @property
    def library(self) -> Path | None:
        """The cached ``libthunder.so`` the claim's CDI spec mounts (pods only)."""
        for entry in self.paths:
            if entry.endswith("/libthunder.so"):
                return Path(entry)
        return None


class Checkpoint(_Model):
    """The payload: prepared claims by UID."""

    claims: dict[str, PreparedClaim] = Field(default_factory=dict)

    def with_claim(self, claim: PreparedClaim) -> Checkpoint:
        return Checkpoint(claims={**self.claims, claim.uid: claim})

    def without_claim(self, uid: str) -> Checkpoint:
        return Checkpoint(claims={k: v for k, v in self.claims.items() if k != uid})


def _canonical(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def payload_checksum(payload: Any) -> str:
    """SHA-256 hex of the canonical JSON form of a decoded payload."""
    return hashlib.sha256(_canonical(payload)).hexdigest()


class EncodedClaims:
    """Each claim's canonical JSON (``"<uid>":{...}``), kept while the claim is unchanged,
    so a checkpoint write encodes only the claims that changed since the previous write.
    Claims are immutable: an unchanged claim is the very same object. One writer at a
    time."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[PreparedClaim, bytes]] = {}

    def payload(self, checkpoint: Checkpoint) -> bytes:
        """Exactly ``_canonical(checkpoint.model_dump(mode="json", by_alias=True))``."""
        kept: dict[str, tuple[PreparedClaim, bytes]] = {}
        parts: list[bytes] = []
        for uid in sorted(checkpoint.claims):
            claim = checkpoint.claims[uid]
            cached = self._by_uid.get(uid)
            if cached is not None and cached[0] is claim:
                part = cached[1]
            else:
                part = (
                    _canonical(uid)
                    + b":"
                    + _canonical(claim.model_dump(mode="json", by_alias=True))
                )
            kept[uid] = (claim, part)
            parts.append(part)
        self._by_uid = kept
        return b'{"claims":{' + b",".join(parts) + b"}}"


def encode_checkpoint(checkpoint: Checkpoint, encoded: EncodedClaims | None = None) -> bytes:
    """The file content for ``checkpoint``: the canonical document, one line.

    The payload is serialised once, in canonical form, and that text is both what is
    hashed and what is written (a pretty-printed copy would mean a second, much slower
    pure-Python encoding of every claim on every write). The result is exactly
    ``json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
    With ``encoded`` (the store's), claims unchanged since its last use are not encoded
    again.
    """
    canonical = (encoded or EncodedClaims()).payload(checkpoint)
    checksum = hashlib.sha256(canonical).hexdigest()
    return b"".join(
        (
            b'{"checksum":"',
            checksum.encode(),
            b'","payload":',
            canonical,
            b',"version":',
            str(CHECKPOINT_VERSION).encode(),
            b"}\n",
        )
    )


def decode_checkpoint(data: bytes, path: Path) -> Checkpoint:
    """Parse and verify file content; raises a :class:`CheckpointError` naming ``path``."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorruptError(path, f"not valid JSON ({err})") from err
    if not isinstance(document, dict) or set(document) != {"version", "checksum", "payload"}:
        raise CheckpointCorruptError(path, "expected exactly the keys version, checksum, payload")
    version = document["version"]
    if version != CHECKPOINT_VERSION:
        raise CheckpointVersionError(
            path, f"format version {version!r}, this daemon reads {CHECKPOINT_VERSION}"
        )
    actual = payload_checksum(document["payload"])
    if document["checksum"] != actual:
        raise CheckpointCorruptError(
            path, f"checksum mismatch (stored {document['checksum']!r}, computed {actual!r})"
        )
    try:
        return Checkpoint.model_validate(document["payload"])
    except ValidationError as err:
        raise CheckpointCorruptError(path, f"payload does not match the schema: {err}") from err


FileIdentity = tuple[int, int, int, int, int]
"""A file's device, inode, size, modification and change time (ns): what tells the file
as this process last read or wrote it from any later version of it."""


def _identity(result: os.stat_result) -> FileIdentity:
    return (result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns, result.st_ctime_ns)


def _read_identified(path: Path) -> tuple[bytes, FileIdentity | None]:
    """The file's content and the identity of exactly that content (None if the file
    changed while it was read)."""
    with path.open("rb") as file:
        before = _identity(os.fstat(file.fileno()))
        data = file.read()
        after = _identity(os.fstat(file.fileno()))
    return data, before if before == after else None


def _stat_identity(path: Path) -> FileIdentity | None:
    try:
        return _identity(os.stat(path))
    except FileNotFoundError:
        return None


class CheckpointStore:
    """The checkpoint file plus its in-memory copy.

    Call :meth:`load` (or :meth:`load_or_set_aside`) once at start-up, then
    :meth:`put` / :meth:`drop` as claims are prepared and unprepared. Each returns once
    the change is on disk. Concurrent changes share writes (group commit): a change made
    while a write is in flight is persisted by the next write, together with every other
    change made meanwhile, so twenty claims prepared at once cost two fsync'ed writes, not
    twenty.

    If a write fails the caller sees the error and its change is undone in memory: the
    claim is put back as the file holds it (:attr:`durable`), unless it changed again
    since (that later change has its own write to wait for). So after a failure
    :attr:`current` never holds a claim the file does not, and a rollback deciding from
    it decides from what survives a crash.
    """

    def __init__(
        self,
        directory: Path,
        file_name: str = CHECKPOINT_FILE_NAME,
        *,
        writer: CheckpointWriter = write_file,
    ) -> None:
        self.path = directory / file_name
        self._writer = writer
        self._current = Checkpoint()
        self._durable = Checkpoint()  # what the file holds
        self.found = False  # whether the file existed at the last load (or was written)
        self._lock = asyncio.Lock()
        self._changes = 0  # mutations of _current so far
        self._persisted = 0  # value of _changes that the file reflects
        # The file as _durable was last read from or written to it; None: unknown.
        self._identity: FileIdentity | None = None
        self._encoded = EncodedClaims()  # used by one write at a time (under _lock)
        # Directories the next write fsyncs before the file (drop's synced_first).
        self._synced_first: set[Path] = set()

    @property
    def current(self) -> Checkpoint:
        return self._current

    @property
    def durable(self) -> Checkpoint:
        """The checkpoint as last read from or written to the file."""
        return self._durable

    async def load(self) -> Checkpoint:
        """Read and verify the file; a missing file is an empty checkpoint.

        A file this process last read or wrote, unchanged since (same device, inode, size,
        modification and change time), is not read again: :attr:`durable` is what it
        holds. Every write replaces the file by a rename, so another daemon's write is a
        new inode, and a change in place moves its times or size."""
        identity = self._identity
        # One stat of a local file, on the loop: a thread hand-off would cost more.
        if identity is not None and _stat_identity(self.path) == identity:
            self._current = self._durable
            self._persisted = self._changes
            self.found = True
            return self._durable
        self._identity = None
        try:
            data, identity = await asyncio.to_thread(_read_identified, self.path)
        except FileNotFoundError:
            checkpoint = Checkpoint()
            self.found = False
        else:
            checkpoint = decode_checkpoint(data, self.path)
            self.found = True
        self._current = self._durable = checkpoint
        self._persisted = self._changes
        if self.found:
            self._identity = identity
        return checkpoint

    async def load_or_set_aside(self) -> tuple[Checkpoint, Path | None]:
        """:meth:`load`; on a corrupt file move it aside and start empty.

        Returns the checkpoint and, if the file was set aside, its new path (the caller
        logs it and rebuilds from other state). A :class:`CheckpointVersionError` is
        raised, not set aside: the file is intact, and a daemon of the matching version
        (after a rollback, say) can still use it.
        """
        try:
            return await self.load(), None
        except CheckpointCorruptError:
            moved = await fsutil.move_aside_async(self.path)
            self._identity = None
            self.found = False
            self._current = self._durable = Checkpoint()
            self._persisted = self._changes
            return self._current, moved

    async def save(self, checkpoint: Checkpoint) -> None:
        """Replace the whole checkpoint; on failure memory is put back to the file's."""
        self._mutate(checkpoint)

        def revert() -> None:
            if self._current is checkpoint:
                self._mutate(self._durable)

        await self._flush(revert)

    async def put(self, claim: PreparedClaim) -> None:
        """Add or replace one claim and persist."""
        self._mutate(self._current.with_claim(claim))
        await self._flush(lambda: self._revert(claim.uid, claim))

    async def drop(self, uid: str, *, synced_first: Iterable[Path] = ()) -> None:
        """Remove one claim (absent is fine) and persist.

        ``synced_first``: directories whose changes the drop must not outlive (an
        unprepare's removals, not yet fsync'ed): the write that carries the drop fsyncs
        them before it writes the file, one fsync each for every drop it carries."""
        if uid in self._current.claims:
            self._synced_first.update(synced_first)
            self._mutate(self._current.without_claim(uid))
            await self._flush(lambda: self._revert(uid, None))

    def _mutate(self, checkpoint: Checkpoint) -> None:
        # No await between reading and replacing _current: atomic on the event loop.
        self._current = checkpoint
        self._changes += 1

    def _revert(self, uid: str, mine: PreparedClaim | None) -> None:
        """Undo a failed change of claim ``uid`` (``mine``: what it set, None for a drop)."""
        if self._current.claims.get(uid) is not mine:
            return  # changed again since the failed write: that change has its own write
        durable = self._durable.claims.get(uid)
        if durable is None:
            if uid in self._current.claims:
                self._mutate(self._current.without_claim(uid))
        else:
            self._mutate(self._current.with_claim(durable))

    async def _flush(self, revert: Callable[[], None]) -> None:
        wanted = self._changes
        async with self._lock:
            if self._persisted >= wanted:
                return  # a write that started after our change already covered it
            snapshot, covers = self._current, self._changes
            # Taken with the snapshot: every drop it carries asked for these first.
            synced_first, self._synced_first = self._synced_first, set()
            # Whatever the outcome, the file may no longer be what _durable was read from.
            self._identity = None
            try:
                # Encoded in the writer thread too: O(prepared claims), off the event
                # loop. The snapshot is immutable (frozen models, a dict never mutated).
                with step_span(
                    _tracer,
                    "thunder_dra.checkpoint.write",
                    attributes={"thunder_dra.checkpoint.claims": len(snapshot.claims)},
                ):
                    identity = await asyncio.to_thread(self._write_sync, snapshot, synced_first)
            except Exception:
                # The file is unchanged (atomic write). Undone under the lock, so the next
                # write, whoever makes it, no longer carries this change. The directories
                # go back: a drop of this write still pending is carried by the next one.
                revert()
                self._synced_first |= synced_first
                raise
            self._persisted = max(self._persisted, covers)
            self._durable = snapshot
            self._identity = identity
            self.found = True

    def _write_sync(
        self, snapshot: Checkpoint, synced_first: Iterable[Path] = ()
    ) -> FileIdentity | None:
        """Fsync ``synced_first``, then write ``snapshot``; the identity of the file written
        (taken under the node lock, which every writer of the file holds)."""
        fsutil.fsync_dirs(*sorted(synced_first))
        content = encode_checkpoint(snapshot, self._encoded)
        if not self.path.parent.is_dir():
            # Only a missing directory gets a mode: it may be the shared plugin directory.
            fsutil.ensure_dir(self.path.parent, 0o700)
        self._writer(self.path, content, 0o600)
        return _stat_identity(self.path)
