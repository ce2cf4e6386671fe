"""The operator process: kopf handlers, leader election, the webhook, probes and metrics.

kopf's part:

- a daemon per ThunderCluster, which waits until this replica leads and then runs the
  reconcile loops of `loop`; it cancels them at once when leadership is lost, and
  kopf stops it when the object is deleted or the process stops;
- watch-event handlers on ThunderClusters (to start a pass at once on a spec change or
  a `thundercompute.com/reconcile-requested` annotation), on Clients (to wake the
  reaper) and on ResourceClaims (a refused enrollment starts a device's cool-down, and
  a pass at once: `inventory.binding`). Event handlers keep no state on the objects;
- the validating webhook handlers (`thunder_dra.webhooks`), served by every replica;
- no kopf peering: kopf runs standalone on every replica, so every replica serves the
  webhook and the probes and receives the watch events.

Leader election (`leader`): the replicas compete for one `coordination.k8s.io/v1` Lease
in the operator's namespace; only its holder reconciles. On a graceful stop the leader
releases the Lease once its loops have stopped. `--standalone` reconciles at once,
without a Lease (one replica only).

kopf authenticates with the same client configuration the operator's own calls use
(the given kubeconfig, else in-cluster, else the default kubeconfig).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Collection
from typing import Any, Final

import kopf

from thunder_dra.api.constants import CLIENT_PLURAL, GROUP, THUNDER_CLUSTER_PLURAL, VERSION
from thunder_dra.controllers.inventory.publish import Publisher
from thunder_dra.controllers.inventory.reconciler import InventoryReconciler
from thunder_dra.controllers.process.leader import LeaderElector, Term, candidate_identity
from thunder_dra.controllers.process.lease import KubeLeaseStore
from thunder_dra.controllers.process.loop import ClusterLoop, Services
from thunder_dra.controllers.process.options import OperatorOptions
from thunder_dra.controllers.process.policies import apply_policies, operator_identity
from thunder_dra.controllers.reaper import Reaper
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.objects import DEVICE_CLASS_SELECTOR, INVENTORY_SELECTOR
from thunder_dra.controllers.shared.thunderapi import ThunderClients
from thunder_dra.kube import bodies
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.resources import (
    DEVICE_CLASSES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    THUNDER_CLUSTERS,
)
from thunder_dra.kube.transport import build_client, load_configuration
from thunder_dra.process.health import HealthServer
from thunder_dra.process.logs import SECRETS
from thunder_dra.process.metrics import Metrics, process_registry
from thunder_dra.process.tracing import OPERATOR_SERVICE, configure_tracing
from thunder_dra.version import user_agent
from thunder_dra.webhooks.admission import register_webhooks
from thunder_dra.webhooks.server import ListeningWebhookServer, WebhookTLS

_log = logging.getLogger(__name__)

DAEMON_CANCELLATION_TIMEOUT = 30.0
_STANDALONE_TERM: Final = Term(0)
"""With --standalone: one term that never ends."""


class Operator:
    """Everything one operator process runs."""

    def __init__(self, options: OperatorOptions) -> None:
        self.options = options
        self.registry = process_registry()
        self.metrics = OperatorMetrics(self.registry)
        self.kube = build_client(
            options.kubeconfig,
            user_agent=user_agent("operator"),
            timeout=options.kube_request_timeout.total_seconds(),
            pool_size=options.write_concurrency + 4,
            on_write=lambda resource, verb: self.metrics.kubernetes_writes.labels(
                resource, verb
            ).inc(),
        )
        instance = os.environ.get("POD_ID") or socket.gethostname()
        self.events = EventRecorder(
            self.kube, component=OPERATOR_SERVICE, instance=instance, scrub=SECRETS.scrub
        )
        self.thunder_clients = ThunderClients(self.registry)
        self.services = Services(
            options=options,
            kube=self.kube,
            metrics=self.metrics,
            events=self.events,
            inventory=InventoryReconciler(
                self.kube,
                Publisher(self.kube, options.write_concurrency),
                self.events,
                self.metrics,
                self.thunder_clients,
            ),
            reaper=Reaper(self.kube, self.events, self.metrics),
            thunder_clients=self.thunder_clients,
        )
        self.loops: dict[str, ClusterLoop] = {}
        self.elector: LeaderElector | None = None
        """None with --standalone: this process reconciles without a Lease."""
        self.leader_gauge = Metrics(self.registry, "operator").gauge(
            "leader",
            "1 while this replica holds the leader Lease and reconciles (always 1 with "
            "--standalone), 0 while it is a standby.",
        )
        self.kopf_ready = asyncio.Event()
        self.tls: WebhookTLS | None = None
        self.webhook_server: ListeningWebhookServer | None = None
        if options.webhook_enabled:
            self.tls = WebhookTLS(
                host=options.webhook_host,
                cert_file=options.webhook_cert_file,
                key_file=options.webhook_key_file,
                ca_file=options.webhook_ca_file,
            )
            self.webhook_server = self.tls.server(
                listen=options.webhook_listen,
                port=options.webhook_port,
                ca_dump=options.webhook_ca_dump,
            )

    # -- readiness -------------------------------------------------------------------

    def not_ready(self) -> list[str]:
        """What `/readyz` still waits for; empty once kopf runs (and the webhook listens)."""
        missing = []
        if not self.kopf_ready.is_set():
            missing.append("kopf is starting")
        if self.webhook_server is not None and not self.webhook_server.listening:
            missing.append("webhook server not listening yet")
        return missing

    # -- leadership ------------------------------------------------------------------

    def _leadership_changed(self, leading: bool) -> None:
        self.leader_gauge.set(1 if leading else 0)

    async def _next_term(self, stopped: kopf.DaemonStopped) -> Term | None:
        """Until this replica leads (its term) or the daemon is stopped (None)."""
        if self.elector is None:
            return _STANDALONE_TERM
        term = asyncio.ensure_future(self.elector.wait_for_term())
        stop = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({term, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            term.cancel()
            stop.cancel()
        if stopped or term.cancelled() or not term.done():
            return None
        return term.result()

    async def _lead(
        self, term: Term, body: kopf.Body, uid: str, name: str, stopped: kopf.DaemonStopped
    ) -> None:
        """Run the loops of one ThunderCluster for one term; cancel them when it ends."""
        loop = ClusterLoop(self.services, uid, name)
        self.loops[uid] = loop
        _log.info("reconciling ThunderCluster", extra={"cluster": name, "term": term.number})

        async def wait_stopped() -> object:
            return await stopped.wait()

        running = asyncio.create_task(
            loop.run(body, wait_stopped, lambda: bool(stopped) or term.lost.is_set())
        )
        lost = asyncio.ensure_future(term.lost.wait())
        try:
            await asyncio.wait({running, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not running.done():
                # Leadership is lost (or kopf cancels the daemon): stop mid-pass, so no
                # write of this replica's overlaps the next leader's.
                running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            self.loops.pop(uid, None)
            _log.info("stopped reconciling ThunderCluster", extra={"cluster": name})

    def lease_store(self) -> KubeLeaseStore:
        """The leader Lease, through the operator's one client; each Lease request is
        bounded by the renew deadline rather than the client's longer request timeout."""
        return KubeLeaseStore(
            self.kube,
            self.options.namespace,
            self.options.lease_name,
            request_timeout=self.options.election.renew_deadline,
        )

    # -- webhook context ---------------------------------------------------------------

    async def thundercluster_names(self) -> Collection[str]:
        clusters = await self.kube.list_all(THUNDER_CLUSTERS.collection())
        return [bodies.name(c) for c in clusters]

    async def objects_published(self) -> bool:
        for path, selector in (
            (RESOURCE_SLICES, INVENTORY_SELECTOR),
            (DEVICE_CLASSES, DEVICE_CLASS_SELECTOR),
        ):
            async for page in self.kube.list_pages(
                path.collection(), label_selector=selector, limit=1
            ):
                if page:
                    return True
                break
        return False

    # -- kopf ------------------------------------------------------------------------

    def _selects(self) -> Callable[..., bool]:
        wanted = self.options.cluster_name

        def selects(name: str, **_: Any) -> bool:
            return not wanted or name == wanted

        return selects

    def build_registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        selects = self._selects()

        @kopf.on.login(registry=registry)
        async def login(**_: Any) -> kopf.ConnectionInfo:
            config = await load_configuration(self.options.kubeconfig)
            header = await config.get_api_key_with_prefix("BearerToken") or ""
            scheme, _space, token = header.partition(" ")
            return kopf.ConnectionInfo(
                server=config.host,
                ca_path=config.ssl_ca_cert,
                insecure=not config.verify_ssl,
                scheme=scheme or None,
                token=token or None,
                certificate_path=config.cert_file,
                private_key_path=config.key_file,
            )

        @kopf.on.event(GROUP, VERSION, THUNDER_CLUSTER_PLURAL, registry=registry, when=selects)
        async def thundercluster_event(body: kopf.Body, uid: str, **_: Any) -> None:
            loop = self.loops.get(uid)
            if loop is not None:
                loop.observe(body)

        @kopf.on.event(GROUP, VERSION, CLIENT_PLURAL, registry=registry)
        async def client_event(**_: Any) -> None:
            for loop in self.loops.values():
                loop.reaper_trigger.set()

        claims = RESOURCE_CLAIMS

        @kopf.on.event(claims.group, claims.version, claims.plural, registry=registry)
        async def claim_event(body: kopf.Body, type: str | None, **_: Any) -> None:
            # Every replica remembers refusals (a new leader starts with them); the
            # leader's loops publish the taint at once.
            started = self.services.inventory.observe_claim(body, deleted=type == "DELETED")
            if started:
                for loop in self.loops.values():
                    loop.trigger.set()

        @kopf.daemon(
            GROUP,
            VERSION,
            THUNDER_CLUSTER_PLURAL,
            id="reconcile",
            registry=registry,
            when=selects,
            cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT,
        )
        async def reconcile(
            body: kopf.Body, uid: str, name: str, stopped: kopf.DaemonStopped, **_: Any
        ) -> None:
            while not stopped:
                term = await self._next_term(stopped)
                if term is None:
                    return
                await self._lead(term, body, uid, name, stopped)

        if self.options.webhook_enabled:
            register_webhooks(
                registry,
                existing_names=self.thundercluster_names,
                objects_published=self.objects_published,
            )
        return registry

    def build_settings(self) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        # Events are posted by the operator itself (aggregated, in its namespace).
        settings.posting.enabled = False
        # Every replica runs kopf on its own; the Lease decides who reconciles.
        settings.peering.standalone = True
        settings.peering.mandatory = False
        settings.persistence.finalizer = f"{GROUP}/operator"
        settings.execution.max_workers = 4
        if self.webhook_server is not None:
            settings.admission.server = self.webhook_server
            settings.admission.managed = None
        return settings

    async def run(self) -> None:
        tracer_provider = configure_tracing(OPERATOR_SERVICE)
        health = HealthServer(
            host=self.options.health_host,
            port=self.options.health_port,
            metrics_port=self.options.metrics_port,
            registry=self.registry,
            readiness=self.not_ready,
        )
        await health.start()
        try:
            await self.kube.open()  # a bad kubeconfig fails here, not in a loop
            if self.options.standalone:
                self.leader_gauge.set(1)
            else:
                store = self.lease_store()
                self.elector = LeaderElector(
                    store,
                    candidate_identity(),
                    self.options.election,
                    on_change=self._leadership_changed,
                )
                _log.info(
                    "campaigning for the leader Lease",
                    extra={
                        "lease": f"{store.namespace}/{store.name}",
                        "identity": self.elector.identity,
                    },
                )
                self.elector.start()
            if self.options.apply_admission_policies:
                await apply_policies(
                    self.kube,
                    operator_identity(
                        self.options.namespace,
                        self.options.daemon_service_account,
                        self.options.operator_service_account,
                    ),
                )
            await kopf.operator(
                registry=self.build_registry(),
                settings=self.build_settings(),
                clusterwide=True,
                standalone=True,
                ready_flag=self.kopf_ready,
            )
        finally:
            # kopf has stopped the daemons: releasing now hands over without overlap.
            if self.elector is not None:
                await self.elector.stop(release=True)
            await health.stop()
            await self.thunder_clients.aclose()
            tracer_provider.shutdown()
            await self.kube.close()
            if self.tls is not None:
                self.tls.cleanup()


async def run_operator(options: OperatorOptions) -> None:
    operator = Operator(options)
    with contextlib.suppress(asyncio.CancelledError):
        await operator.run()
