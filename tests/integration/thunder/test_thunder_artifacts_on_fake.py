"""The artifact fetcher over HTTP against the fake artifact host (thunder-api.md 6.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hack.fake_thunder import LIBRARY_SHA256, FakeThunderProcess
from thunder_dra.thunder import (
    ArtifactDigestMismatch,
    ArtifactError,
    ArtifactFetcher,
    RetryPolicy,
)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_download_verify_and_switches(
    fake_thunder: FakeThunderProcess, tmp_path: Path
) -> None:
    fetcher = ArtifactFetcher(
        component="daemon",
        registry=CollectorRegistry(),
        retry=RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01),
    )
    try:
        pins = await fetcher.fetch_installer(fake_thunder.installer_url)
        assert pins.artifact_base_url == fake_thunder.artifact_base_url
        assert pins.libthunder_sha256 == LIBRARY_SHA256
        cached = tmp_path / LIBRARY_SHA256
        await fetcher.download_library(pins.library_url, pins.libthunder_sha256, cached)

        fake_thunder.admin.set_switches(corruptLibrary=True)
        with pytest.raises(ArtifactDigestMismatch):
            await fetcher.download_library(pins.library_url, LIBRARY_SHA256, tmp_path / "x")
        fake_thunder.admin.set_switches(corruptLibrary=False, omitDigest=True)
        with pytest.raises(ArtifactError, match="libthunder_sha256"):
            await fetcher.fetch_installer(fake_thunder.installer_url)
        fake_thunder.admin.set_switches(omitDigest=False, libraryStatus=503)
        with pytest.raises(ArtifactError, match="503"):
            await fetcher.download_library(pins.library_url, LIBRARY_SHA256, tmp_path / "y")
        fake_thunder.admin.set_switches(libraryStatus=200)
        fake_thunder.admin.add_fault("/artifacts/install.sh", status=502, times=1)
        assert (await fetcher.fetch_installer(fake_thunder.installer_url)).libthunder_sha256
    finally:
        await fetcher.aclose()
    assert _names(tmp_path) == [LIBRARY_SHA256]
    statuses = [d["status"] for d in fake_thunder.admin.downloads()]
    assert statuses == [200, 200, 200, 200, 503, 503, 502, 200]
