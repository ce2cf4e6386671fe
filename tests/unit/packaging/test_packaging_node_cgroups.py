"""A host with only cgroup v2 cannot run the real node: the launcher says so, loudly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hack.node import launcher


def _unified(root: Path) -> Path:
    """A cgroup v2 mount as the kernel shows it: controllers listed at the top."""
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return root


def test_only_cgroup_v2_is_an_error_naming_what_the_host_needs(tmp_path: Path) -> None:
    with pytest.raises(launcher.NodeError) as raised:
        launcher.require_cgroup_v1(_unified(tmp_path / "cgroup"))
    message = str(raised.value)
    assert "only cgroup v2" in message
    assert "systemd.unified_cgroup_hierarchy=0" in message


def test_v1_hierarchies_beside_a_unified_one_are_enough(tmp_path: Path) -> None:
    # Hybrid, as on this project's machines: v1 hierarchies, v2 at unified/.
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True)
    _unified(root / "unified")
    launcher.require_cgroup_v1(root)


def test_node_unavailable_raises_on_a_v2_only_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(launcher, "CGROUP_FS", _unified(tmp_path / "cgroup"))
    with pytest.raises(launcher.NodeError, match="only cgroup v2"):
        launcher.node_unavailable()
