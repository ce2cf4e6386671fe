"""What a set-aside checkpoint still tells the rebuild of lost entries."""

from __future__ import annotations

from pathlib import Path

from thunder_dra.plugin.claims.rebuild import _claims_in_set_aside
from thunder_dra.plugin.state import checkpoint as ck


def _claim(uid: str) -> ck.PreparedClaim:
    return ck.PreparedClaim(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid}",
        consumer=ck.Consumer(kind="pod", name="trainer-0"),
        zone_name="us-east",
        zone_id="zone-123",
        gpu_type="A6000",
        gpu_count=1,
        enrollment_token_id="etok-1",
        state=ck.ClaimState.PREPARED,
    )


def test_a_set_aside_checkpoint_that_still_parses_names_its_claims(tmp_path: Path) -> None:
    good = ck.encode_checkpoint(ck.Checkpoint().with_claim(_claim("uid-1")))
    edited = good.replace(b'"gpuCount":1', b'"gpuCount":2')  # checksum now wrong
    (tmp_path / "checkpoint.json.corrupt-20260101T000000000000Z").write_bytes(edited)
    (tmp_path / "checkpoint.json.corrupt-20260101T000000000001Z").write_bytes(good[:-30])
    assert _claims_in_set_aside(tmp_path, "checkpoint.json") == {("team-a", "uid-1")}
