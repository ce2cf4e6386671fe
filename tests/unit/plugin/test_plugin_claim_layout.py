"""A pod claim's files on the node: one layout, the same from prepare and from a rebuild."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.plugin.lifecycle_node import World
from thunder_dra.plugin.files.cdi import CdiError, CdiSpecStore
from thunder_dra.plugin.files.clientconfig import ClientConfigError
from thunder_dra.plugin.files.layout import ClaimLayout
from thunder_dra.plugin.state.checkpoint import (
    CHECKPOINT_FILE_NAME,
    Consumer,
    PreparedClaim,
)

UID = "5d0c8f6e-3a1b-4c2d-9e8f-0a1b2c3d4e5f"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_claims_files_are_its_directory_config_spec_and_library(tmp_path: Path) -> None:
    layout = ClaimLayout(claims_dir=tmp_path / "claims", cdi_dir=tmp_path / "cdi")
    library = tmp_path / "cache" / "sha256" / ("a" * 64) / "libthunder.so"
    files = layout.files(UID, library)
    assert files.directory == tmp_path / "claims" / UID
    assert files.config_json == files.directory / "config.json" == layout.config_json(UID)
    assert files.cdi_spec == CdiSpecStore(tmp_path / "cdi").path_for(UID)
    assert files.paths == (
        str(files.directory),
        str(files.config_json),
        str(files.cdi_spec),
        str(library),
    )
    claim = PreparedClaim(
        uid=UID,
        namespace="team-a",
        name="train",
        consumer=Consumer(kind="pod", name="train-pod"),
        zone_name="us-east",
        zone_id="zone-1",
        gpu_type="A6000",
        gpu_count=1,
        paths=files.paths,
    )
    assert claim.library == library


@pytest.mark.parametrize(
    ("uid", "error"),
    [("../etc", ClientConfigError), (".hidden", ClientConfigError), ("x-", CdiError)],
)
def test_a_uid_that_cannot_name_a_file_is_refused(
    tmp_path: Path, uid: str, error: type[Exception]
) -> None:
    layout = ClaimLayout(claims_dir=tmp_path / "claims", cdi_dir=tmp_path / "cdi")
    with pytest.raises(error, match=f"{uid!r}"):
        layout.files(uid, tmp_path / "libthunder.so")


async def test_prepare_and_a_rebuild_record_the_files_of_the_layout(world: World) -> None:
    daemon = await world.start()
    ref = world.claim("train")
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    assert prepared.library is not None
    files = daemon.config.claim_layout.files(ref.uid, prepared.library)
    assert prepared.paths == files.paths
    assert files.config_json.is_file()
    assert files.cdi_spec.is_file()
    await daemon.stop()
    (daemon.config.state_dir / CHECKPOINT_FILE_NAME).unlink()  # lost: rebuilt from records
    daemon = await world.start()
    assert world.checkpoint_claims()[ref.uid]["paths"] == list(files.paths)
    await daemon.stop()
