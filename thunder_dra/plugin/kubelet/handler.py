"""The kubelet's calls, claim by claim: locking, tracing, metrics, logs and per-claim errors.

One NodePrepareResources call holds the node's serialize lock (shared by calls in this
process, exclusive against another daemon instance on the node) and prepares its claims
concurrently, each under its own claim-UID lock. At most ``--claim-concurrency`` claims
(default 20) are worked on at once across all calls (:class:`ClaimSlots`); the others
wait their turn, so a call with hundreds of claims costs a bounded number of threads,
connections and requests in flight, and the zone and pool lookups those claims share are
made once (:mod:`allocation`). A kubelet that gives up on a call (its
45 s deadline) cancels the RPC, but never the work: claim work runs shielded, so an
enrollment is never abandoned half-way by a cancellation.

Failures become per-claim errors ``claim <ns>/<name>: <what failed>``, never a failed
call; each also goes to the log, to ``thunder_dra_daemon_errors_total`` and, for prepare,
to a Warning event on the ResourceClaim. Each claim's outcome (prepared, failed,
unprepared) is then handed to the claim status writer (:mod:`thunder_dra.plugin.claims.status`),
which writes it to the claim's ``status.devices`` after the answer, off the kubelet's wait.
The ``Client`` record's own work is also done after the answer, under the claim's lock:
its status after a prepare, its removal after an unprepare (the enrollment revoked and
the files removed before the answer; :mod:`thunder_dra.plugin.claims.unprepare`).

That work, and the claim status writes, give way to the calls something waits on: each
request of it waits until no kubelet call (nor a prepare before binding) has been in
flight for ``LULL_SECONDS``, or until ``LONGEST_DEFERRAL_SECONDS`` have passed since
its answer (:class:`CallLull`). A claim unprepared before its prepare's record
status write started has that write cancelled: the record is removed anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from prometheus_client import CollectorRegistry, Gauge

from thunder_dra.kube.client import JSON
from thunder_dra.kube.errors import KubeError
from thunder_dra.plugin.claims.lifecycle import ClaimLifecycle
from thunder_dra.plugin.claims.prepare import Preparer
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.claims.repair import Repairer
from thunder_dra.plugin.claims.status import ClaimStatusWriter
from thunder_dra.plugin.claims.unprepare import Unpreparer
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.metrics import DaemonMetrics, ErrorReason
from thunder_dra.plugin.state.checkpoint import CheckpointStore, ClaimRef, ClaimState, PreparedClaim
from thunder_dra.plugin.state.locks import CallLull, KeyedLocks, NodeSerializeLock

log = logging.getLogger(__name__)
_T = TypeVar("_T")
DEFAULT_CLAIM_CONCURRENCY = 20  # --claim-concurrency
# The Client record's work after an answer: tries, and the pause before the n-th retry
# (n times this), short enough that a shutdown's drain is not held for long.
RECORD_ATTEMPTS = 3
RECORD_RETRY_SECONDS = 0.5
# The kubelet's DRA service (v1 and v1beta1 alike), as the call spans name it.
_DRA_SERVICE = "DRAPlugin"


class ClaimSlots:
    """Bounded concurrency of claim work (prepare and unprepare), with gauges of the
    claims in flight, the most ever in flight at once, and the bound."""

    def __init__(self, limit: int, registry: CollectorRegistry) -> None:
        if limit < 1:
            raise ValueError(f"claim concurrency must be at least 1, got {limit}")
        self._semaphore = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.peak = 0
        self._in_flight = Gauge(
            "thunder_dra_daemon_claims_in_flight",
            "Claims being prepared or unprepared right now.",
            registry=registry,
        )
        self._peak = Gauge(
            "thunder_dra_daemon_claims_in_flight_peak",
            "The most claims prepared or unprepared at once since the daemon started.",
            registry=registry,
        )
        Gauge(
            "thunder_dra_daemon_claim_concurrency_limit",
            "At most this many claims are worked on at once (--claim-concurrency).",
            registry=registry,
        ).set(limit)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._semaphore:
            self.in_flight += 1
            if self.in_flight > self.peak:
                self.peak = self.in_flight
                self._peak.set(self.peak)
            self._in_flight.set(self.in_flight)
            try:
                yield
            finally:
                self.in_flight -= 1
                self._in_flight.set(self.in_flight)


@dataclass
class _RecordWrite:
    """The record work after a prepare's answer: its task, and whether a request of it is
    under way (it holds the claim's lock)."""

    task: asyncio.Future[bool] | None = None
    under_way: bool = False


def _classify(err: Exception) -> tuple[str, ErrorReason]:
    if isinstance(err, ClaimError):
        return str(err), err.reason
    if isinstance(err, KubeError):
        return str(err), ErrorReason.KUBERNETES
    if isinstance(err, OSError):
        return f"file system: {err}", ErrorReason.FILESYSTEM
    return f"internal error: {type(err).__name__}: {err}", ErrorReason.INTERNAL


class ClaimService:
    """Implements :class:`thunder_dra.plugin.kubelet.service.ClaimHandler`."""

    def __init__(
        self,
        *,
        preparer: Preparer,
        repairer: Repairer,
        unpreparer: Unpreparer,
        checkpoint: CheckpointStore,
        records: Records,
        node_lock: NodeSerializeLock,
        claim_locks: KeyedLocks,
        metrics: DaemonMetrics,
        tracer: Tracer,
        slots: ClaimSlots | None = None,
        status: ClaimStatusWriter | None = None,
        unfinished: set[str] | None = None,
        lull: CallLull | None = None,
    ) -> None:
        self._preparer = preparer
        self._repairer = repairer
        self._unpreparer = unpreparer
        self._checkpoint = checkpoint
        self._records = records
        self._node_lock = node_lock
        self._claim_locks = claim_locks
        self._metrics = metrics
        self._tracer = tracer
        self._slots = slots or ClaimSlots(DEFAULT_CLAIM_CONCURRENCY, metrics.registry)
        self._running: set[asyncio.Task[Any]] = set()
        self._status = status
        # A just-prepared claim's record status write, by claim UID, until it is done.
        self._enrolled_writes: dict[str, _RecordWrite] = {}
        # Claims whose record removal after the answer gave up: the sweep finishes them.
        self._unfinished = unfinished if unfinished is not None else set()
        # Counts the calls waited on; the record work after an answer waits for a pause.
        self.lull = lull or CallLull()

    def _track(self, work: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
        """Run ``work`` as a task :meth:`drain` waits for."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def _shielded(self, work: Coroutine[Any, Any, _T]) -> _T:
        return await asyncio.shield(self._track(work))

    async def _waited_on(self, work: Awaitable[_T]) -> _T:
        """``work``, counted as a call in flight (:class:`CallLull`) for as long as it
        runs, past a cancelled RPC too."""
        async with self.lull.call():
            return await work

    async def drain(self) -> None:
        """Wait for claim work still running after its RPC was cancelled or answered
        (shutdown, tests)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    def _after_answer(self, prepared: PreparedClaim, *, created: bool) -> None:
        """Once the kubelet has its answer, set the ``Client`` record of a claim just
        prepared ``Enrolled`` (``created``), or check a repeated prepare's record; under
        the node lock. The check (which may write the record again) holds the claim's lock
        too, so an unprepare of the claim waits for it. The status write does not: it
        patches only the record of this enrollment (:meth:`Records.mark_enrolled`), so an
        unprepare goes on beside a write in flight, and cancels one not yet under way
        (waiting for the lock, or for its retry), since it removes the record anyway. A
        request is never cancelled in flight: that would close its pooled connection to
        the API server. A failure is tried again, at most :data:`RECORD_ATTEMPTS` times,
        the lock released between tries; after that the next repeated prepare, or the
        start-up repair, finishes it. Each try first waits for a pause in the calls
        (:class:`CallLull`, at most its ``longest`` seconds after the answer): until it
        starts, an unprepare cancels the status write, which then costs no request."""
        write = _RecordWrite()

        async def restore() -> None:
            if created:
                write.under_way = True
                try:
                    await self._repairer.restore_record(prepared, created=True)
                finally:
                    write.under_way = False
                return
            async with self._claim_locks.hold(prepared.uid):
                await self._repairer.restore_record(prepared)

        write.task = self._track(
            self._attempts("writing a prepared claim's Client record", prepared, restore)
        )
        if created:
            self._enrolled_writes[prepared.uid] = write
            write.task.add_done_callback(lambda _: self._forget_enrolled_write(prepared.uid, write))

    async def _attempts(
        self, what: str, claim: PreparedClaim, work: Callable[[], Awaitable[object]]
    ) -> bool:
        """``work`` under the node lock, tried at most :data:`RECORD_ATTEMPTS` times, the
        lock released between tries, each try once the calls pause (or the lull's
        ``longest`` seconds after the first try was due); whether it succeeded. Each
        failure is logged."""
        handed_over = time.monotonic()
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            await self.lull.wait(handed_over)
            try:
                await self._under_node_lock(work)
                return True
            except Exception as err:
                log.warning(
                    f"{what} failed",
                    extra={
                        "claim_uid": claim.uid,
                        "namespace": claim.namespace,
                        "claim": claim.name,
                        "attempt": attempt,
                        "error": str(err),
                    },
                )
            if attempt < RECORD_ATTEMPTS:
                await asyncio.sleep(RECORD_RETRY_SECONDS * attempt)
        return False

    def _after_unprepare(self, released: PreparedClaim) -> None:
        """Once the kubelet has its answer, delete the released claim's ``Client`` record and
        drop its checkpoint entry (:meth:`Unpreparer.forget`), under the same locks as any
        claim work. A claim whose entry is gone or prepared again by then was finished by
        that call. After :data:`RECORD_ATTEMPTS` failures the claim is left to the sweep
        (:attr:`unfinished`), its entry still marked ``unpreparing``. Like a prepare's
        record work, it waits for a pause in the calls first."""

        async def forget() -> None:
            async with self._claim_locks.hold(released.uid):
                current = self._checkpoint.current.claims.get(released.uid)
                if current is None or current.state is not ClaimState.UNPREPARING:
                    return
                try:
                    await self._unpreparer.forget(current)
                finally:
                    self._count_prepared()

        async def run() -> None:
            if not await self._attempts(
                "removing an unprepared claim's Client record", released, forget
            ):
                self._unfinished.add(released.uid)

        self._track(run())

    def _count_prepared(self) -> None:
        self._metrics.prepared_claims.set(len(self._checkpoint.current.claims))

    def _forget_enrolled_write(self, uid: str, write: _RecordWrite) -> None:
        if self._enrolled_writes.get(uid) is write:
            del self._enrolled_writes[uid]

    def _cancel_enrolled_write(self, uid: str) -> None:
        """Before an unprepare: drop the claim's record status write if it is not under
        way (one that is lands on the record before its removal, or on nothing)."""
        write = self._enrolled_writes.pop(uid, None)
        if write is not None and write.task is not None and not write.under_way:
            write.task.cancel()

    async def _under_node_lock(self, work: Callable[[], Awaitable[_T]]) -> _T:
        waited = time.monotonic()
        async with self._node_lock.held():
            self._metrics.lock_wait.observe(time.monotonic() - waited)
            return await work()

    # Prepare

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        async def all_claims() -> dict[str, PreparedClaim | str]:
            results = await asyncio.gather(*(self._prepare_one(c) for c in claims))
            return {c.uid: r for c, r in zip(claims, results, strict=True)}

        with self._call_span("NodePrepareResources", claims):
            return await self._shielded(self._waited_on(self._under_node_lock(all_claims)))

    def _call_span(
        self, method: str, claims: Sequence[ClaimRef]
    ) -> contextlib.AbstractContextManager[object]:
        """The kubelet's call as a server span, the parent of its claims' spans (the claim
        work, shielded, runs in a task that inherits it)."""
        return self._tracer.start_as_current_span(
            f"{_DRA_SERVICE}/{method}",
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": _DRA_SERVICE,
                "rpc.method": method,
                "thunder_dra.claims": len(claims),
            },
        )

    async def prepare_before_binding(self, ref: ClaimRef) -> PreparedClaim | str:
        """Prepare one claim while the scheduler waits to bind its pod (enrollment before
        binding, :mod:`thunder_dra.plugin.claims.binding`): the same work as the kubelet's
        call, under the same locks; a failure sets the binding failure condition."""
        with self._tracer.start_as_current_span("thunder_dra.prepare_before_binding"):
            return await self._shielded(
                self._waited_on(
                    self._under_node_lock(lambda: self._prepare_one(ref, before_binding=True))
                )
            )

    async def release(self, ref: ClaimRef) -> str:
        """Unprepare a claim no pod on this node can use any more (its allocation is gone),
        as the kubelet's unprepare would; an error message, empty on success."""
        with self._tracer.start_as_current_span("thunder_dra.release_unbound"):
            return await self._shielded(self._under_node_lock(lambda: self._unprepare_one(ref)))

    async def _prepare_one(
        self, ref: ClaimRef, *, before_binding: bool = False
    ) -> PreparedClaim | str:
        fields = {"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name}
        started = time.monotonic()
        with self._tracer.start_as_current_span(
            "thunder_dra.prepare",
            attributes={"k8s.resourceclaim.uid": ref.uid, "k8s.namespace.name": ref.namespace},
        ) as span:
            try:
                # The claim's lock first: a duplicate of a claim in progress waits without
                # taking one of the slots.
                async with self._claim_locks.hold(ref.uid), self._slots.held():
                    prepared, read = await self._prepare_claim(ref)
                result: PreparedClaim | str = prepared
            except Exception as err:
                message, reason = _classify(err)
                error = f"claim {ref.namespace}/{ref.name}: {message}"
                span.set_status(Status(StatusCode.ERROR, reason.value))
                self._metrics.prepares.labels("error").inc()
                self._metrics.errors.labels("prepare", reason.value).inc()
                log.error(
                    "prepare failed",
                    extra={**fields, "reason": reason.value, "error": message},
                    exc_info=reason is ErrorReason.INTERNAL,
                )
                async with self._slots.held():
                    await self._warn(ref, message)
                if self._status is not None:
                    self._status.failed(ref, message, reason, before_binding=before_binding)
                result = error
            else:
                self._metrics.prepares.labels("success").inc()
                if self._status is not None:
                    self._status.prepared(prepared, read, urgent=before_binding)
            finally:
                self._metrics.prepare_seconds.observe(time.monotonic() - started)
                self._count_prepared()
        return result

    async def _warn(self, ref: ClaimRef, message: str) -> None:
        # The kubelet retries a failed prepare every few seconds: the recorder counts the
        # repeats into one event (kube/events.py), as it does the operator's.
        await self._records.claim_event(
            ref.namespace, ref.name, ref.uid, "ThunderPrepareFailed", message
        )

    async def _prepare_claim(self, ref: ClaimRef) -> tuple[PreparedClaim, JSON | None]:
        """The prepared claim, and the ResourceClaim as a fresh prepare read it."""
        existing = self._checkpoint.current.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARED:
            repaired = await self._repairer.repair(existing, record=False)
            self._after_answer(repaired, created=repaired is not existing)
            return repaired, None
        if existing is not None:
            # An unprepare (or an older format's half-prepare) was interrupted: finish it,
            # so the claim is enrolled from a clean slate.
            await self._unpreparer.finish(existing)
        prepared, read = await self._preparer.prepare(ref)
        self._after_answer(prepared, created=True)
        log.info(
            "claim prepared",
            extra={
                "claim_uid": ref.uid,
                "namespace": ref.namespace,
                "claim": ref.name,
                "zone": prepared.zone_name,
                "gpu_type": prepared.gpu_type,
                "gpu_count": prepared.gpu_count,
                "consumer": prepared.consumer.kind,
                "enrollment_token_id": prepared.enrollment_token_id,
                "client_id": prepared.client_id,
            },
        )
        return prepared, read

    # Unprepare

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        async def all_claims() -> dict[str, str]:
            errors = await asyncio.gather(*(self._unprepare_one(c) for c in claims))
            return {c.uid: e for c, e in zip(claims, errors, strict=True)}

        with self._call_span("NodeUnprepareResources", claims):
            return await self._shielded(self._waited_on(self._under_node_lock(all_claims)))

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        fields = {"claim_uid": ref.uid, "namespace": ref.namespace, "claim": ref.name}
        started = time.monotonic()
        with self._tracer.start_as_current_span(
            "thunder_dra.unprepare",
            attributes={"k8s.resourceclaim.uid": ref.uid, "k8s.namespace.name": ref.namespace},
        ) as span:
            self._cancel_enrolled_write(ref.uid)
            try:
                async with self._claim_locks.hold(ref.uid), self._slots.held():
                    released = await self._unpreparer.unprepare(ref)
            except Exception as err:
                message, reason = _classify(err)
                span.set_status(Status(StatusCode.ERROR, reason.value))
                self._metrics.unprepares.labels("error").inc()
                self._metrics.errors.labels("unprepare", reason.value).inc()
                log.error(
                    "unprepare failed",
                    extra={**fields, "reason": reason.value, "error": message},
                    exc_info=reason is ErrorReason.INTERNAL,
                )
                return f"claim {ref.namespace}/{ref.name}: {message}"
            finally:
                self._metrics.unprepare_seconds.observe(time.monotonic() - started)
                self._count_prepared()
        self._metrics.unprepares.labels("success").inc()
        if released is not None:
            self._after_unprepare(released)
        if self._status is not None:
            self._status.unprepared(ref)
        return ""


def claim_service(
    claims: ClaimLifecycle,
    *,
    metrics: DaemonMetrics,
    tracer: Tracer,
    concurrency: int,
    status: ClaimStatusWriter | None = None,
    lull: CallLull | None = None,
) -> ClaimService:
    """The kubelet's handler over one instance's claim lifecycle
    (:func:`thunder_dra.plugin.claims.lifecycle.assemble`), at most ``concurrency``
    claims at once (``--claim-concurrency``), reporting outcomes to ``status``; its calls
    are counted in ``lull``, which the status writer shares."""
    return ClaimService(
        preparer=claims.preparer,
        repairer=claims.repairer,
        unpreparer=claims.unpreparer,
        checkpoint=claims.checkpoint,
        records=claims.records,
        node_lock=claims.node_lock,
        claim_locks=claims.claim_locks,
        metrics=metrics,
        tracer=tracer,
        slots=ClaimSlots(concurrency, metrics.registry),
        status=status,
        unfinished=claims.unfinished,
        lull=lull,
    )
