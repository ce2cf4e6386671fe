"""ops/deploy.py decisions that need no cluster: settings, the prompt and the guard."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import pytest

from ops import deploy as ops


def test_settings_come_from_the_make_variables() -> None:
    s = ops.Settings.from_env(
        {"RELEASE": "r", "NAMESPACE": "n", "FORCE": "1", "YES": "true", "HELM_ARGS": "--set a=b"}
    )
    assert (s.release, s.namespace, s.force, s.yes) == ("r", "n", True, True)
    assert s.helm_args == ("--set", "a=b")
    d = ops.Settings.from_env({})
    assert (d.release, d.namespace, d.force, d.yes) == (
        "thunder-device-plugin",
        "thunder-system",
        False,
        False,
    )


def test_confirm_needs_the_exact_context() -> None:
    out = io.StringIO()
    assert ops.confirm("remove it", "prod-eu", io.StringIO("prod-eu\n"), out)
    assert "on cluster context: prod-eu" in out.getvalue()
    assert not ops.confirm("remove it", "prod-eu", io.StringIO("prod\n"), io.StringIO())
    assert not ops.confirm("remove it", "prod-eu", io.StringIO(""), io.StringIO())


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@dataclass
class FakeCluster:
    settings: ops.Settings
    live: list[tuple[str | None, str]] = field(default_factory=list)
    context: str = "ctx"

    def clients(self) -> list[tuple[str | None, str]]:
        return self.live


def _guard(cluster: FakeCluster, answer: str, tty: bool = True) -> str:
    stdin: Any = TTY(answer) if tty else io.StringIO(answer)
    out = io.StringIO()
    ops.guard(cluster, "uninstall release r", stdin, out)  # type: ignore[arg-type]
    return out.getvalue()


def test_guard_refuses_while_clients_exist_unless_forced() -> None:
    live: list[tuple[str | None, str]] = [("default", "claim-1")]
    with pytest.raises(ops.Refused, match=r"1 clients\.thundercompute\.com still exist"):
        _guard(FakeCluster(ops.Settings.from_env({"YES": "1"}), live), "")
    said = _guard(FakeCluster(ops.Settings.from_env({"FORCE": "1"}), live), "ctx\n")
    assert "FORCE=1" in said


def test_guard_asks_unless_yes_and_needs_a_terminal() -> None:
    with pytest.raises(ops.Refused, match="not typed back"):
        _guard(FakeCluster(ops.Settings.from_env({})), "other\n")
    with pytest.raises(ops.Refused, match="YES=1"):
        _guard(FakeCluster(ops.Settings.from_env({})), "ctx\n", tty=False)
    assert "YES=1" in _guard(FakeCluster(ops.Settings.from_env({"YES": "1"})), "", tty=False)
    _guard(FakeCluster(ops.Settings.from_env({})), "ctx\n")
