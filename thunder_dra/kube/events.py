"""Kubernetes Events, written the same way by the operator and the daemon.

One rule for repeats, as client-go's recorder has: an event is identified by its object,
type, reason and message. The first one is created; a repeat within
`CORRELATION_WINDOW` of the last is not recreated: its count goes up and, at most once
per `FLUSH_INTERVAL`, the stored event is patched with the new count and time. So a
persisting problem reported on every pass (the operator) or every kubelet retry (the
daemon) costs one small write a minute rather than a new object each time.

Events of a cluster-scoped object (the ThunderCluster) are recorded in the `default`
namespace, the only one the API server accepts for them (`kubectl describe` shows them);
those of a namespaced object in its own namespace.

Every message goes through the process's secret scrubber before it is stored or
compared, so an event never carries a token. Posting an event never fails the caller
(a reconcile, a prepare): whatever goes wrong is logged and dropped.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError, NotFound
from thunder_dra.kube.resources import EVENTS

FLUSH_INTERVAL: Final = timedelta(seconds=60)
CORRELATION_WINDOW: Final = timedelta(minutes=10)
MESSAGE_MAX: Final = 1024
CLUSTER_SCOPED_EVENTS_NAMESPACE: Final = "default"
# The API server's limits: an object name of 253 characters, reportingInstance of 128.
_NAME_PREFIX_MAX: Final = 200
_INSTANCE_MAX: Final = 128

EventType = Literal["Normal", "Warning"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about, of any kind: a ThunderCluster, or a Client (which is
    namespaced). Not the owner reference the operator's objects carry
    (`controllers.shared.ownership.ThunderClusterRef`), which only ever names a
    ThunderCluster, as their controller."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None = None

    def to_json(self) -> dict[str, Any]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        ref["uid"] = self.uid
        if self.namespace:
            ref["namespace"] = self.namespace
        return ref


@dataclass(slots=True)
class _Series:
    name: str
    namespace: str
    count: int
    last_seen: datetime
    flushed: datetime
    flushed_count: int


def _timestamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> datetime:
    return datetime.now(UTC)


class EventRecorder:
    """Posts core/v1 Events for one component, aggregating repeats.

    `component` names the writer (`source.component`, `reportingComponent`), `instance`
    this process (`reportingInstance`), `host` the node it runs on, if any
    (`source.host`). `scrub` masks secrets in a message: the process's log scrubber.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        component: str,
        instance: str,
        scrub: Callable[[str], str],
        host: str | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self._kube = kube
        self._component = component
        self._instance = instance[:_INSTANCE_MAX]
        self._scrub = scrub
        self._host = host
        self._clock = clock
        self._series: dict[tuple[str, str, str, str], _Series] = {}

    async def post(self, obj: ObjectRef, type_: EventType, reason: str, message: str) -> None:
        try:
            message = self._scrub(message)
            if len(message) > MESSAGE_MAX:
                message = message[: MESSAGE_MAX - 1] + "…"
            key = (obj.uid, type_, reason, message)
            now = self._clock()
            series = self._series.get(key)
            if series is not None and now - series.last_seen < CORRELATION_WINDOW:
                series.count += 1
                series.last_seen = now
                if now - series.flushed >= FLUSH_INTERVAL:
                    await self._flush(key, series, now)
                return
            self._series[key] = await self._create(obj, type_, reason, message, now)
            self._forget_old(now)
        except KubeError as exc:
            _log.warning(
                "could not record an event",
                extra={"reason": reason, "object": obj.name, "error": str(exc)},
            )
        except Exception:
            # Not the API server's answer (a bug, a transport the client did not wrap):
            # the caller's work still must not fail for an event.
            _log.exception("could not record an event", extra={"reason": reason})

    async def _create(
        self, obj: ObjectRef, type_: EventType, reason: str, message: str, now: datetime
    ) -> _Series:
        namespace = obj.namespace or CLUSTER_SCOPED_EVENTS_NAMESPACE
        name = f"{obj.name[:_NAME_PREFIX_MAX]}.{secrets.token_hex(8)}"
        source = {"component": self._component}
        if self._host:
            source["host"] = self._host
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": obj.to_json(),
            "type": type_,
            "reason": reason,
            "message": message,
            "source": source,
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": _timestamp(now),
            "lastTimestamp": _timestamp(now),
            "count": 1,
        }
        await self._kube.create(EVENTS.collection(namespace), body)
        return _Series(name, namespace, 1, now, now, 1)

    async def _flush(self, key: tuple[str, str, str, str], series: _Series, now: datetime) -> None:
        if series.count == series.flushed_count:
            return
        patch = {"count": series.count, "lastTimestamp": _timestamp(now)}
        # Marked flushed first: a patch that fails is not retried on every repeat.
        series.flushed, series.flushed_count = now, series.count
        try:
            await self._kube.merge_patch(EVENTS.item(series.name, series.namespace), patch)
        except NotFound:
            # The API server expired the event (its TTL, an hour by default) while the
            # problem went on: the next repeat starts a new one.
            if self._series.get(key) is series:
                del self._series[key]

    def _forget_old(self, now: datetime) -> None:
        stale = [k for k, s in self._series.items() if now - s.last_seen >= CORRELATION_WINDOW]
        for key in stale:
            del self._series[key]
