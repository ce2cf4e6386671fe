"""One operator pass in memory: the operator's real reconcile cycle, no processes, no sockets.

:class:`OperatorWorld` holds what outlives an operator process: the apiserver
(:class:`~tests.support.fakekube.FakeKube`, with the ThunderCluster and the Secret of the
Thunder API token in it) and Thunder (:class:`hack.fake_thunder.service.FakeThunder`,
answering through its ``httpx.MockTransport``). :meth:`OperatorWorld.run_pass` runs one
cycle of the operator's own :class:`~thunder_dra.controllers.process.loop.ClusterLoop`
(the daemon DaemonSet, the inventory pass, the ThunderCluster's status), wired as
:class:`~thunder_dra.controllers.process.main.Operator` wires it, and reports the writes
it made. :meth:`OperatorWorld.restart` replaces the operator (its caches, its shrink
guard's streaks, the status it remembers) and keeps both fakes, as a restarted pod would.

The one seam: the Thunder client of a pass is built on the fake's transport, where the
operator's :class:`~thunder_dra.controllers.shared.thunderapi.ThunderClients` builds it
on aiohttp. Token reading, retries and everything after it are the operator's.

    async with operator_world({"us-east": {"A6000": 4}}) as world:
        first = await world.run_pass()
        assert world.slices() and first.writes
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry

from hack.fake_thunder.service import FakeThunder
from tests.support.fakekube import FakeKube, parse_path
from thunder_dra.api.constants import API_VERSION, THUNDER_CLUSTER_KIND
from thunder_dra.controllers.inventory.publish import Publisher
from thunder_dra.controllers.inventory.reconciler import InventoryReconciler
from thunder_dra.controllers.process.loop import ClusterLoop, Services, plain
from thunder_dra.controllers.process.options import OperatorOptions, parse_options
from thunder_dra.controllers.reaper import Reaper
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.thunderapi import OPERATOR_RETRY, TOKEN_KEY, ThunderClients
from thunder_dra.controllers.workload.daemonset import CONSUMER_DAEMONSET_NAME, DAEMONSET_NAME
from thunder_dra.kube.client import KubeClient, Request
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.resources import (
    DAEMON_SETS,
    DEVICE_CLASSES,
    EVENTS,
    RESOURCE_SLICES,
    SECRETS,
    THUNDER_CLUSTERS,
)
from thunder_dra.process.logs import SECRETS as LOG_SECRETS
from thunder_dra.process.tracing import OPERATOR_SERVICE
from thunder_dra.thunder import Secret, ThunderClient

NAMESPACE: Final = "thunder-system"
CLUSTER_NAME: Final = "thunder"
API_TOKEN: Final = "thunder-api-token-one-pass"
EVENTS_NAMESPACE: Final = "default"
"""Where the events of the cluster-scoped ThunderCluster go."""

Zones = Mapping[str, Mapping[str, int]]
"""Zone display name -> GPU model -> GPUs: one active host per model."""


def thunder_seed(zones: Zones) -> dict[str, Any]:
    """The fake Thunder's state (its dump format) for `zones`; zone ids in name order."""
    zone_items, hosts = [], []
    for index, name in enumerate(sorted(zones)):
        zone_id = f"zone-{index:03d}"
        zone_items.append({"zoneId": zone_id, "displayName": name})
        for model, gpus in sorted(zones[name].items()):
            host = f"host-{index:03d}-{model.lower()}"
            hosts.append(
                {
                    "hostId": host,
                    "zoneId": zone_id,
                    "displayName": host,
                    "hostname": host,
                    "gpuType": model,
                    "gpuCount": gpus,
                    "status": "active",
                }
            )
    return {"zones": zone_items, "hosts": hosts}


def thunder_cluster(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": THUNDER_CLUSTER_KIND,
        "metadata": {"name": CLUSTER_NAME},
        "spec": dict(spec or {}),
    }


class InMemoryThunderClients(ThunderClients):
    """The operator's ThunderClients, with clients that answer from the fake Thunder.

    One client per (API URL, token), as the operator keeps it; the network is the fake's
    ``httpx.MockTransport``."""

    def __init__(self, thunder: FakeThunder, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self._thunder = thunder
        self._metrics_registry = registry
        self._client: tuple[tuple[str, str], ThunderClient] | None = None

    async def get(self, api_url: str, token: Secret) -> ThunderClient:
        key = (api_url, token.reveal())
        if self._client is not None and self._client[0] == key:
            return self._client[1]
        await self.aclose()
        client = ThunderClient(
            api_token=token,
            component="operator",
            base_url=api_url,
            retry=OPERATOR_RETRY,
            registry=self._metrics_registry,
            transport=self._thunder.transport(),
        )
        self._client = (key, client)
        return client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client[1].aclose()
            self._client = None


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one cycle did to the apiserver."""

    delay: float
    """Seconds the loop would wait before the next cycle."""
    requests: tuple[Request, ...]
    """Every request of the cycle, reads included."""

    @property
    def writes(self) -> list[str]:
        """``METHOD path`` of every request that changed something (dry runs excluded)."""
        return [
            f"{r.method} {r.path}"
            for r in self.requests
            if r.method != "GET" and not any(key == "dryRun" for key, _ in r.query)
        ]

    def writes_to(self, plural: str) -> list[str]:
        return [w for w in self.writes if f"/{plural}" in w.split(" ", 1)[1]]


@dataclass
class Operator:
    """One operator process's parts, wired as ``Operator`` wires them."""

    services: Services
    loop: ClusterLoop

    async def aclose(self) -> None:
        await self.services.thunder_clients.aclose()


@dataclass
class OperatorWorld:
    """The apiserver and Thunder of a pass, and the operator running against them."""

    apiserver: FakeKube
    thunder: FakeThunder
    kube: KubeClient
    options: OperatorOptions
    operator: Operator = field(init=False)

    def __post_init__(self) -> None:
        self.operator = self._new_operator()

    def _new_operator(self) -> Operator:
        registry = CollectorRegistry()
        metrics = OperatorMetrics(registry)
        events = EventRecorder(
            self.kube, component=OPERATOR_SERVICE, instance="operator-0", scrub=LOG_SECRETS.scrub
        )
        thunder_clients = InMemoryThunderClients(self.thunder, registry)
        services = Services(
            options=self.options,
            kube=self.kube,
            metrics=metrics,
            events=events,
            inventory=InventoryReconciler(
                self.kube,
                Publisher(self.kube, self.options.write_concurrency),
                events,
                metrics,
                thunder_clients,
            ),
            reaper=Reaper(self.kube, events, metrics),
            thunder_clients=thunder_clients,
        )
        stored = self.cluster()
        return Operator(services, ClusterLoop(services, stored["metadata"]["uid"], CLUSTER_NAME))

    # -- running -----------------------------------------------------------------------

    async def run_pass(self) -> PassReport:
        """One DaemonSet + inventory + status cycle of the operator's loop, on the stored
        ThunderCluster (as kopf hands it to the loop)."""
        start = len(self.apiserver.requests)
        delay = await self.operator.loop.cycle(plain(self.cluster()))
        return PassReport(delay, tuple(self.apiserver.requests[start:]))

    async def restart(self) -> None:
        """A new operator process: nothing kept in memory, both fakes as they are."""
        await self.operator.aclose()
        self.operator = self._new_operator()

    # -- what the cluster and Thunder do between passes ----------------------------------

    async def roll_out_daemon(self, nodes: int, consumers: int = 0) -> None:
        """The DaemonSet controller's part: `nodes` serving daemon pods and `consumers`
        consumer daemon pods, updated and ready."""
        for name, count in ((DAEMONSET_NAME, nodes), (CONSUMER_DAEMONSET_NAME, consumers)):
            stored = await self.kube.get(DAEMON_SETS.item(name, NAMESPACE))
            status = {
                "observedGeneration": stored["metadata"].get("generation", 1),
                "desiredNumberScheduled": count,
                "currentNumberScheduled": count,
                "updatedNumberScheduled": count,
                "numberAvailable": count,
                "numberReady": count,
            }
            await self.kube.merge_patch(
                DAEMON_SETS.item(name, NAMESPACE, subresource="status"), {"status": status}
            )

    def _zone_id(self, name: str) -> str:
        (zone_id,) = [
            z.zone_id for z in self.thunder.state.zones.values() if z.display_name == name
        ]
        return zone_id

    def remove_zone(self, name: str) -> None:
        """Thunder stops listing zone `name` (and its hosts)."""
        state = self.thunder.state
        zone_id = self._zone_id(name)
        del state.zones[zone_id]
        for host_id in [h for h, host in state.hosts.items() if host.zone_id == zone_id]:
            del state.hosts[host_id]

    def set_gpus(self, zone: str, model: str, gpus: int) -> None:
        """Thunder reports `gpus` GPUs on zone `zone`'s host of `model`."""
        zone_id = self._zone_id(zone)
        (host,) = [
            h
            for h in self.thunder.state.hosts.values()
            if h.zone_id == zone_id and h.gpu_type == model
        ]
        host.gpu_count = gpus

    # -- what a user sees ----------------------------------------------------------------

    def cluster(self) -> dict[str, Any]:
        stored = self.apiserver.get(THUNDER_CLUSTERS.item(CLUSTER_NAME))
        assert stored is not None, "the ThunderCluster is gone"
        return stored

    def conditions(self) -> dict[str, tuple[str, str]]:
        """Condition type -> (status, reason) of the ThunderCluster."""
        status = self.cluster().get("status") or {}
        return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}

    def _listed(self, collection: str) -> list[dict[str, Any]]:
        """The stored objects of `collection`, by name (copies are not needed: read only)."""
        wanted = parse_path(collection)
        return [
            obj
            for (api, plural, namespace, _), obj in sorted(self.apiserver.objects.items())
            if (api, plural) == (wanted.api, wanted.plural)
            and (wanted.namespace is None or namespace == wanted.namespace)
        ]

    def slices(self) -> list[dict[str, Any]]:
        return self._listed(RESOURCE_SLICES.collection())

    def device_classes(self) -> list[dict[str, Any]]:
        return self._listed(DEVICE_CLASSES.collection())

    def published(self) -> dict[str, int]:
        """Pool name -> devices published in its slices."""
        pools: dict[str, int] = {}
        for item in self.slices():
            pool = item["spec"]["pool"]["name"]
            pools[pool] = pools.get(pool, 0) + len(item["spec"].get("devices") or [])
        return pools

    def events(self) -> list[tuple[str, str]]:
        """(type, reason) of every event about the ThunderCluster, in creation order."""
        found = [
            obj
            for obj in self._listed(EVENTS.collection(EVENTS_NAMESPACE))
            if (obj.get("involvedObject") or {}).get("kind") == THUNDER_CLUSTER_KIND
        ]
        found.sort(key=lambda obj: int(obj["metadata"]["resourceVersion"]))
        return [(obj["type"], obj["reason"]) for obj in found]


@contextlib.asynccontextmanager
async def operator_world(
    zones: Zones, spec: Mapping[str, Any] | None = None, *, apiserver: FakeKube | None = None
) -> AsyncIterator[OperatorWorld]:
    """A ThunderCluster with `spec`, its token's Secret, and Thunder reporting `zones`;
    `apiserver` is a fake API server of the test's own (one that drops fields, say)."""
    apiserver = apiserver if apiserver is not None else FakeKube()
    apiserver.put(THUNDER_CLUSTERS.collection(), thunder_cluster(spec))
    token = base64.b64encode(API_TOKEN.encode()).decode()
    apiserver.put(
        SECRETS.collection(NAMESPACE),
        {"metadata": {"name": "thunder-api"}, "data": {TOKEN_KEY: token}},
    )
    world = OperatorWorld(
        apiserver=apiserver,
        thunder=FakeThunder(api_tokens=[API_TOKEN], seed=thunder_seed(zones)),
        kube=KubeClient(apiserver),
        options=parse_options([], environ={"THUNDER_NAMESPACE": NAMESPACE}),
    )
    try:
        yield world
    finally:
        await world.operator.aclose()
        await world.kube.close()
