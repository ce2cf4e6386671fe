"""Enrollment before binding: claims the scheduler waits on, enrolled by the chosen node.

With ``--enroll-before-binding`` (``spec.operator.enrollBeforeBinding.enabled``) the
operator publishes every device with ``bindsToNode`` and the binding conditions of
:mod:`thunder_dra.kube.binding`. In PreBind the scheduler writes the claim's allocation
(its ``nodeSelector`` naming the chosen node) and ``reservedFor``, then polls the claim
every 5 s until the condition ``Enrolled`` or ``EnrollmentFailed`` is True.

:class:`BindingWatcher` watches ResourceClaims and, for each one allocated to this node
that waits for ``Enrolled``, runs the whole prepare at once: Thunder mint and exchange
(journaled as always), files, ``Client`` record, CDI spec and checkpoint. The status
writer then sets ``Enrolled`` (or ``EnrollmentFailed`` with the error, and the scheduler
drops the allocation and tries again; the operator taints the device for a cool-down so
the retry lands elsewhere). The kubelet's prepare later finds the claim in the
checkpoint and only checks its files.

A claim enrolled here that the kubelet never prepares is released by the watcher: when
the claim is deleted, its allocation cleared, or it is allocated anew elsewhere, the
claim is unprepared as the kubelet would (revocation, files, record). The watcher
applies the same rule to every claim in the checkpoint, which is safe because an
allocation is only cleared once no pod holds the claim.

Changes reach the watcher through short watch windows (:meth:`KubeClient.watch_window`):
a change is seen within :data:`~thunder_dra.kube.client.WATCH_WINDOW` seconds, well
inside the scheduler's 5 s poll. Every :data:`RESYNC` seconds, and whenever the watch
falls too far behind, the claims are listed again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from thunder_dra.backoff import backoff_delay
from thunder_dra.kube import bodies
from thunder_dra.kube import errors as kube_errors
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED, enrollment_results
from thunder_dra.kube.resources import PODS, RESOURCE_CLAIMS
from thunder_dra.plugin.claims.allocation import reserved_pods
from thunder_dra.plugin.state.checkpoint import CheckpointStore, ClaimRef, PreparedClaim

log = logging.getLogger(__name__)

JSON = dict[str, Any]
RESYNC: Final = 300.0
"""Seconds between full listings of the claims."""
RETRY_BASE: Final = 1.0
RETRY_CAP: Final = 30.0


class ClaimWatchApi(Protocol):
    """What the watcher needs of :class:`thunder_dra.kube.client.KubeClient`."""

    async def get(self, path: str, *, request_timeout: float | None = None) -> JSON: ...

    async def list_with_version(self, collection: str) -> tuple[list[JSON], str]: ...

    async def watch_window(
        self, collection: str, *, resource_version: str
    ) -> tuple[list[JSON], str]: ...


class BindingHandler(Protocol):
    """What the watcher asks of the claim service."""

    async def prepare_before_binding(self, ref: ClaimRef) -> PreparedClaim | str: ...

    async def release(self, ref: ClaimRef) -> str: ...


def allocated_node(claim: Mapping[str, Any]) -> str | None:
    """The node a claim's allocation is bound to (``bindsToNode``: one ``matchFields``
    term on ``metadata.name``), or None when it names no single node."""
    allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
    terms = _mapping(allocation.get("nodeSelector")).get("nodeSelectorTerms")
    if not isinstance(terms, list) or len(terms) != 1:
        return None
    fields = _mapping(terms[0]).get("matchFields")
    if not isinstance(fields, list) or len(fields) != 1:
        return None
    term = _mapping(fields[0])
    values = term.get("values")
    if term.get("key") != "metadata.name" or term.get("operator") != "In":
        return None
    if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
        return None
    return values[0]


def waits_for_enrollment(claim: Mapping[str, Any], driver: str) -> bool:
    """Whether the scheduler waits for this driver's ``Enrolled`` on the claim: an
    allocated device asks for it and no entry says ``Enrolled`` or ``EnrollmentFailed``
    yet, and the claim is reserved for a pod."""
    status = _mapping(claim.get("status"))
    if not status.get("reservedFor") or not enrollment_results(claim, driver):
        return False
    devices = status.get("devices")
    for entry in _list(devices):
        if not isinstance(entry, Mapping) or entry.get("driver") != driver:
            continue
        for condition in _list(entry.get("conditions")):
            if (
                isinstance(condition, Mapping)
                and condition.get("type") in (ENROLLED, ENROLLMENT_FAILED)
                and condition.get("status") == "True"
            ):
                return False
    return True


def reserved_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """The name and UID of the first pod the claim is reserved for (the consumer prepare
    takes), or None."""
    for entry in reserved_pods(claim):
        name, uid = entry["name"], entry.get("uid")
        if isinstance(name, str):
            return name, uid if isinstance(uid, str) else ""
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[Any]:
    """A JSON array (a list, or a tuple built in code); anything else is empty."""
    return value if isinstance(value, list | tuple) else ()


@dataclass(frozen=True, slots=True)
class WatchedClaim:
    """A claim as the watch names it (a :class:`ClaimRef`)."""

    namespace: str
    name: str
    uid: str


def _ref(claim: Mapping[str, Any]) -> WatchedClaim | None:
    meta = bodies.metadata(claim)
    uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str)):
        return None
    return WatchedClaim(namespace=namespace, name=name, uid=uid)


class BindingWatcher:
    """Enrolls this node's claims while the scheduler waits, and releases the ones that
    never reach the kubelet."""

    def __init__(
        self,
        kube: ClaimWatchApi,
        handler: BindingHandler,
        checkpoint: CheckpointStore,
        *,
        driver: str,
        node_name: str,
        resync: float = RESYNC,
    ) -> None:
        self._kube = kube
        self._handler = handler
        self._checkpoint = checkpoint
        self._driver = driver
        self._node = node_name
        self._resync = resync
        self._busy: dict[str, asyncio.Task[None]] = {}
        self._later: dict[str, Mapping[str, Any]] = {}

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                failures += 1
                delay = backoff_delay(failures, base=RETRY_BASE, cap=RETRY_CAP)
                log.warning(
                    "watching claims waiting to bind failed; retrying",
                    extra={"error": str(err), "retry_in": delay},
                )
                await asyncio.sleep(delay)
            else:
                failures = 0

    async def _follow(self) -> None:
        """One listing, then watch windows until the next resync or a stale version."""
        collection = RESOURCE_CLAIMS.collection()
        claims, version = await self._kube.list_with_version(collection)
        self.reconcile(claims)
        listed = time.monotonic()
        while time.monotonic() - listed < self._resync:
            try:
                events, version = await self._kube.watch_window(
                    collection, resource_version=version
                )
            except kube_errors.Gone:
                return
            for event in events:
                look = self._deleted if event.get("type") == "DELETED" else self._consider
                self._safely(look, event.get("object") or {})

    def reconcile(self, claims: Sequence[Mapping[str, Any]]) -> None:
        """A full listing: enroll what waits; a checkpointed claim the listing lacks is
        looked up (it may be newer than the listing) and released if it is gone."""
        listed = set()
        for claim in claims:
            ref = _ref(claim)
            if ref is not None:
                listed.add(ref.uid)
                self._safely(self._consider, claim)
        for uid, prepared in self._checkpoint.current.claims.items():
            if uid not in listed:
                self._start(uid, functools.partial(self._check_unlisted, prepared))

    def _safely(self, look: Callable[[Mapping[str, Any]], None], claim: Mapping[str, Any]) -> None:
        """One claim's look, kept from stopping the others: a claim the watcher cannot read
        is logged and skipped."""
        try:
            look(claim)
        except Exception as err:
            log.error(
                "a claim could not be read for enrollment before binding; skipped",
                extra={"claim_uid": str(bodies.metadata(claim).get("uid")), "error": str(err)},
            )

    def _consider(self, claim: Mapping[str, Any]) -> None:
        ref = _ref(claim)
        if ref is None:
            return
        if ref.uid in self._busy:
            self._later[ref.uid] = claim  # looked at again when the claim's work ends
            return
        node = allocated_node(claim)
        if node == self._node and waits_for_enrollment(claim, self._driver):
            if ref.uid not in self._checkpoint.current.claims:
                pod = reserved_pod(claim)
                self._start(ref.uid, lambda: self._enroll(ref, pod))
            return
        allocated = _mapping(claim.get("status")).get("allocation")
        if not allocated:
            self._release_if_prepared(ref, "the claim's allocation was cleared")
        elif node is not None and node != self._node:
            self._release_if_prepared(ref, f"the claim is allocated on node {node}")

    def _deleted(self, claim: Mapping[str, Any]) -> None:
        ref = _ref(claim)
        if ref is None:
            return
        self._later.pop(ref.uid, None)
        if ref.uid in self._busy:
            self._later[ref.uid] = {**claim, "status": {}}  # released once the work ends
            return
        self._release_if_prepared(ref, "the claim was deleted")

    def _release_if_prepared(self, ref: ClaimRef, why: str) -> None:
        if ref.uid in self._checkpoint.current.claims:
            self._start(ref.uid, lambda: self._release(ref, why))

    def _start(self, uid: str, work: Callable[[], Awaitable[None]]) -> None:
        if uid in self._busy:
            return
        task = asyncio.get_running_loop().create_task(self._guarded(work), name=f"binding-{uid}")
        self._busy[uid] = task
        task.add_done_callback(lambda done: self._done(uid, done))

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception as err:
            # The handler answers per claim; anything else is logged, and the next
            # listing looks at the claim again.
            log.error("binding work failed", extra={"error": str(err)}, exc_info=True)

    def _done(self, uid: str, done: asyncio.Task[None]) -> None:
        if self._busy.get(uid) is done:
            del self._busy[uid]
        later = self._later.pop(uid, None)
        if later is not None:
            self._safely(self._consider, later)

    async def _check_unlisted(self, ref: ClaimRef) -> None:
        try:
            claim = await self._kube.get(RESOURCE_CLAIMS.item(ref.name, ref.namespace))
        except kube_errors.NotFound:
            claim = None
        if claim is not None and bodies.metadata(claim).get("uid") == ref.uid:
            self._later[ref.uid] = claim
            return
        await self._release(ref, "the claim no longer exists")

    async def _enroll(self, ref: ClaimRef, pod: tuple[str, str] | None) -> None:
        if pod is not None and await self._past_binding(ref, pod):
            return
        log.info(
            "enrolling a claim before binding",
            extra={"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name},
        )
        await self._handler.prepare_before_binding(ref)

    async def _past_binding(self, ref: ClaimRef, pod: tuple[str, str]) -> bool:
        """Whether the pod the claim is reserved for no longer waits to be bound: it is
        bound already, has ended or is going away. Such a claim lacks ``Enrolled``
        because the kubelet unprepared it (the pod's containers ended) before the claim
        controller dropped the reservation; no scheduler waits on it, so enrolling it
        again would only cost an enrollment to release later."""
        name, uid = pod
        try:
            obj = await self._kube.get(PODS.item(name, ref.namespace))
        except kube_errors.NotFound:
            why = "the pod is gone"
        else:
            if uid and bodies.metadata(obj).get("uid") != uid:
                why = "the pod is gone"  # another pod of the same name
            elif bodies.metadata(obj).get("deletionTimestamp"):
                why = "the pod is being deleted"
            elif _mapping(obj.get("spec")).get("nodeName"):
                why = "the pod is bound already"
            elif _mapping(obj.get("status")).get("phase") in ("Succeeded", "Failed"):
                why = "the pod has ended"
            else:
                return False
        log.info(
            "not enrolling a claim before binding: its pod does not wait for binding",
            extra={"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name,
                   "pod": name, "why": why},
        )  # fmt: skip
        return True

    async def _release(self, ref: ClaimRef, why: str) -> None:
        log.info(
            "releasing a claim the kubelet no longer needs",
            extra={
                "claim_uid": ref.uid,
                "namespace": ref.namespace,
                "claim": ref.name,
                "why": why,
            },
        )
        await self._handler.release(ref)

    async def idle(self) -> None:
        """Wait for the enrollments and releases started so far (tests, shutdown)."""
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)
