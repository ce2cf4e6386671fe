"""Installer pins and the verified library download (thunder-api.md 3.1)."""

from __future__ import annotations

import hashlib
import random
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from hack.fake_thunder import LIBRARY, LIBRARY_SHA256, AsyncFakeThunderAdmin, FakeThunder
from tests.unit.thunder.doubles import FakeClock, Recorder, respond, sequence
from thunder_dra.thunder import (
    ArtifactDigestMismatch,
    ArtifactError,
    ArtifactFetcher,
    RetryPolicy,
    ThunderTransportError,
    parse_installer,
)

PAYLOAD = b"\x7fELF" + bytes(range(256)) * 64
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
INSTALLER = f"""#!/bin/sh
set -eu
default_artifact_base_url='https://cdn.example.test/thunder/'
  libthunder_sha256="{DIGEST}"
echo installing
""".encode()


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


Fetcher = Callable[..., tuple[ArtifactFetcher, Recorder]]


@pytest.fixture
async def make_fetcher(
    clock: FakeClock,
) -> AsyncIterator[Callable[..., tuple[ArtifactFetcher, Recorder]]]:
    made: list[ArtifactFetcher] = []

    def make(
        answer: Callable[[httpx.Request], httpx.Response], **options: object
    ) -> tuple[ArtifactFetcher, Recorder]:
        recorder = Recorder(answer)
        fetcher = ArtifactFetcher(
            component="daemon",
            transport=httpx.MockTransport(recorder),
            clock=clock,
            rng=random.Random(3),
            registry=CollectorRegistry(),
            **options,  # type: ignore[arg-type]
        )
        made.append(fetcher)
        return fetcher, recorder

    yield make
    for fetcher in made:
        await fetcher.aclose()


def test_parse_installer_pins() -> None:
    pins = parse_installer(INSTALLER.decode(), "https://get.example.test/install.sh")
    assert pins.artifact_base_url == "https://cdn.example.test/thunder"
    assert pins.libthunder_sha256 == DIGEST
    assert pins.library_url == "https://cdn.example.test/thunder/libthunder.so"


def test_missing_base_falls_back_to_the_installer_directory() -> None:
    pins = parse_installer(
        f'libthunder_sha256="{DIGEST}"\n', "https://get.example.test/x/install.sh"
    )
    assert pins.library_url == "https://get.example.test/x/libthunder.so"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("default_artifact_base_url='https://x'\n", "no line libthunder_sha256"),
        (f'# libthunder_sha256="{DIGEST}" is commented\n', "no line libthunder_sha256"),
        (f'libthunder_sha256="{DIGEST.upper()}"\n', "no line libthunder_sha256"),
        (f'libthunder_sha256="{DIGEST[:-1]}"\n', "no line libthunder_sha256"),
        (f"default_artifact_base_url='ftp://x'\nlibthunder_sha256=\"{DIGEST}\"\n", "not an http"),
    ],
)
def test_bad_installers_are_rejected_clearly(text: str, problem: str) -> None:
    with pytest.raises(ArtifactError, match=problem):
        parse_installer(text, "https://get.example.test/install.sh")


async def test_fetch_installer_sends_no_credentials(
    make_fetcher: Fetcher,
) -> None:
    fetcher, recorder = make_fetcher(sequence(respond(200, INSTALLER)))
    pins = await fetcher.fetch_installer("https://get.example.test/install.sh")
    assert pins.libthunder_sha256 == DIGEST
    assert "authorization" not in recorder.last.headers
    assert recorder.last.headers["user-agent"].endswith("(daemon)")


@pytest.mark.parametrize("status", [204, 203, 404, 403])
async def test_installer_needs_status_200(make_fetcher: Fetcher, status: int) -> None:
    fetcher, recorder = make_fetcher(sequence(respond(status, INSTALLER)))
    with pytest.raises(ArtifactError, match=f"answered {status}.*expected 200"):
        await fetcher.fetch_installer("https://get.example.test/install.sh")
    assert len(recorder.requests) == 1


async def test_installer_5xx_is_retried(
    make_fetcher: Fetcher,
) -> None:
    fetcher, recorder = make_fetcher(sequence(respond(503, b""), respond(200, INSTALLER)))
    await fetcher.fetch_installer("https://get.example.test/install.sh")
    assert len(recorder.requests) == 2


async def test_installer_is_read_at_most_one_mebibyte(
    make_fetcher: Fetcher,
) -> None:
    huge = INSTALLER + b"#" * (1024 * 1024)

    async def stream() -> AsyncIterator[bytes]:
        yield huge

    fetcher, _ = make_fetcher(lambda request: httpx.Response(200, content=stream()))
    with pytest.raises(ArtifactError, match="exceeds the 1048576-byte limit"):
        await fetcher.fetch_installer("https://get.example.test/install.sh")


async def test_library_download_verified_and_atomic(make_fetcher: Fetcher, tmp_path: Path) -> None:
    fetcher, _ = make_fetcher(sequence(respond(200, PAYLOAD)))
    target = tmp_path / "libthunder.so"
    assert (
        await fetcher.download_library("https://x/libthunder.so", DIGEST.upper(), target) == target
    )
    assert target.read_bytes() == PAYLOAD
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert names(tmp_path) == ["libthunder.so"]


async def test_digest_mismatch_is_rejected_and_leaves_nothing(
    make_fetcher: Fetcher, tmp_path: Path
) -> None:
    fetcher, recorder = make_fetcher(sequence(respond(200, PAYLOAD[:-1] + b"!")))
    with pytest.raises(ArtifactDigestMismatch, match="does not match the pinned"):
        await fetcher.download_library("https://x/libthunder.so", DIGEST, tmp_path / "lib.so")
    assert names(tmp_path) == []
    assert len(recorder.requests) == 1


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (respond(404, b"nope"), "answered 404"),
        (respond(200, b"x" * 5000), "limit"),
        (respond(200, b"", headers={"Content-Length": "999999999"}), "limit"),
    ],
)
async def test_failed_downloads_leave_nothing(
    make_fetcher: Fetcher,
    tmp_path: Path,
    answer: httpx.Response,
    problem: str,
) -> None:
    fetcher, _ = make_fetcher(sequence(answer), library_max_bytes=4096)
    with pytest.raises(ArtifactError, match=problem):
        await fetcher.download_library("https://x/libthunder.so", DIGEST, tmp_path / "lib.so")
    assert names(tmp_path) == []


async def test_interrupted_download_is_retried_from_scratch(
    make_fetcher: Fetcher, tmp_path: Path
) -> None:
    attempts = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        if attempts == 1:

            async def broken() -> AsyncIterator[bytes]:
                yield PAYLOAD[:1000]
                raise httpx.ReadError("connection reset")

            return httpx.Response(200, content=broken())
        return httpx.Response(200, content=PAYLOAD)

    fetcher, _ = make_fetcher(answer)
    target = tmp_path / "lib.so"
    await fetcher.download_library("https://x/libthunder.so", DIGEST, target)
    assert target.read_bytes() == PAYLOAD
    assert names(tmp_path) == ["lib.so"]


async def test_transport_failure_after_retries(make_fetcher: Fetcher, tmp_path: Path) -> None:
    fetcher, recorder = make_fetcher(
        sequence(httpx.ConnectError("refused")), retry=RetryPolicy(max_attempts=2)
    )
    with pytest.raises(ThunderTransportError):
        await fetcher.download_library("https://x/libthunder.so", DIGEST, tmp_path / "lib.so")
    assert len(recorder.requests) == 2
    assert names(tmp_path) == []


async def test_bad_expected_digest(make_fetcher: Fetcher, tmp_path: Path) -> None:
    fetcher, recorder = make_fetcher(sequence(respond(200, PAYLOAD)))
    with pytest.raises(ValueError, match="64 hex"):
        await fetcher.download_library("https://x/l.so", "abc", tmp_path / "l.so")
    assert recorder.requests == []


# Against the in-process fake artifact host (thunder-api.md 6.4)


async def test_fake_artifact_host_round_trip(
    fake: FakeThunder, admin: AsyncFakeThunderAdmin, tmp_path: Path
) -> None:
    fetcher = ArtifactFetcher(
        component="daemon",
        transport=fake.transport(),
        registry=CollectorRegistry(),
        retry=RetryPolicy(max_attempts=1),
    )
    installer = "http://127.0.0.1/artifacts/install.sh"
    pins = await fetcher.fetch_installer(installer)
    assert pins.artifact_base_url == "http://127.0.0.1/artifacts"
    assert pins.libthunder_sha256 == LIBRARY_SHA256
    target = tmp_path / "libthunder.so"
    await fetcher.download_library(pins.library_url, pins.libthunder_sha256, target)
    assert target.read_bytes() == LIBRARY

    await admin.set_switches(corruptLibrary=True)
    with pytest.raises(ArtifactDigestMismatch):
        await fetcher.download_library(pins.library_url, pins.libthunder_sha256, tmp_path / "b")
    await admin.set_switches(corruptLibrary=False, omitDigest=True)
    with pytest.raises(ArtifactError, match="libthunder_sha256"):
        await fetcher.fetch_installer(installer)
    await admin.set_switches(omitDigest=False, installerStatus=500, libraryStatus=404)
    with pytest.raises(ArtifactError, match="answered 500"):
        await fetcher.fetch_installer(installer)
    with pytest.raises(ArtifactError, match="answered 404"):
        await fetcher.download_library(pins.library_url, pins.libthunder_sha256, tmp_path / "c")
    assert names(tmp_path) == ["libthunder.so"]

    downloads = await admin.downloads()
    assert [(d["path"], d["status"]) for d in downloads] == [
        ("/artifacts/install.sh", 200),
        ("/artifacts/libthunder.so", 200),
        ("/artifacts/libthunder.so", 200),
        ("/artifacts/install.sh", 200),
        ("/artifacts/install.sh", 500),
        ("/artifacts/libthunder.so", 404),
    ]
    assert all(d["userAgent"].endswith("(daemon)") for d in downloads)
    await fetcher.aclose()
