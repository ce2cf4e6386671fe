"""Checkpoint entries rebuilt from durable records: the node's ``Client`` resources.

A checkpoint that fails verification is set aside (:mod:`checkpoint`) and the daemon goes
on from an empty one; a state directory can also be lost altogether. The enrollments it
recorded are not orphaned, because prepare writes the ``Client`` record before it commits
the checkpoint and closes the mint journal entry only after: every committed claim has a
record on this node, and every attempt that did not commit still has an open journal
entry, which the journal rollback settles first.

So, after the rollback, every ``Client`` of this node that the checkpoint does not hold,
that is not being deleted, and that no open journal entry of any instance names, is:

- **re-adopted** when its ResourceClaim still exists with that UID and is allocated to
  this driver: the checkpoint entry is rebuilt from the record (zone, model, count, token
  and client IDs, consumer), the claim's allocation (devices) and the fixed file layout,
  so the kubelet's next prepare gets its answer (repairing what is missing) and its
  unprepare revokes the enrollment as usual;
- **revoked** otherwise (a claim that is gone or no longer allocated holds no running
  container): token and client, files, a VM's Secret and the record, as an unprepare of a
  claim without a checkpoint entry does.

This runs whenever a load finds the checkpoint set aside or missing (at start-up or before
a kubelet call); a run that fails (API or Thunder down) is retried by the journal sweep.
The records are listed across namespaces (``list`` on ``clients``); a daemon not allowed
to list them looks up, one by one, the records of the claims its node still has traces of
(CDI specs name the claim's namespace, the set-aside file's claims if it still parses) and
says so in the log, since a VM's claim leaves no trace on the node.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from thunder_dra.api import Client, ConsumerKind
from thunder_dra.kube import naming
from thunder_dra.kube.errors import KubeError, NotFound
from thunder_dra.plugin.claims.allocation import parse_claim
from thunder_dra.plugin.claims.prepare import PrepareDeps
from thunder_dra.plugin.claims.records import claim_from_client, parse_client
from thunder_dra.plugin.claims.unprepare import Unpreparer
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.cdi import LIBTHUNDER_CONTAINER_PATH
from thunder_dra.plugin.state.checkpoint import CheckpointStore, PreparedClaim
from thunder_dra.plugin.state.journal import MintJournal
from thunder_dra.plugin.state.locks import KeyedLocks

log = logging.getLogger(__name__)


@dataclass
class RebuildReport:
    adopted: int = 0
    revoked: int = 0


def _library_in_spec(spec_path: Path) -> Path | None:
    """The host path of libthunder.so in a claim's CDI spec, if the spec is readable."""
    try:
        document = json.loads(spec_path.read_bytes())
        for device in document.get("devices") or []:
            for mount in (device.get("containerEdits") or {}).get("mounts") or []:
                if mount.get("containerPath") == LIBTHUNDER_CONTAINER_PATH:
                    return Path(str(mount["hostPath"]))
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None
    return None


def _claim_in_spec(spec_path: Path) -> tuple[str, str] | None:
    """(namespace, claim UID) from the environment a claim's CDI spec sets."""
    try:
        document = json.loads(spec_path.read_bytes())
        env: dict[str, str] = {}
        for device in document.get("devices") or []:
            for entry in (device.get("containerEdits") or {}).get("env") or []:
                name, _, value = str(entry).partition("=")
                env[name] = value
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    namespace = env.get("THUNDER_RESOURCE_CLAIM_NAMESPACE")
    uid = env.get("THUNDER_RESOURCE_CLAIM_UID")
    return (namespace, uid) if namespace and uid else None


def _claims_in_set_aside(state_dir: Path, file_name: str) -> set[tuple[str, str]]:
    """(namespace, UID) of the claims a set-aside checkpoint names, where it still parses
    (a checksum mismatch); a torn file yields nothing."""
    found: set[tuple[str, str]] = set()
    for path in state_dir.glob(f"{file_name}.corrupt-*"):
        try:
            claims = json.loads(path.read_bytes())["payload"]["claims"]
            for uid, claim in claims.items():
                found.add((str(claim["namespace"]), str(uid)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _open_entries(journal_root: Path) -> tuple[set[str], set[str]]:
    """Claim UIDs and token IDs named by any instance's open journal entries."""
    uids: set[str] = set()
    tokens: set[str] = set()
    try:
        directories = [p for p in journal_root.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return uids, tokens
    for directory in directories:
        # An unreadable entry raises: it could name any claim, so nothing is decided
        # until recovery has set it aside.
        for entry in MintJournal(directory).open_entries_sync():
            if entry.claim_uid:
                uids.add(entry.claim_uid)
            if entry.enrollment_token_id:
                tokens.add(entry.enrollment_token_id)
    return uids, tokens


class Rebuilder:
    def __init__(
        self,
        deps: PrepareDeps,
        unpreparer: Unpreparer,
        journal_root: Path,
        claim_locks: KeyedLocks,
    ) -> None:
        self.d = deps
        self._unpreparer = unpreparer
        self._journal_root = journal_root
        self._claim_locks = claim_locks

    @property
    def _checkpoint(self) -> CheckpointStore:
        return self.d.checkpoint

    async def run(self) -> RebuildReport:
        """Adopt or revoke every record of this node the checkpoint lacks; raises on an
        API or Thunder failure (what was done so far stays done)."""
        d = self.d
        records = await self._records()
        busy_uids, busy_tokens = await asyncio.to_thread(_open_entries, self._journal_root)
        report = RebuildReport()
        for record in records:
            spec = record.spec
            uid = spec.claim.uid
            if (
                spec.node_name != d.config.node_name
                or uid in self._checkpoint.current.claims
                or record.metadata.deletion_timestamp
            ):
                continue
            if uid in busy_uids or spec.enrollment_token_id in busy_tokens:
                continue  # an open journal entry settles it
            async with self._claim_locks.hold(uid):
                if uid in self._checkpoint.current.claims:
                    continue  # a kubelet call prepared it meanwhile
                await self._reconcile(record, report)
        return report

    async def _records(self) -> list[Client]:
        d = self.d
        selector = naming.label_selector(naming.component_labels(naming.COMPONENT_DAEMON))
        try:
            listed = await d.kube.list_clients(label_selector=selector)
            return [c for c in map(parse_client, listed) if c is not None]
        except KubeError as err:
            if err.status != 403:
                raise
            log.error(
                "not allowed to list Client records; reconciling only the claims this node "
                "has traces of (grant list on clients.thundercompute.com to the daemon)",
                extra={"error": str(err)},
            )
        spec_uids = await d.cdi.list_claim_uids()
        candidates = await asyncio.to_thread(self._local_claims, spec_uids)
        records = []
        for namespace, uid in sorted(candidates):
            record = await d.records.get_client(namespace, uid)
            if record is not None:
                records.append(record)
        return records

    def _local_claims(self, spec_uids: list[str]) -> set[tuple[str, str]]:
        d = self.d
        found = _claims_in_set_aside(self._checkpoint.path.parent, self._checkpoint.path.name)
        for uid in spec_uids:
            claim = _claim_in_spec(d.cdi.path_for(uid))
            if claim is not None and claim[1] == uid:
                found.add(claim)
        return found

    async def _reconcile(self, record: Client, report: RebuildReport) -> None:
        ref = record.spec.claim
        fields = {"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name}
        prepared = await self._rebuilt(record)
        if prepared is None:
            log.warning(
                "revoking the enrollment of a claim that is gone, from its Client record",
                extra={**fields, "enrollment_token_id": record.spec.enrollment_token_id},
            )
            await self._unpreparer.clean_unknown(ref)
            report.revoked += 1
            return
        await self._checkpoint.put(prepared)
        log.warning(
            "re-adopted a prepared claim the checkpoint had lost, from its Client record",
            extra={**fields, "enrollment_token_id": prepared.enrollment_token_id},
        )
        report.adopted += 1

    async def _rebuilt(self, record: Client) -> PreparedClaim | None:
        """The checkpoint entry for a record whose claim still holds it, else None."""
        d = self.d
        ref = record.spec.claim
        try:
            claim = await d.kube.get_claim(ref.namespace, ref.name)
        except NotFound:
            return None
        try:
            allocation = parse_claim(claim, ref.uid, d.config.driver_name)
        except ClaimError:
            return None  # re-created under the name, or no longer allocated to us
        vm = record.spec.consumer_kind is ConsumerKind.VIRTUAL_MACHINE
        devices = allocation.devices_for(vm=vm)
        paths: tuple[str, ...] = ()
        if not vm:
            library = await asyncio.to_thread(_library_in_spec, d.cdi.path_for(ref.uid))
            if library is None:
                library = await d.library.current()
            paths = d.config.claim_layout.files(ref.uid, library).paths
        return claim_from_client(record, devices=devices, paths=paths)
