"""Durable writes that fail: the daemon's state directory is a small tmpfs that the test
fills up (ENOSPC, a real kernel error), and a corrupt checkpoint that is set aside. No
enrollment is lost or leaked, the kubelet gets a per-claim error, and a retry succeeds
once the disk has room again."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    DirectClaim,
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    files_under,
    live_clients,
)
from hack.testbed.kube import Kube, wait_for

PAGE = 4096
STATE_SIZE = "4m"


def _free_pages(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize // PAGE


class StateDisk:
    """The daemon's state directory on its own tmpfs, with a filler file to make it full."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.filler = directory / "filler.bin"

    def mount(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={STATE_SIZE},mode=0700", "tmpfs", self.directory],
            check=True,
        )

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", self.directory], check=False)

    def fill(self, leave_pages: int) -> None:
        """Leave exactly ``leave_pages`` free 4 KiB pages (tmpfs counts whole pages)."""
        self.free()
        take = _free_pages(self.directory) - leave_pages
        assert take > 0
        with self.filler.open("wb") as out:
            out.write(b"\0" * take * PAGE)
        assert _free_pages(self.directory) == leave_pages

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def node(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool
) -> Iterator[tuple[NodeHarness, StateDisk]]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs state directory needs root")
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        disk = StateDisk(harness.daemon.state_dir)
        disk.mount()
        try:
            harness.daemon.start().wait_serving()
            yield harness, disk
        finally:
            disk.free()
            harness.daemon.stop()
            disk.unmount()


def _ok(answers: object, claims: list[DirectClaim]) -> None:
    for claim in claims:
        error = answers[claim.uid].error  # type: ignore[index]
        assert error == "", f"{claim.name}: {error}"


def _client_record(kube: Kube, claim: DirectClaim) -> dict[str, object] | None:
    return kube.get(CLIENT_API, "Client", f"claim-{claim.uid}", claim.namespace)


def _assert_nothing_enrolled(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> None:
    audit = fake.admin.audit()
    assert audit["leaks"] == []
    assert audit["orphanClients"] == []
    assert live_clients(fake, pool.zone_id) == []


def test_a_full_disk_at_the_checkpoint_write_rolls_the_prepare_back(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    node: tuple[NodeHarness, StateDisk],
) -> None:
    harness, disk = node
    daemon = harness.daemon
    earlier = allocated_claims(kube, namespace, pool, 4, prefix="kept")
    _ok(dra_prepare(daemon, earlier), earlier)
    [claim] = allocated_claims(kube, namespace, pool, 1, prefix="full")

    # Two free pages: enough for the journal entry (and its rewrites) and config.json,
    # not for the checkpoint's new copy. The mint and the exchange happen; the commit fails.
    disk.fill(leave_pages=2)
    answer = dra_prepare(daemon, [claim])[claim.uid]
    assert answer.error.startswith(f"claim {namespace}/{claim.name}: ")
    assert "No space left on device" in answer.error
    assert list(answer.devices) == []

    # Rolled back from what is durable: the failed attempt's token and client are revoked,
    # its Client record and files are gone, its journal entry closed.
    assert fake.admin.audit()["leaks"] == []
    assert [c["displayName"] for c in live_clients(fake, pool.zone_id)].count(claim.name) == 0
    assert len(live_clients(fake, pool.zone_id)) == len(earlier)
    assert _client_record(kube, claim) is None
    assert not (daemon.state_dir / "claims" / claim.uid).exists()
    assert not list(daemon.cdi_dir.glob(f"*{claim.uid}*"))
    assert daemon.journal_entries() == []
    # The claims prepared before are untouched.
    checkpoint = json.loads((daemon.state_dir / "checkpoint.json").read_text())
    assert sorted(checkpoint["payload"]["claims"]) == sorted(c.uid for c in earlier)

    disk.free()
    _ok(dra_prepare(daemon, [claim]), [claim])
    [client] = [c for c in live_clients(fake, pool.zone_id) if c["displayName"] == claim.name]
    record = _client_record(kube, claim)
    assert record is not None
    assert record["spec"]["clientId"] == client["clientId"]  # type: ignore[index]

    _ok(dra_unprepare(daemon, [*earlier, claim]), [*earlier, claim])
    _assert_nothing_enrolled(kube, fake, pool)
    assert not list(files_under(daemon.cdi_dir))


def test_a_full_disk_at_unprepare_keeps_the_claim_until_a_retry(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    node: tuple[NodeHarness, StateDisk],
) -> None:
    harness, disk = node
    daemon = harness.daemon
    claims = allocated_claims(kube, namespace, pool, 2, prefix="unp")
    _ok(dra_prepare(daemon, claims), claims)

    disk.fill(leave_pages=0)
    answers = dra_unprepare(daemon, claims)
    for claim in claims:
        assert answers[claim.uid].error.startswith(f"claim {namespace}/{claim.name}: ")
        assert "No space left on device" in answers[claim.uid].error
    # Nothing was revoked: the claims are still prepared as the kubelet believes.
    assert len(live_clients(fake, pool.zone_id)) == 2
    assert all(_client_record(kube, c) is not None for c in claims)

    disk.free()
    _ok(dra_unprepare(daemon, claims), claims)
    _assert_nothing_enrolled(kube, fake, pool)
    # The records go right after the answer, once the enrollments are revoked.
    wait_for(
        lambda: all(_client_record(kube, c) is None for c in claims),
        "the Client records removed",
        timeout=30,
    )
    wait_for(lambda: daemon.journal_entries() == [], "the mint journal empty", timeout=30)
