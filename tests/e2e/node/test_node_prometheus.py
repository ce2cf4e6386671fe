"""A real Prometheus scrapes the chart's operator and daemons on a real node; their traces
reach a real OTLP receiver.

The chart is installed as in ``test_node_install`` (the images ``make image`` built, the
fake Thunder on the node's bridge). A Prometheus 3.x server built from upstream
(``hack/build-prometheus.sh``) discovers the pods through the local apiserver
(``kubernetes_sd_configs``) and scrapes what the chart's own ``prometheus.io/*``
annotations point at: the operator's metrics Service and each daemon pod
(``hack.prometheus.annotation_scrape_configs``). It evaluates the shipped alert rules,
``charts/thunder-device-plugin/files/alerts.yaml``, as they are but for their ``for:``
durations, shortened to seconds so an outage of a few seconds takes them through
pending and firing.

The chart's tracing is on (``operator.otel``, OTLP/gRPC, the chart's default protocol)
towards an OTLP receiver on the node's bridge (``hack/otlp_receiver.py``, decoding with
the official ``opentelemetry-proto`` messages): the operator exports, and the daemon
pods export with the settings the operator hands on.

Then, in order (the tests share one install, one Prometheus and one receiver): the
operator target and every daemon target are up; PromQL returns the devices published per
pool and a prepare counted after a GPU pod ran; that prepare is one trace from the
kubelet's call through the Thunder mint and exchange to the file writes, an operator
pass is one trace, and no span holds a credential; ``ThunderUnreachable`` goes pending,
then firing, when the fake Thunder answers every zone listing with 503, and resolves
once it answers again; and every query of the shipped Grafana dashboard returns data.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.node.chart import CHART, NAMESPACE, Install, installed, wait
from hack.node.launcher import BRIDGE_IP, Node
from hack.otlp_receiver import OtlpReceiver, ReceivedSpan, tree
from hack.prometheus import Prometheus, annotation_scrape_configs
from tests.e2e.node.conftest import run_pod, stock_pod
from tests.support.dashboard import panel_queries

ALERTS = CHART / "files" / "alerts.yaml"
# Seconds, not minutes, for every `for:` of the shipped rules; nothing else changes.
FOR = "6s"
ZONES = "/api/v1/zones"
MINT = "POST /api/v1/enrollment-tokens"
EXCHANGE = "POST /api/v1/enrollment-tokens/enroll"


def shortened_rules() -> str:
    text = ALERTS.read_text()
    shortened, count = re.subn(r"(?m)^(\s+for:\s*)\S+\s*$", rf"\g<1>{FOR}", text)
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    assert count == sum(1 for r in rules if "for" in r), "a for: was not shortened"
    shortened_rules = [r for g in yaml.safe_load(shortened)["groups"] for r in g["rules"]]
    assert [r["expr"] for r in shortened_rules] == [r["expr"] for r in rules]
    return shortened


@pytest.fixture(scope="module")
def receiver(real_node: Node) -> Iterator[OtlpReceiver]:
    # On the node's bridge (the node made it), where the pods reach it.
    with OtlpReceiver(host=BRIDGE_IP) as started:
        yield started


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    otel = {"enabled": True, "endpoint": receiver.grpc_endpoint, "protocol": "grpc"}
    workdir = tmp_path_factory.mktemp("node-prometheus")
    with installed(real_node, node_images, workdir, {"operator": {"otel": otel}}) as done:
        yield done


@pytest.fixture(scope="module")
def prometheus(install: Install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "scrape_configs": annotation_scrape_configs(
            install.node.cluster.kubeconfig, [NAMESPACE], interval="2s"
        ),
    }
    workdir = tmp_path_factory.mktemp("prometheus")
    with Prometheus(workdir, config, rules=shortened_rules()) as server:
        yield server


def _up(prometheus: Prometheus) -> dict[str, list[dict[str, Any]]] | None:
    """The active targets by job, once the operator's and one per daemon pod are up."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for target in prometheus.targets():
        by_job.setdefault(target["labels"]["job"], []).append(target)
    operator = by_job.get("annotated-services", [])
    daemons = by_job.get("annotated-pods", [])
    if not operator or not daemons:
        return None
    if any(t["health"] != "up" for t in operator + daemons):
        return None
    return by_job


def test_prometheus_scrapes_the_operator_and_every_daemon_through_the_charts_annotations(
    install: Install, prometheus: Prometheus
) -> None:
    wait(install.ready_daemon_pod, "a Ready daemon pod", timeout=240)
    by_job = wait(lambda: _up(prometheus), "the operator and daemon targets up", timeout=120)
    operator = by_job["annotated-services"]
    daemons = by_job["annotated-pods"]
    # One operator endpoint per replica, each the metrics Service's pod.
    operator_pods = {p["metadata"]["name"] for p in install.operator_pods()}
    assert {t["labels"]["pod"] for t in operator} == operator_pods
    assert all(t["scrapeUrl"].endswith(":8080/metrics") for t in operator), operator
    # Every daemon pod is a target, with the node it serves as its `node` label.
    pods = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in install.daemon_pods()}
    assert {t["labels"]["pod"]: t["labels"]["node"] for t in daemons} == pods
    for target in operator + daemons:
        print(
            f"target job={target['labels']['job']} pod={target['labels']['pod']} "
            f"url={target['scrapeUrl']} health={target['health']}"
        )


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def test_promql_returns_published_devices_per_pool_and_counts_a_prepare(
    install: Install, prometheus: Prometheus
) -> None:
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.5})
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")

    # 4 physical GPUs at target 1.5: the pool publishes 6 devices once the pass ran.
    def published() -> list[dict[str, Any]] | None:
        found = prometheus.query("thunder_dra_operator_pool_published_devices == 6")
        return found or None

    pools = wait(published, "6 published devices of the pool in Prometheus", timeout=120)
    assert len(pools) == 1, pools
    labels = pools[0]["metric"]
    assert (labels.get("zone"), labels.get("model")) == ("zone-a", "A6000"), labels
    slices = install.get("resourceslices")["items"]
    pool = [s["spec"] for s in slices if s["spec"]["pool"]["name"] == labels["pool"]]
    in_pool = [device for spec in pool for device in spec["devices"]]
    assert len(in_pool) == 6, slices

    limits = {"thundercompute.com/gpu-a6000": "1"}
    pod = run_pod(
        install.node,
        stock_pod(
            "scraped",
            install.images["stock"].ref,
            "ls /etc/thunder/",
            container={"resources": {"limits": limits}},
        ),
        timeout=240,
    )
    assert pod["status"]["phase"] == "Succeeded", pod["status"]

    def prepared() -> list[dict[str, Any]] | None:
        found = prometheus.query(
            'sum by (node) (thunder_dra_daemon_prepare_claims_total{result="success"})'
        )
        return found if found and _value(found[0]) >= 1 else None

    counted = wait(prepared, "a prepare counted in Prometheus", timeout=60)
    assert counted[0]["metric"]["node"] == install.node.config.name
    install.node.kubectl("delete", "pod", "scraped", "--wait=true")
    install.wait_claims_gone("default")


def _trace_of(spans: list[ReceivedSpan], service: str, root: str) -> list[ReceivedSpan] | None:
    """The spans of the last trace whose root, of ``service``, is named ``root``."""
    roots = [s for s in spans if s.service_name == service and s.name == root and not s.parent_id]
    if not roots:
        return None
    trace_id = max(roots, key=lambda s: s.start_ns).trace_id
    return [s for s in spans if s.trace_id == trace_id]


def test_a_prepare_and_an_operator_pass_reach_the_otlp_receiver_as_traces_without_secrets(
    install: Install, receiver: OtlpReceiver
) -> None:
    # The prepare of the previous test's pod: the kubelet's call, the claim beneath it,
    # the Thunder mint and exchange and the file writes beneath the claim.
    def prepared(spans: list[ReceivedSpan]) -> bool:
        trace = _trace_of(spans, "thunder-dra-daemon", "DRAPlugin/NodePrepareResources")
        return trace is not None and any(s.name == "thunder_dra.journal.close" for s in trace)

    spans = receiver.wait_for(prepared, timeout=60)
    prepare = _trace_of(spans, "thunder-dra-daemon", "DRAPlugin/NodePrepareResources")
    assert prepare is not None
    print("a prepare's trace:\n" + "\n".join(tree(prepare)))
    call = next(s for s in prepare if not s.parent_id)
    assert call.kind == "SERVER"
    claim = next(s for s in prepare if s.name == "thunder_dra.prepare")
    assert claim.parent_id == call.span_id
    beneath = {s.name for s in prepare if s.parent_id == claim.span_id}
    for step in (MINT, EXCHANGE, "thunder_dra.client_config.write", "thunder_dra.cdi_spec.write"):
        assert step in beneath, tree(prepare)
    assert {s.transport for s in prepare} == {"grpc"}

    def passed(spans: list[ReceivedSpan]) -> bool:
        trace = _trace_of(spans, "thunder-operator", "thunder.reconcile")
        return trace is not None and any(s.name == "thunder.inventory_pass" for s in trace)

    spans = receiver.wait_for(passed, timeout=60)
    cycle = _trace_of(spans, "thunder-operator", "thunder.reconcile")
    assert cycle is not None
    print("an operator cycle's trace:\n" + "\n".join(tree(cycle)))
    assert any(s.name == f"GET {ZONES}" for s in cycle), tree(cycle)

    secrets = install.secrets()
    assert any(s.startswith("tcapi_") for s in secrets), "the API token is among them"
    assert len(secrets) > 1, "the fake issued enrollment and client tokens"
    for span in receiver.spans():
        for text in span.texts():
            leaked = [secret for secret in secrets if secret in text]
            assert not leaked, f"a credential is in span {span.name} of {span.service_name}"


def _alert_state(prometheus: Prometheus, name: str) -> str | None:
    states = [a["state"] for a in prometheus.alerts() if a["labels"].get("alertname") == name]
    return states[0] if states else None


def test_thunder_unreachable_fires_when_thunder_is_down_and_resolves_when_it_is_back(
    install: Install, prometheus: Prometheus
) -> None:
    wait(lambda: prometheus.query("thunder_dra_operator_thunder_reachable == 1"), "reachable")
    assert _alert_state(prometheus, "ThunderUnreachable") is None
    seen: list[str] = []

    def reached(state: str) -> bool:
        now = _alert_state(prometheus, "ThunderUnreachable") or "inactive"
        if not seen or seen[-1] != now:
            seen.append(now)
        return now == state

    install.fake.admin.add_fault(ZONES, method="GET", status=503)
    try:
        wait(lambda: reached("pending"), "ThunderUnreachable pending", timeout=120)
        wait(lambda: reached("firing"), "ThunderUnreachable firing", timeout=60)
    finally:
        install.fake.admin.clear_faults()
    wait(lambda: reached("inactive"), "ThunderUnreachable resolved", timeout=120)
    print(f"ThunderUnreachable states: {' -> '.join(seen)}")
    assert seen[-3:] == ["pending", "firing", "inactive"], seen


def test_every_dashboard_query_returns_data_from_the_real_prometheus(
    install: Install, prometheus: Prometheus
) -> None:
    queries = panel_queries()
    assert queries

    def empty() -> list[str] | None:
        missing = [f"{title}: {expr}" for title, expr in queries if not prometheus.query(expr)]
        return missing or None

    # Rates need two scrapes of a counter; the outage above gave the error panels data.
    try:
        wait(lambda: not empty(), "every dashboard query to return data", timeout=60)
    except TimeoutError:
        raise AssertionError("queries with no data:\n" + "\n".join(empty() or [])) from None
    print(f"{len(queries)} dashboard queries, each returned data")
