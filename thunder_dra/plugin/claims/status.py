"""This driver's entries in ``ResourceClaim.status.devices``, written off the kubelet's path.

For every device of a claim allocated from this driver the daemon keeps one entry
(``driver``, ``pool``, ``device``, ``shareID`` when the allocation has one):

- after a successful prepare: a ``Ready`` condition True, reason ``Prepared``, and
  ``data`` with the claim's zone, GPU model and Thunder client ID (a VM's client is made
  inside the guest: no client ID); never a token;
- after a failed prepare: ``Ready`` False, a reason naming the failed step and the error
  (secrets masked by the process's scrubber, at most :data:`MAX_MESSAGE` characters);
- after an unprepare: no entry.

When the allocation asks for them (enrollment before binding, :mod:`thunder_dra.kube.binding`),
each entry also carries the binding conditions the scheduler waits for: ``Enrolled`` True
with ``Ready`` True, and ``EnrollmentFailed`` True after a prepare made before binding failed
(the scheduler then drops the allocation and schedules the pod again).

The kubelet's call never waits for it: the handler hands each outcome to
:class:`ClaimStatusWriter`, which writes it in the background, the newest outcome of a
claim replacing one not yet written. The write is a server-side apply of this driver's
entries alone with its own field manager (:data:`FIELD_MANAGER`), so the entries of other
drivers and the rest of the status are left as they are; it names the claim's UID, which
the API server refuses to change, so it never lands on a claim re-created under the same
name. What the write knows of the claim comes from one of three places:

- a fresh prepare hands over the claim it read moments before: the entries are made from
  its allocation and written at once; an unprepare that replaces that outcome before it
  was written keeps the claim read, and costs no request at all when it holds none of
  this driver's entries and this writer has set none since (no write of unknown fate);
- an unprepare of a claim whose entries this writer set needs nothing of the claim: the
  apply removes them; and a repeated prepare whose entries this writer set (the
  kubelet's prepare of a claim enrolled before binding) costs no request at all;
- otherwise (another outcome without a fresh read, a retry, anything after a restart, a
  write the API server refused) the claim is read first, and written only when this
  driver's entries differ.

Writes give way to the calls something waits on (:class:`thunder_dra.plugin.state.locks.CallLull`,
shared with the kubelet handler): an outcome is written once no call has been in flight
for a short lull, or at the latest the lull's longest deferral after it was handed over.
So a claim unprepared within that time usually costs no request instead of two writes
(its entries were never set). The outcome of a prepare made before binding does not wait: the
scheduler waits for its ``Enrolled`` or ``EnrollmentFailed`` condition.

A condition keeps its ``lastTransitionTime`` while its status stays. A failed write is
logged, counted (``thunder_dra_daemon_claim_status_writes_total{result="error"}``) and
retried with backoff until it succeeds, the claim is gone or a newer outcome replaces it;
it never fails the prepare or unprepare.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter

from thunder_dra.backoff import backoff_delay
from thunder_dra.kube import errors as kube_errors
from thunder_dra.kube.binding import (
    ENROLLED,
    ENROLLMENT_FAILED,
    driver_results,
    enrollment_results,
)
from thunder_dra.kube.resources import RESOURCE_CLAIMS
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import ClaimRef, PreparedClaim
from thunder_dra.plugin.state.locks import CallLull

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "thunder-dra-daemon"
"""The server-side apply field manager of the daemon's entries (one per driver install:
a claim is prepared on one node only)."""
CONDITION_READY: Final = "Ready"
REASON_PREPARED: Final = "Prepared"
REASON_PREPARE_FAILED: Final = "PrepareFailed"
"""The reason of a failure whose step has no reason of its own."""
FAILURE_REASONS: Final = {
    ErrorReason.CLAIM: "ClaimNotPreparable",
    ErrorReason.POOL: "PoolUnknown",
    ErrorReason.KUBERNETES: "KubernetesError",
    ErrorReason.THUNDER_ZONE: "ThunderZoneFailed",
    ErrorReason.THUNDER_MINT: "ThunderMintFailed",
    ErrorReason.THUNDER_EXCHANGE: "ThunderExchangeFailed",
    ErrorReason.THUNDER_REVOKE: "ThunderRevokeFailed",
    ErrorReason.LIBTHUNDER: "LibthunderFailed",
    ErrorReason.FILESYSTEM: "FilesystemError",
    ErrorReason.INTERNAL: "InternalError",
}
"""The ``Ready`` condition's reason after a failed prepare, by the failed step."""
MAX_CONDITIONS: Final = 8
"""The API server's limit of conditions per device entry."""
MAX_DATA_BYTES: Final = 10 * 1024
"""The API server's limit of an entry's ``data`` (its JSON)."""
MAX_MESSAGE: Final = 1024
"""Characters of an error kept in the condition's message (the API allows 32768)."""
TRUNCATED: Final = " [truncated]"
DATA_KEYS: Final = ("zone", "gpuModel", "thunderClientId")
"""What ``data`` may hold: nothing else is ever written there."""
RETRY_BASE: Final = 1.0
RETRY_CAP: Final = 60.0
WRITE_CONCURRENCY: Final = 4
"""Status writes in flight at once, across claims."""
SHUTDOWN_GRACE: Final = 2.0
"""Seconds a stopping daemon waits for status writes still in flight."""
WRITE_RESULTS: Final = ("written", "unchanged", "gone", "error")

JSON = dict[str, Any]


class StatusApi(Protocol):
    """What the writer needs of :class:`thunder_dra.kube.client.KubeClient`."""

    async def get(self, path: str, *, request_timeout: float | None = None) -> JSON: ...

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> JSON: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one claim's entries say; ``ready`` None: the claim has no entries (unprepared)."""

    ready: bool | None
    reason: str = ""
    message: str = ""
    data: Mapping[str, str] | None = None
    binding_failed: bool = False
    """A prepare made while the scheduler waits (before binding) failed: the failure
    condition is set where the allocation names it."""


UNPREPARED: Final = Outcome(ready=None)


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters, marked when cut."""
    if len(message) <= limit:
        return message
    return message[: limit - len(TRUNCATED)] + TRUNCATED


def prepared_outcome(claim: PreparedClaim) -> Outcome:
    """A prepared claim's entries: Ready, with its zone, GPU model and Thunder client ID."""
    data = {"zone": claim.zone_name, "gpuModel": claim.gpu_type}
    if claim.client_id:
        data["thunderClientId"] = claim.client_id
    kind = "a VM (its client enrolls in the guest)" if claim.is_vm else "a pod"
    return Outcome(
        ready=True,
        reason=REASON_PREPARED,
        message=f"Thunder client enrolled for {kind} in zone {claim.zone_name}",
        data=data,
    )


def failed_outcome(
    message: str,
    reason: ErrorReason,
    scrub: Callable[[str], str],
    *,
    before_binding: bool = False,
) -> Outcome:
    """A failed prepare's entries: not Ready, the failed step as reason, the error scrubbed
    of every secret the process knows and bounded; ``before_binding``: the prepare was made
    while the scheduler waits, which the failure condition tells it."""
    return Outcome(
        ready=False,
        reason=FAILURE_REASONS.get(reason, REASON_PREPARE_FAILED),
        message=bounded(scrub(message)),
        binding_failed=before_binding,
    )


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def allocated_devices(claim: Mapping[str, Any], driver: str) -> list[JSON]:
    """The claim's devices allocated from ``driver``, as entry keys, once each."""
    keys: dict[tuple[str, str, str, str], JSON] = {}
    for result in driver_results(claim, driver):
        entry: JSON = {"driver": driver, "pool": result["pool"], "device": result["device"]}
        if result.get("shareID"):
            entry["shareID"] = result["shareID"]
        keys.setdefault(_key(entry), entry)
    return list(keys.values())


def binding_devices(claim: Mapping[str, Any], driver: str) -> set[tuple[str, str, str, str]]:
    """Keys of the claim's ``driver`` devices whose allocation waits for :data:`ENROLLED`."""
    return {
        _key(
            {
                "driver": driver,
                "pool": result.get("pool"),
                "device": result.get("device"),
                "shareID": result.get("shareID"),
            }
        )
        for result in enrollment_results(claim, driver)
    }


def current_entries(claim: Mapping[str, Any], driver: str) -> list[JSON]:
    """``driver``'s entries in the claim's ``status.devices``."""
    devices = (claim.get("status") or {}).get("devices") or []
    return [d for d in devices if d.get("driver") == driver]


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    kind: str, true: bool, outcome: Outcome, old: Sequence[Mapping[str, Any]], now: datetime
) -> JSON:
    """Condition ``kind`` with the outcome's reason and message; it keeps its
    ``lastTransitionTime`` while its status stays."""
    status = "True" if true else "False"
    since = _timestamp(now)
    previous = next((c for c in old if c.get("type") == kind), None)
    if previous is not None and previous.get("status") == status:
        since = str(previous.get("lastTransitionTime") or since)
    return {
        "type": kind,
        "status": status,
        "reason": outcome.reason,
        "message": outcome.message,
        "lastTransitionTime": since,
    }


def _conditions(
    outcome: Outcome, binding: bool, old: Sequence[Mapping[str, Any]], now: datetime
) -> list[JSON]:
    conditions = [_condition(CONDITION_READY, bool(outcome.ready), outcome, old, now)]
    if binding and outcome.ready:
        conditions.append(_condition(ENROLLED, True, outcome, old, now))
    elif binding and outcome.binding_failed:
        conditions.append(_condition(ENROLLMENT_FAILED, True, outcome, old, now))
    return conditions


def desired_entries(
    claim: Mapping[str, Any], driver: str, outcome: Outcome, now: datetime
) -> list[JSON]:
    """This driver's entries as they should be: one per allocated device (none when
    unprepared), each a ``Ready`` condition (and the binding conditions its allocation asks
    for) and, when prepared, its ``data``."""
    if outcome.ready is None:
        return []
    current = {_key(e): e for e in current_entries(claim, driver)}
    binding = binding_devices(claim, driver)
    entries = []
    for device in allocated_devices(claim, driver):
        key = _key(device)
        old = (current.get(key) or {}).get("conditions") or []
        entry: JSON = {**device, "conditions": _conditions(outcome, key in binding, old, now)}
        if outcome.data:
            entry["data"] = {k: outcome.data[k] for k in DATA_KEYS if k in outcome.data}
        check_entry(entry)
        entries.append(entry)
    return entries


def check_entry(entry: Mapping[str, Any]) -> None:
    """Refuse an entry over the API server's limits (a bug here, never the claim's)."""
    conditions = entry.get("conditions") or []
    if len(conditions) > MAX_CONDITIONS:
        raise ValueError(f"{len(conditions)} conditions, at most {MAX_CONDITIONS}")
    if "data" in entry:
        size = len(json.dumps(entry["data"], separators=(",", ":")).encode())
        if size > MAX_DATA_BYTES or set(entry["data"]) - set(DATA_KEYS):
            raise ValueError(f"data of {size} bytes with keys {sorted(entry['data'])}")


_COMPARED: Final = ("driver", "pool", "device", "shareID", "data")
_CONDITION_FIELDS: Final = ("type", "status", "reason", "message", "lastTransitionTime")


def _comparable(entries: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for entry in entries:
        fields = {k: entry[k] for k in _COMPARED if entry.get(k)}
        fields["conditions"] = [
            {k: c.get(k, "") for k in _CONDITION_FIELDS} for c in entry.get("conditions") or []
        ]
        out.append((repr(_key(entry)), json.dumps(fields, sort_keys=True)))
    return sorted(out)


def unchanged(current: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the stored entries already say what ``desired`` says."""
    return _comparable(current) == _comparable(desired)


def apply_body(namespace: str, name: str, uid: str, entries: Sequence[Mapping[str, Any]]) -> JSON:
    """The server-side apply of this driver's entries: the daemon's field manager owns
    exactly these; an empty list removes the ones it wrote before. The UID is immutable,
    so the API server refuses the apply (Invalid) on a namesake with another one."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": list(entries)},
    }


@dataclass(frozen=True, slots=True)
class ClaimTarget:
    """The claim an outcome is written to (its UID guards against a namesake)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class _Pending:
    """A claim's newest outcome not yet written; ``since``: when the oldest outcome it
    replaced was handed over (what the deferral is bounded from); ``urgent``: written
    without waiting for a pause in the calls."""

    target: ClaimTarget
    outcome: Outcome
    read: Mapping[str, Any] | None
    since: float
    urgent: bool = False


class ClaimStatusWriter:
    """Writes claims' outcomes to their ``status.devices`` in the background.

    :meth:`prepared`, :meth:`failed` and :meth:`unprepared` return at once; one task per
    claim writes its newest outcome, retrying with backoff while a write fails.
    """

    def __init__(
        self,
        kube: StatusApi,
        *,
        driver: str,
        scrub: Callable[[str], str],
        registry: CollectorRegistry,
        retry_base: float = RETRY_BASE,
        retry_cap: float = RETRY_CAP,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        lull: CallLull | None = None,
    ) -> None:
        self._kube = kube
        self.lull = lull or CallLull()
        self._driver = driver
        self._scrub = scrub
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        self._clock = clock
        self._pending: dict[str, _Pending] = {}
        # Claims whose stored entries this writer last set, with the outcome they say: an
        # unprepare removes them, and the same outcome again leaves them, without reading
        # the claim first.
        self._holding: dict[str, Outcome] = {}
        # Claims with an apply sent whose fate is unknown (under way, or failed: it may have
        # landed): what is stored is known again only from an answer or a read.
        self._unsure: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # The claims' tasks that wait for a pause in the calls (no request under way).
        self._deferred: dict[str, asyncio.Task[None] | None] = {}
        self._slots = asyncio.Semaphore(WRITE_CONCURRENCY)
        self.writes = Counter(
            "thunder_dra_daemon_claim_status_writes",
            "Writes of this driver's entries in ResourceClaim status.devices, by result "
            "(written, unchanged, gone: the claim no longer exists, error: retried).",
            ["result"],
            registry=registry,
        )
        for result in WRITE_RESULTS:
            self.writes.labels(result)  # each series exposed at 0 from the start

    # What the handler reports

    def prepared(
        self, claim: PreparedClaim, read: Mapping[str, Any] | None = None, *, urgent: bool = False
    ) -> None:
        """``read``: the claim object the prepare read (a fresh prepare), so the write
        need not read it again; ``urgent``: a prepare before binding, written at once."""
        self._submit(claim, prepared_outcome(claim), read, urgent=urgent)

    def failed(
        self, ref: ClaimRef, message: str, reason: ErrorReason, *, before_binding: bool = False
    ) -> None:
        self._submit(
            ref,
            failed_outcome(message, reason, self._scrub, before_binding=before_binding),
            urgent=before_binding,
        )

    def unprepared(self, ref: ClaimRef) -> None:
        self._submit(ref, UNPREPARED)

    def _submit(
        self,
        ref: ClaimRef,
        outcome: Outcome,
        read: Mapping[str, Any] | None = None,
        *,
        urgent: bool = False,
    ) -> None:
        replaced = self._pending.get(ref.uid)
        if read is None and outcome.ready is None and replaced is not None:
            read = replaced.read  # the prepare's claim read says which entries there were
        self._pending[ref.uid] = _Pending(
            ClaimTarget(ref.namespace, ref.name, ref.uid),
            outcome,
            read,
            since=replaced.since if replaced is not None else time.monotonic(),
            urgent=urgent,
        )
        task = self._tasks.get(ref.uid)
        if urgent and task is not None and self._deferred.get(ref.uid) is task:
            # It only waits for a pause (no request under way): start over without waiting.
            task.cancel()
            task = None
        if task is None or task.done():
            self._tasks[ref.uid] = asyncio.get_running_loop().create_task(
                self._drain(ref.uid), name=f"claim-status-{ref.uid}"
            )

    # Writing

    async def idle(self) -> None:
        """Wait until every outcome handed over so far is written or dropped."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Stop writing (shutdown): outcomes not written within ``grace`` seconds are
        dropped (the next start writes prepared claims' entries again). Writes no longer
        wait for a pause in the calls."""
        self.lull.open()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.idle()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _drain(self, uid: str) -> None:
        failures = 0
        try:
            while uid in self._pending:
                if not self._pending[uid].urgent:
                    me = asyncio.current_task()
                    self._deferred[uid] = me
                    try:
                        await self.lull.wait(self._pending[uid].since)
                    finally:
                        if self._deferred.get(uid) is me:
                            del self._deferred[uid]
                    if uid not in self._pending:
                        break
                pending = self._pending.pop(uid)
                target, outcome, read = pending.target, pending.outcome, pending.read
                try:
                    async with self._slots:
                        await self.write(target, outcome, read)
                except Exception as err:
                    failures += 1
                    self.writes.labels("error").inc()
                    log.warning(
                        "writing the claim's device status failed; will retry",
                        extra={
                            "claim_uid": uid,
                            "namespace": target.namespace,
                            "claim": target.name,
                            "error": self._scrub(str(err)),
                        },
                    )
                    # Retried, reading the claim, unless a newer outcome arrived meanwhile.
                    self._pending.setdefault(
                        uid, _Pending(target, outcome, None, pending.since, pending.urgent)
                    )
                    await asyncio.sleep(
                        backoff_delay(failures, base=self._retry_base, cap=self._retry_cap)
                    )
                else:
                    failures = 0
        finally:
            if self._tasks.get(uid) is asyncio.current_task():
                del self._tasks[uid]

    async def write(
        self, target: ClaimTarget, outcome: Outcome, read: Mapping[str, Any] | None = None
    ) -> None:
        """One write of ``outcome`` (the writer's tasks call it; tests too); ``read`` is the
        claim as a fresh prepare read it."""
        held = self._holding.get(target.uid)
        if read is not None and (read.get("metadata") or {}).get("uid") == target.uid:
            if (
                outcome.ready is None
                and held is None
                and target.uid not in self._unsure
                and not current_entries(read, self._driver)
            ):
                # The claim as the prepare read it holds none of this driver's entries, and
                # no write of this writer since can have set any: nothing to remove.
                self.writes.labels("unchanged").inc()
                return
            desired = desired_entries(read, self._driver, outcome, self._clock())
        elif held is not None and outcome.ready is None:
            desired = []
        elif outcome.ready and held == outcome:
            # The entries this writer set already say it: the kubelet's prepare of a claim
            # prepared before (enrolled before binding, a kubelet restart). The claim is
            # still prepared here, so its allocation is the one those entries name; a
            # failure is read again, since a claim that failed may since be allocated anew.
            self.writes.labels("unchanged").inc()
            return
        else:
            await self._write_read(target, outcome)
            return
        try:
            await self._apply(target, outcome, desired)
        except kube_errors.Invalid:
            # The claim changed since (its allocation, or a namesake): read it and decide.
            await self._write_read(target, outcome)

    async def _write_read(self, target: ClaimTarget, outcome: Outcome) -> None:
        path = RESOURCE_CLAIMS.item(target.name, target.namespace)
        try:
            claim = await self._kube.get(path)
        except kube_errors.NotFound:
            self._gone(target)
            return
        if (claim.get("metadata") or {}).get("uid") != target.uid:
            self._gone(target)  # re-created under the same name
            return
        current = current_entries(claim, self._driver)
        desired = desired_entries(claim, self._driver, outcome, self._clock())
        if unchanged(current, desired):
            self._unsure.discard(target.uid)
            self._hold(target.uid, outcome, desired)
            self.writes.labels("unchanged").inc()
            return
        await self._apply(target, outcome, desired)

    async def _apply(
        self, target: ClaimTarget, outcome: Outcome, desired: Sequence[Mapping[str, Any]]
    ) -> None:
        body = apply_body(target.namespace, target.name, target.uid, desired)
        self._unsure.add(target.uid)
        try:
            await self._kube.apply(
                RESOURCE_CLAIMS.item(target.name, target.namespace, "status"),
                body,
                field_manager=FIELD_MANAGER,
                force=True,
            )
        except kube_errors.NotFound:
            self._gone(target)
            return
        self._unsure.discard(target.uid)
        self._hold(target.uid, outcome, desired)
        self.writes.labels("written").inc()
        log.info(
            "claim device status written",
            extra={
                "claim_uid": target.uid,
                "namespace": target.namespace,
                "claim": target.name,
                "ready": outcome.ready,
                "devices": len(desired),
            },
        )

    def _hold(self, uid: str, outcome: Outcome, entries: Sequence[Mapping[str, Any]]) -> None:
        if entries:
            self._holding[uid] = outcome
        else:
            self._holding.pop(uid, None)

    def _gone(self, target: ClaimTarget) -> None:
        self._holding.pop(target.uid, None)
        self._unsure.discard(target.uid)
        self.writes.labels("gone").inc()
