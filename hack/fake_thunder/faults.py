"""Fault injection rules of the fake service (thunder-api.md 6.3).

A rule matches a method (``*`` = any) and a path glob (``fnmatch``; ``*`` also spans ``/``)
and may set ``status`` (with an optional ``body`` and ``headers``), ``latencyMs``, ``times``
(1 = one-shot, absent = until cleared), ``after`` (apply the real effect, then answer
with the fault: a mint or exchange succeeds but its answer is lost) and ``zoneId`` (only
requests whose JSON body names that zone, e.g. mints in one zone). The first matching rule
wins; a rule whose ``times`` are used up disappears.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from hack.fake_thunder.messages import FakeResponse, HttpError, error_body_for


@dataclass
class FaultRule:
    rule_id: str
    method: str
    path: str
    status: int | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    latency_ms: int = 0
    times: int | None = None
    after: bool = False
    zone_id: str | None = None

    def matches(self, method: str, path: str, zone_id: str | None = None) -> bool:
        method_ok = self.method == "*" or self.method == method.upper()
        zone_ok = self.zone_id is None or self.zone_id == zone_id
        return method_ok and zone_ok and fnmatch.fnmatchcase(path, self.path)

    def response(self) -> FakeResponse:
        assert self.status is not None
        headers = dict(self.headers)
        if self.body is None:
            payload = json.dumps(error_body_for(self.status)).encode()
            headers.setdefault("Content-Type", "application/json")
        elif isinstance(self.body, str):
            payload = self.body.encode()
            headers.setdefault("Content-Type", "text/plain")
        else:
            payload = json.dumps(self.body).encode()
            headers.setdefault("Content-Type", "application/json")
        return FakeResponse(self.status, payload, headers)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.rule_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "body": self.body,
            "headers": self.headers,
            "latencyMs": self.latency_ms,
            "times": self.times,
            "after": self.after,
            "zoneId": self.zone_id,
        }


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise HttpError(400, "BadRequest", message)


class FaultBook:
    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = count(1)

    def add(self, spec: dict[str, Any]) -> FaultRule:
        known = {
            "method",
            "path",
            "status",
            "body",
            "headers",
            "latencyMs",
            "times",
            "after",
            "zoneId",
        }
        unknown = set(spec) - known
        _check(not unknown, f"unknown fault fields: {sorted(unknown)}")
        path = spec.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise HttpError(400, "BadRequest", "path must be a glob starting with '/'")
        method = spec.get("method", "*")
        _check(isinstance(method, str) and bool(method), "method must be a string")
        status = spec.get("status")
        _check(
            status is None or (type(status) is int and 100 <= status <= 599),
            "status must be an HTTP status code",
        )
        latency = spec.get("latencyMs", 0)
        _check(type(latency) is int and latency >= 0, "latencyMs must be an int >= 0")
        times = spec.get("times")
        _check(times is None or (type(times) is int and times >= 1), "times must be an int >= 1")
        after = spec.get("after", False)
        _check(type(after) is bool, "after must be a bool")
        _check(status is not None or latency > 0, "a fault needs a status or a latencyMs")
        _check(not after or status is not None, "after needs a status")
        zone_id = spec.get("zoneId")
        _check(
            zone_id is None or (isinstance(zone_id, str) and bool(zone_id)),
            "zoneId must be a string",
        )
        headers = spec.get("headers") or {}
        _check(
            isinstance(headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()),
            "headers must map strings to strings",
        )
        rule = FaultRule(
            rule_id=f"fault-{next(self._ids)}",
            method=method.upper(),
            path=path,
            status=status,
            body=spec.get("body"),
            headers=headers,
            latency_ms=latency,
            times=times,
            after=after,
            zone_id=zone_id,
        )
        self._rules.append(rule)
        return rule

    def take(self, method: str, path: str, zone_id: str | None = None) -> FaultRule | None:
        """The first matching rule, counting this use against its ``times``; ``zone_id`` is
        the zone the request's body names, if any."""
        for rule in self._rules:
            if rule.matches(method, path, zone_id):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times == 0:
                        self._rules.remove(rule)
                return rule
        return None

    def remove(self, rule_id: str) -> bool:
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.rule_id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()

    def to_json(self) -> list[dict[str, Any]]:
        return [rule.to_json() for rule in self._rules]
