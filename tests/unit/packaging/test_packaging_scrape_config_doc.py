"""docs/observability.md's scrape configuration is the one the real-node tests run.

"What to scrape" shows platform teams two Prometheus jobs for the chart's
``prometheus.io/*`` annotations; ``hack.prometheus.annotation_scrape_configs`` is what
``tests/e2e/node/test_node_prometheus.py`` gives a real Prometheus. They must not drift:
the documented jobs are the tested ones, but for the test platform's own settings (the
kubeconfig discovery reads the apiserver with, and a short scrape interval).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hack.prometheus import annotation_scrape_configs

DOC = Path(__file__).resolve().parents[3] / "docs" / "observability.md"


def documented_jobs() -> list[dict[str, Any]]:
    text = DOC.read_text()
    section = text.split("### What to scrape", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    configs = [yaml.safe_load(b) for b in blocks if "scrape_configs:" in b]
    assert len(configs) == 1, "What to scrape should show one scrape configuration"
    jobs: list[dict[str, Any]] = configs[0]["scrape_configs"]
    return jobs


def test_the_documented_jobs_are_the_ones_the_real_node_tests_scrape_with() -> None:
    tested = annotation_scrape_configs(Path("/kubeconfig"), ["thunder-system"])
    for job in tested:
        del job["scrape_interval"]
        for discovery in job["kubernetes_sd_configs"]:
            assert discovery.pop("kubeconfig_file") == "/kubeconfig"
    assert documented_jobs() == tested


def test_both_jobs_keep_only_annotated_targets_and_label_the_node() -> None:
    for job in documented_jobs():
        rules = job["relabel_configs"]
        assert rules[0]["action"] == "keep"
        assert rules[0]["regex"] == "true"
        assert rules[0]["source_labels"][0].endswith("_annotation_prometheus_io_scrape")
        node = {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
        assert node in rules
