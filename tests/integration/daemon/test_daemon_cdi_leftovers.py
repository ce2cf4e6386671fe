"""Temporary CDI spec files that a crash left: the daemon removes its own at start-up and
never touches another vendor's in the shared CDI directory."""

from __future__ import annotations

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import NodeHarness, ZonePool
from hack.testbed.kube import Kube
from thunder_dra import fsutil

LEFTOVER = "removed temporary CDI spec files left by a crash"


def test_start_up_removes_the_temporary_spec_files_a_crash_left_and_only_those(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool
) -> None:
    with NodeHarness(kube, fake, zone=pool.zone) as node:
        cdi_dir = node.daemon.cdi_dir
        cdi_dir.mkdir(parents=True)
        # A daemon killed between writing a spec's temporary file and renaming it.
        ours = fsutil.temp_path_for(cdi_dir / "thundercompute.com-gpu_claim-0f1e2d3c.json")
        ours.write_text('{"cdiVersion": "0.6.0", "kind": "thundercompute.com/gpu", "dev')
        # Another vendor's spec and its own temporary file, mid-write as far as we know.
        theirs = [
            cdi_dir / "nvidia.com-gpu.yaml",
            cdi_dir / ".nvidia.com-gpu_claim-x.json.tmp-0123456789ab",
        ]
        for path in theirs:
            path.write_text("cdiVersion: 0.6.0")

        node.daemon.start().wait_serving()

        assert not ours.exists()
        assert sorted(p.name for p in cdi_dir.iterdir()) == sorted(p.name for p in theirs)
        assert all(p.read_text() == "cdiVersion: 0.6.0" for p in theirs)
        [removed] = [r for r in node.daemon.log_records() if r.get("message") == LEFTOVER]
        assert removed["count"] == 1
        assert removed["cdi_dir"] == str(cdi_dir)
