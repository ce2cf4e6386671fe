"""Kubernetes Events about the ThunderCluster and Client resources.

Events of the cluster-scoped ThunderCluster are recorded in the `default` namespace,
the only one the API server accepts for events about cluster-scoped objects
(`kubectl describe thundercluster` shows them); those of a Client in its own namespace.
A repeated event (same object, type, reason and message) is not recreated: its count
goes up and, at most once per `FLUSH_INTERVAL`, the stored event is patched with the
new count, as client-go's recorder does, so a persisting problem reported every pass
costs one small write a minute rather than a new object every pass.

Posting an event never fails a reconcile: errors are logged and dropped.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError, NotFound
from thunder_dra.kube.resources import EVENTS

FLUSH_INTERVAL: Final = timedelta(seconds=60)
CORRELATION_WINDOW: Final = timedelta(minutes=10)
MESSAGE_MAX: Final = 1024
COMPONENT: Final = "thunder-operator"
CLUSTER_SCOPED_EVENTS_NAMESPACE: Final = "default"

EventType = Literal["Normal", "Warning"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about."""

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


class EventRecorder:
    """Posts core/v1 Events, aggregating repeats."""

    def __init__(self, kube: KubeClient, instance: str) -> None:
        self._kube = kube
        self._instance = instance
        self._series: dict[tuple[str, str, str, str], _Series] = {}

    async def post(self, obj: ObjectRef, type_: EventType, reason: str, message: str) -> None:
        message = message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 1] + "…"
        key = (obj.uid, type_, reason, message)
        now = datetime.now(UTC)
        series = self._series.get(key)
        try:
            if series is not None and now - series.last_seen < CORRELATION_WINDOW:
                series.count += 1
                series.last_seen = now
                if now - series.flushed >= FLUSH_INTERVAL:
                    await self._flush(series, now)
                return
            self._series[key] = await self._create(obj, type_, reason, message, now)
            self._forget_old(now)
        except KubeError as exc:
            _log.warning(
                "could not record an event",
                extra={"reason": reason, "object": obj.name, "error": str(exc)},
            )

    async def _create(
        self, obj: ObjectRef, type_: EventType, reason: str, message: str, now: datetime
    ) -> _Series:
        namespace = obj.namespace or CLUSTER_SCOPED_EVENTS_NAMESPACE
        name = f"{obj.name[:200]}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": obj.to_json(),
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": _timestamp(now),
            "lastTimestamp": _timestamp(now),
            "count": 1,
        }
        await self._kube.create(EVENTS.collection(namespace), body)
        return _Series(name, namespace, 1, now, now, 1)

    async def _flush(self, series: _Series, now: datetime) -> None:
        if series.count == series.flushed_count:
            return
        patch = {"count": series.count, "lastTimestamp": _timestamp(now)}
        with contextlib.suppress(NotFound):
            await self._kube.merge_patch(EVENTS.item(series.name, series.namespace), patch)
        series.flushed, series.flushed_count = now, series.count

    def _forget_old(self, now: datetime) -> None:
        stale = [k for k, s in self._series.items() if now - s.last_seen >= CORRELATION_WINDOW]
        for key in stale:
            del self._series[key]
