"""The shipped prometheus-operator objects, created against prometheus-operator's own CRDs.

The chart's ServiceMonitor, PodMonitor and PrometheusRule (each opt-in), config/'s
monitors (config/prometheus/monitors, added to an overlay beside config/default as its
kustomization says) and whatever monitoring objects the OLM bundle carries are created
for real, with strict field validation, on a local control plane of this module's own
that holds the ServiceMonitor, PodMonitor and PrometheusRule CRDs of the release
``hack/tools/prometheus-operator`` pins (``hack.monitoring_crds``, from the Go module
proxy). Strict validation refuses an unknown or misspelled field where the CRD's
structural schema would otherwise drop it, and the CRDs' patterns refuse a malformed
duration; the negative cases show both, with the apiserver naming the field.

The selectors are checked against what they must find: the PodMonitor's against the
labels the operator gives the daemon pods (its DaemonSet rendered from the chart's
ThunderCluster) and the port the daemon container declares; the ServiceMonitor's against
the operator's metrics Service, whose port it names, and that Service's against the
operator's pods. The apiserver evaluates each selector over Pods and Services made from
those templates.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import monitoring_crds
from hack.cluster import Cluster, binaries
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload import daemonset

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "thunder-device-plugin"
MONITORS = REPO / "config" / "prometheus" / "monitors"
BUNDLE = REPO / "bundle" / "manifests"
GROUP = "monitoring.coreos.com"
KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
ALL_ON = (
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.podMonitor.enabled=true",
    "--set",
    "metrics.prometheusRule.enabled=true",
)
# Non-default labels, intervals and timeouts for all three.
CUSTOM = (
    *ALL_ON,
    "--set",
    "metrics.serviceMonitor.interval=15s",
    "--set",
    "metrics.serviceMonitor.scrapeTimeout=5s",
    "--set",
    "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
    "--set",
    "metrics.podMonitor.interval=1m",
    "--set",
    "metrics.podMonitor.scrapeTimeout=20s",
    "--set",
    "metrics.podMonitor.labels.release=kube-prometheus-stack",
    "--set",
    "metrics.podMonitor.labels.team=gpu",
    "--set",
    "metrics.prometheusRule.labels.release=kube-prometheus-stack",
    "--set",
    "metrics.prometheusRule.labels.role=alert-rules",
)
CHART_SETS = {
    "defaults": ALL_ON,
    "custom": CUSTOM,
    "example-service-monitor": (*ALL_ON, "-f", str(CHART / "examples" / "service-monitor.yaml")),
}


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _monitoring(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["apiVersion"].split("/")[0] == GROUP]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


class Plane:
    """kubectl against this module's control plane."""

    def __init__(self, cluster: Cluster) -> None:
        self.kubeconfig = str(cluster.kubeconfig)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return _run([str(binaries() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], stdin)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.kubectl(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.ok("create", "namespace", name)
        return name

    def create_strictly(self, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Create `obj` (not a dry run) with strict field validation; the stored object."""
        self.ok("create", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
        kind, name = obj["kind"], obj["metadata"]["name"]
        stored: dict[str, Any] = json.loads(
            self.ok("get", f"{kind.lower()}s.{GROUP}", name, "-n", namespace, "-o", "json")
        )
        return stored

    def names(self, resource: str, namespace: str, selector: dict[str, Any]) -> set[str]:
        """What `selector` (a LabelSelector) finds among `resource` in `namespace`."""
        assert set(selector) == {"matchLabels"}, f"only matchLabels are evaluated: {selector}"
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector["matchLabels"].items()))
        listed = json.loads(self.ok("get", resource, "-n", namespace, "-l", labels, "-o", "json"))
        return {item["metadata"]["name"] for item in listed["items"]}

    def pod_from_template(self, name: str, template: dict[str, Any], namespace: str) -> None:
        """A Pod from a workload's pod template (it stays Pending: there is no node)."""
        account = template["spec"].get("serviceAccountName")
        if account and self.kubectl("get", "sa", account, "-n", namespace).returncode:
            self.ok("create", "serviceaccount", account, "-n", namespace)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
        }
        self.ok("create", "-n", namespace, "-f", "-", stdin=json.dumps(pod))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A control plane of this module's own with the pinned prometheus-operator CRDs."""
    paths = monitoring_crds.crd_paths()
    with Cluster(workdir=tmp_path_factory.mktemp("cp-monitoring")) as cluster:
        p = Plane(cluster)
        for path in paths.values():
            p.ok("apply", "--server-side", "-f", str(path))
        names = [
            f"crd/{yaml.safe_load(path.read_text())['metadata']['name']}" for path in paths.values()
        ]
        p.ok("wait", "--for=condition=Established", *names, "--timeout=60s")
        yield p


def helm_template(namespace: str, *args: str) -> list[dict[str, Any]]:
    done = _run(
        [str(binaries() / "helm"), "template", "tdp", str(CHART), "--namespace", namespace, *args]
    )
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def config_overlay(tmp_path: Path) -> list[dict[str, Any]]:
    """config/default with config/prometheus/monitors, as a user's overlay adds them."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    resources = [
        os.path.relpath(REPO / "config" / "default", overlay),
        os.path.relpath(MONITORS, overlay),
    ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"resources": resources}))
    done = _run([str(binaries() / "kubectl"), "kustomize", str(overlay)])
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def bundle_objects() -> list[dict[str, Any]]:
    return [d for path in sorted(BUNDLE.glob("*.yaml")) for d in _docs(path.read_text())]


def _kept(rendered: Any, stored: Any, where: str) -> None:
    """Every rendered value is in the stored object; the CRD's defaults may add others."""
    if isinstance(rendered, dict):
        assert isinstance(stored, dict), where
        for key, value in rendered.items():
            assert key in stored, f"{where}.{key} dropped"
            _kept(value, stored[key], f"{where}.{key}")
    elif isinstance(rendered, list):
        assert isinstance(stored, list), where
        assert len(stored) == len(rendered), where
        for i, (mine, theirs) in enumerate(zip(rendered, stored, strict=True)):
            _kept(mine, theirs, f"{where}[{i}]")
    else:
        assert stored == rendered, where


def _same(rendered: dict[str, Any], stored: dict[str, Any]) -> None:
    """Nothing rendered was dropped or changed on the way into the store."""
    _kept(rendered["spec"], stored["spec"], "spec")
    for key in ("name", "labels"):
        assert stored["metadata"][key] == rendered["metadata"][key]


def test_the_crds_are_the_pinned_release(plane: Plane) -> None:
    version = monitoring_crds.version()
    assert version == "v0.90.1"
    for kind, path in monitoring_crds.crd_paths().items():
        crd = yaml.safe_load(path.read_text())
        assert crd["spec"]["group"] == GROUP
        assert crd["spec"]["names"]["kind"] == kind
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.90.1"
        served = json.loads(plane.ok("get", "crd", crd["metadata"]["name"], "-o", "json"))
        assert [v["name"] for v in served["spec"]["versions"]] == ["v1"]
        schema = served["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        # A real schema, not a stand-in that keeps whatever it is given.
        assert not schema.get("x-kubernetes-preserve-unknown-fields")
        assert "spec" in schema["properties"]


@pytest.mark.parametrize("values", list(CHART_SETS), ids=list(CHART_SETS))
def test_the_charts_monitoring_objects_are_created(plane: Plane, values: str) -> None:
    namespace = plane.namespace("chart")
    objects = _monitoring(helm_template(namespace, *CHART_SETS[values]))
    assert sorted(o["kind"] for o in objects) == sorted(KINDS)
    for obj in objects:
        assert obj["metadata"]["namespace"] == namespace
        _same(obj, plane.create_strictly(obj, namespace))
    if values == "custom":
        by_kind = {o["kind"]: o for o in objects}
        endpoint = by_kind["ServiceMonitor"]["spec"]["endpoints"][0]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "5s")
        endpoint = by_kind["PodMonitor"]["spec"]["podMetricsEndpoints"][0]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m", "20s")
        assert by_kind["PrometheusRule"]["metadata"]["labels"]["role"] == "alert-rules"


def test_the_charts_monitoring_objects_are_off_by_default() -> None:
    assert not _monitoring(helm_template("thunder-system"))


def test_configs_monitors_are_created(plane: Plane, tmp_path: Path) -> None:
    objects = _monitoring(config_overlay(tmp_path))
    assert sorted(o["kind"] for o in objects) == ["PodMonitor", "ServiceMonitor"]
    # The same objects as the directory renders on its own.
    done = _run([str(binaries() / "kubectl"), "kustomize", str(MONITORS)])
    assert done.returncode == 0, done.stderr
    assert _monitoring(_docs(done.stdout)) == objects
    namespace = plane.namespace("config")
    for obj in objects:
        assert obj["metadata"]["namespace"] == "thunder-system"
        obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
        _same(obj, plane.create_strictly(obj, namespace))


def test_the_bundles_monitoring_objects_are_created(plane: Plane) -> None:
    objects = _monitoring(bundle_objects())
    # Today the bundle carries none (config/'s monitors are an overlay's choice); any it
    # carries later is created here like the chart's.
    assert {o["kind"] for o in objects} <= set(KINDS)
    namespace = plane.namespace("bundle")
    for obj in objects:
        _same(obj, plane.create_strictly(obj, namespace))


def _misspell(obj: dict[str, Any], path: list[str | int], new_key: str) -> dict[str, Any]:
    bad: dict[str, Any] = json.loads(json.dumps(obj))
    node: Any = bad
    for step in path[:-1]:
        node = node[step]
    node[new_key] = node.pop(path[-1])
    return bad


def _set(obj: dict[str, Any], path: list[str | int], value: str) -> dict[str, Any]:
    bad: dict[str, Any] = json.loads(json.dumps(obj))
    node: Any = bad
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return bad


# case -> (kind, how the rendered object is spoiled, what the apiserver's refusal says)
NEGATIVE: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "podmonitor-misspelled-endpoints": (
        "PodMonitor",
        lambda o: _misspell(o, ["spec", "podMetricsEndpoints"], "podMetricsEndpoint"),
        'unknown field "spec.podMetricsEndpoint"',
    ),
    "podmonitor-interval-30x": (
        "PodMonitor",
        lambda o: _set(o, ["spec", "podMetricsEndpoints", 0, "interval"], "30x"),
        "spec.podMetricsEndpoints[0].interval",
    ),
    "servicemonitor-misspelled-timeout": (
        "ServiceMonitor",
        lambda o: _misspell(o, ["spec", "endpoints", 0, "scrapeTimeout"], "scrapTimeout"),
        'unknown field "spec.endpoints[0].scrapTimeout"',
    ),
    "prometheusrule-misspelled-expr": (
        "PrometheusRule",
        lambda o: _misspell(o, ["spec", "groups", 0, "rules", 0, "expr"], "expression"),
        'unknown field "spec.groups[0].rules[0].expression"',
    ),
}


@pytest.mark.parametrize("case", list(NEGATIVE), ids=list(NEGATIVE))
def test_a_misspelled_or_malformed_field_is_refused_by_name(plane: Plane, case: str) -> None:
    kind, spoil, message = NEGATIVE[case]
    namespace = plane.namespace("refused")
    good = _one(_monitoring(helm_template(namespace, *ALL_ON)), kind)
    bad = spoil(good)
    done = plane.kubectl(
        "create", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(bad)
    )
    assert done.returncode != 0, done.stdout
    assert message in done.stderr, done.stderr
    name = good["metadata"]["name"]
    assert plane.kubectl("get", f"{kind.lower()}s.{GROUP}", name, "-n", namespace).returncode
    # The object as rendered is accepted: the refusal is the field's alone.
    plane.create_strictly(good, namespace)


def _daemon_pod_template(thundercluster: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The daemon pods' template as the operator renders it from this ThunderCluster."""
    spec = ThunderClusterSpec.model_validate(thundercluster["spec"])
    owner = ThunderClusterRef(thundercluster["metadata"]["name"], "uid-1")
    body = daemonset.render(spec, namespace, owner, "thunder-dra-daemon")
    assert body["metadata"]["namespace"] == namespace
    template: dict[str, Any] = body["spec"]["template"]
    return template


def _metrics_service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's metrics Service: the one with the scrape annotations."""
    (service,) = [
        o
        for o in objects
        if o["kind"] == "Service" and "prometheus.io/path" in o["metadata"].get("annotations", {})
    ]
    return service


def _port_names(template: dict[str, Any]) -> set[str]:
    return {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


def _check_pod_monitor(
    plane: Plane,
    monitor: dict[str, Any],
    daemon: dict[str, Any],
    operator: dict[str, Any],
    namespace: str,
) -> None:
    spec = monitor["spec"]
    selected = spec.get("namespaceSelector", {"matchNames": [monitor["metadata"]["namespace"]]})
    assert selected == {"matchNames": [namespace]}
    assert spec["selector"] == {"matchLabels": daemonset.selector_labels()}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in _port_names(daemon)
    assert endpoint["path"] == daemonset.SCRAPE_ANNOTATIONS["prometheus.io/path"]
    # The apiserver's own evaluation: the daemon's pod, not the operator's.
    plane.pod_from_template("daemon", daemon, namespace)
    plane.pod_from_template("operator", operator, namespace)
    assert plane.names("pods", namespace, spec["selector"]) == {"daemon"}


def _check_service_monitor(
    plane: Plane,
    monitor: dict[str, Any],
    service: dict[str, Any],
    operator: dict[str, Any],
    namespace: str,
) -> None:
    spec = monitor["spec"]
    selected = spec.get("namespaceSelector", {"matchNames": [monitor["metadata"]["namespace"]]})
    assert selected == {"matchNames": [namespace]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == service["metadata"]["annotations"]["prometheus.io/path"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] in _port_names(operator)
    service = {**service, "metadata": {**service["metadata"], "namespace": namespace}}
    plane.ok("create", "-n", namespace, "-f", "-", stdin=json.dumps(service))
    other = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "other", "labels": {"app.kubernetes.io/name": "thunder-dra-driver"}},
        "spec": {"ports": [{"name": "metrics", "port": 80}]},
    }
    plane.ok("create", "-n", namespace, "-f", "-", stdin=json.dumps(other))
    assert plane.names("services", namespace, spec["selector"]) == {service["metadata"]["name"]}
    assert plane.names("pods", namespace, {"matchLabels": service["spec"]["selector"]}) == {
        "operator"
    }


def test_the_charts_monitors_find_the_daemon_pods_and_the_metrics_service(plane: Plane) -> None:
    namespace = plane.namespace("chart-sel")
    objects = helm_template(namespace, *CUSTOM)
    operator = _one(objects, "Deployment")["spec"]["template"]
    daemon = _daemon_pod_template(_one(objects, "ThunderCluster"), namespace)
    _check_pod_monitor(plane, _one(objects, "PodMonitor"), daemon, operator, namespace)
    service = _metrics_service(objects)
    _check_service_monitor(plane, _one(objects, "ServiceMonitor"), service, operator, namespace)


def test_configs_monitors_find_the_daemon_pods_and_the_metrics_service(
    plane: Plane, tmp_path: Path
) -> None:
    objects = config_overlay(tmp_path)
    namespace = plane.namespace("config-sel")
    deployment = _one(objects, "Deployment")
    operator = deployment["spec"]["template"]
    samples = _run([str(binaries() / "kubectl"), "kustomize", str(REPO / "config" / "samples")])
    assert samples.returncode == 0, samples.stderr
    thundercluster = _one(_docs(samples.stdout), "ThunderCluster")
    daemon = _daemon_pod_template(thundercluster, namespace)
    # config/ runs the operator, and so the daemons, in the monitors' namespace.
    monitors = _monitoring(objects)
    assert {o["metadata"]["namespace"] for o in monitors} == {deployment["metadata"]["namespace"]}
    moved = [{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in monitors]
    service = _metrics_service(objects)
    _check_pod_monitor(plane, _one(moved, "PodMonitor"), daemon, operator, namespace)
    _check_service_monitor(plane, _one(moved, "ServiceMonitor"), service, operator, namespace)


def test_configs_service_monitor_finds_the_bundles_metrics_service(plane: Plane) -> None:
    """An OLM install scraped through config/'s ServiceMonitor: the bundle's Service and
    the CSV's operator Deployment."""
    objects = bundle_objects()
    csv = _one(objects, "ClusterServiceVersion")
    (deployment,) = csv["spec"]["install"]["spec"]["deployments"]
    operator = deployment["spec"]["template"]
    service = _metrics_service(objects)
    done = _run([str(binaries() / "kubectl"), "kustomize", str(MONITORS)])
    assert done.returncode == 0, done.stderr
    monitor = _one(_docs(done.stdout), "ServiceMonitor")
    namespace = plane.namespace("bundle-sel")
    monitor = {**monitor, "metadata": {**monitor["metadata"], "namespace": namespace}}
    plane.pod_from_template("operator", operator, namespace)
    _check_service_monitor(plane, monitor, service, operator, namespace)
