"""A real Prometheus server for the real-node tests: Kubernetes discovery, the shipped rules.

``hack/build-prometheus.sh`` builds the server (3.x, only Kubernetes service discovery
compiled in) into the cache. `Prometheus` runs it as a plain process like the
registry (``hack.registry``): tied to the thread that starts it, its TSDB under the
caller's work directory, its HTTP API on ``127.0.0.1`` and a free port.

What it scrapes is what the chart gives a Prometheus to find, and nothing written for
the test: `annotation_scrape_configs` is the configuration a platform team writes for
the ``prometheus.io/*`` annotations (the operator's metrics Service by its endpoints,
each daemon pod by its own), the common convention, with the pod's node kept as the
``node`` label as the chart's PodMonitor does. Discovery reads the apiserver through
a kubeconfig.

    with Prometheus(workdir, config) as prom:
        prom.query('thunder_dra_operator_pools')      # the result vector
        prom.targets()                                # the active targets
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from hack import supervise
from hack.cluster.launcher import free_port
from hack.tied import tied

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-prometheus.sh"


class PrometheusError(RuntimeError):
    """Prometheus could not start, or its API answered with an error."""


def binary() -> Path:
    """The built server (``hack/build-prometheus.sh`` builds it when missing)."""
    done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PrometheusError(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def _keep_annotated(role: str) -> list[dict[str, Any]]:
    meta = f"__meta_kubernetes_{role}_annotation"
    return [
        {"source_labels": [f"{meta}_prometheus_io_scrape"], "regex": "true", "action": "keep"},
        {"source_labels": [f"{meta}_prometheus_io_path"], "regex": "(.+)",
         "target_label": "__metrics_path__"},
        {"source_labels": ["__address__", f"{meta}_prometheus_io_port"],
         "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
         "target_label": "__address__"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]  # fmt: skip


def annotation_scrape_configs(
    kubeconfig: Path, namespaces: list[str], interval: str = "2s"
) -> list[dict[str, Any]]:
    """Scrape jobs for the ``prometheus.io/scrape``, ``/port`` and ``/path`` annotations:
    on Services (through their endpoints) and on pods."""

    def discovery(role: str) -> list[dict[str, Any]]:
        return [
            {"role": role, "kubeconfig_file": str(kubeconfig), "namespaces": {"names": namespaces}}
        ]

    return [
        {
            "job_name": "annotated-services",
            "scrape_interval": interval,
            "kubernetes_sd_configs": discovery("endpoints"),
            "relabel_configs": _keep_annotated("service"),
        },
        {
            "job_name": "annotated-pods",
            "scrape_interval": interval,
            "kubernetes_sd_configs": discovery("pod"),
            # Each declared container port is discovered as a target; rewritten to the
            # annotation's port they are one target, which Prometheus keeps once.
            "relabel_configs": _keep_annotated("pod"),
        },
    ]  # fmt: skip


class Prometheus(supervise.Served):
    """One Prometheus process: ``start`` (or ``with``) runs it, ``stop`` ends it."""

    grace = 20

    def __init__(self, workdir: Path, config: dict[str, Any], rules: str | None = None) -> None:
        self.workdir = workdir
        self.config = config
        self.rules = rules
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self) -> Prometheus:
        server = binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = dict(self.config)
        if self.rules is not None:
            rules = self.workdir / "rules.yaml"
            rules.write_text(self.rules)
            config["rule_files"] = [str(rules)]
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        command = [
            str(server),
            f"--config.file={path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]
        with self.log.open("ab") as out:
            self._popen = subprocess.Popen(
                tied(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code = self._popen.poll()
            if code is not None:
                tail = supervise.log_tail(self.log, 30)
                raise PrometheusError(f"prometheus exited with code {code}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"prometheus was not ready on {self.url} within 60s")

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; its ``data`` (raises on an error status)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            raise PrometheusError(f"GET /api/v1/{path}{query}: HTTP {err.code}: {detail}") from err
        if body.get("status") != "success":
            raise PrometheusError(f"GET /api/v1/{path}{query}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; a scalar as one sample)."""
        data = self.api("query", query=promql)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])
