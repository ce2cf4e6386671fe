"""`make demo` is the product's whole flow as a user watches it; it must keep working.

It runs the real operator and daemons against the fake Thunder service on the
local control plane: enrollment of a serving node, the zone pool at target 1.5,
two pods scheduled, prepared and cleaned up, no token in any CDI spec and no
leaked enrollment at the end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_runs_the_whole_flow_and_cleans_up() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hack.demo", "--simulated"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert "4x A6000 (active)" in out
    assert "thunder-gpu-a6000   thundercompute.com/gpu-a6000" in out
    assert "zone-a/a6000   a6000-0,a6000-1,a6000-2,a6000-3,a6000-4,a6000-5   1.5" in out
    assert out.count("Running") >= 2
    assert out.count("NO TOKEN") == 2
    assert "TOKEN FOUND" not in out
    assert "Thunder audit: 0 leaked enrollments" in out
    assert "every process stopped" in out
