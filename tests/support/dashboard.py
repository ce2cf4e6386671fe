"""The shipped Grafana dashboard (charts/thunder-device-plugin/files/dashboard.json), read
as the tests need it: its panels, and each panel's queries as plain PromQL.

Grafana fills a query's variables before it sends it to Prometheus; `panel_queries`
does the same with fixed values, so a test can check every query with promtool or run
it against the Prometheus HTTP API (`/api/v1/query`) as it stands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[2]
DASHBOARD: Final = REPO / "charts" / "thunder-device-plugin" / "files" / "dashboard.json"

# Grafana's built-in interval variables, in every spelling a query may use.
_INTERVALS: Final = ("__rate_interval", "__interval", "__range")
_VARIABLE: Final = re.compile(r"\$(\{[^}]*\}|\w+)|\[\[[^\]]*\]\]")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel that shows data: rows left out, the panels of a collapsed row in."""
    for panel in (board if board is not None else dashboard())["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def substitute(expr: str, interval: str = "5m") -> str:
    """`expr` with Grafana's interval variables replaced by `interval`; ValueError when
    another variable is left, which plain PromQL cannot carry."""
    for name in _INTERVALS:
        expr = expr.replace(f"${{{name}}}", interval).replace(f"${name}", interval)
    left = _VARIABLE.search(expr)
    if left is not None:
        raise ValueError(f"dashboard query uses the variable {left.group(0)}: {expr}")
    return expr


def panel_queries(interval: str = "5m") -> list[tuple[str, str]]:
    """(panel title, query) for every query of every panel, as plain PromQL: the
    interval variables (`$__rate_interval`, `$__interval`, `$__range`) become `interval`,
    which should be at least four scrape intervals for `rate` to find two samples."""
    return [
        (panel["title"], substitute(target["expr"], interval))
        for panel in panels()
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
