"""Artifact integrity without a network: https across redirects, pinned installer and
library digests, and that a refusal stages nothing in the node's library cache."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.workload.daemonset import daemon_command
from thunder_dra.plugin.config import parse_config
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.libcache import LibthunderCache
from thunder_dra.plugin.files.library import LibraryPinMismatch, LibraryProvider
from thunder_dra.thunder import (
    ArtifactDigestMismatch,
    ArtifactError,
    ArtifactFetcher,
    ArtifactURLRefused,
    RetryPolicy,
    check_artifact_url,
    parse_installer,
)

LIBRARY = b"\x7fELF library bytes" * 100
LIBRARY_SHA256 = hashlib.sha256(LIBRARY).hexdigest()
INSTALLER = (
    f"#!/bin/sh\ndefault_artifact_base_url='https://cdn.example.test/t'\n"
    f'libthunder_sha256="{LIBRARY_SHA256}"\n'
).encode()
INSTALLER_SHA256 = hashlib.sha256(INSTALLER).hexdigest()
OTHER = "f" * 64

Routes = dict[str, httpx.Response]
MakeFetcher = Callable[[Routes], tuple[ArtifactFetcher, list[str]]]


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.fixture
async def fetcher_for() -> AsyncIterator[MakeFetcher]:
    made: list[ArtifactFetcher] = []

    def make(routes: Routes) -> tuple[ArtifactFetcher, list[str]]:
        requested: list[str] = []

        def answer(request: httpx.Request) -> httpx.Response:
            requested.append(str(request.url))
            return routes.get(str(request.url), httpx.Response(404))

        fetcher = ArtifactFetcher(
            component="daemon",
            transport=httpx.MockTransport(answer),
            registry=CollectorRegistry(),
            retry=RetryPolicy(max_attempts=1),
        )
        made.append(fetcher)
        return fetcher, requested

    yield make
    for fetcher in made:
        await fetcher.aclose()


def _redirect(location: str) -> httpx.Response:
    return httpx.Response(302, headers={"Location": location})


@pytest.mark.parametrize(
    ("url", "after_https", "allowed"),
    [
        ("https://get.example.test/install.sh", False, True),
        ("http://127.0.0.1:8080/install.sh", False, True),
        ("http://localhost/install.sh", False, True),
        ("http://[::1]/install.sh", False, True),
        ("http://get.example.test/install.sh", False, False),
        ("http://127.0.0.1/install.sh", True, False),
        ("ftp://get.example.test/install.sh", False, False),
        ("https:///install.sh", False, False),
    ],
)
def test_artifact_url_policy(url: str, after_https: bool, allowed: bool) -> None:
    if allowed:
        assert check_artifact_url(url, kind="installer", after_https=after_https) == url
    else:
        with pytest.raises(ArtifactURLRefused, match="refused"):
            check_artifact_url(url, kind="installer", after_https=after_https)


async def test_https_redirects_are_followed(fetcher_for: MakeFetcher) -> None:
    fetcher, requested = fetcher_for(
        {
            "https://get.example.test/install.sh": _redirect("https://cdn.example.test/i.sh"),
            "https://cdn.example.test/i.sh": httpx.Response(200, content=INSTALLER),
        }
    )
    pins = await fetcher.fetch_installer("https://get.example.test/install.sh", INSTALLER_SHA256)
    assert pins.script == INSTALLER.decode()
    assert pins.installer_sha256 == INSTALLER_SHA256
    assert requested == ["https://get.example.test/install.sh", "https://cdn.example.test/i.sh"]


@pytest.mark.parametrize(
    "location", ["http://cdn.example.test/i.sh", "http://127.0.0.1/i.sh", "/../x", "ftp://x/y"]
)
async def test_a_redirect_away_from_https_is_refused_before_it_is_followed(
    fetcher_for: MakeFetcher,
    location: str,
    tmp_path: Path,
) -> None:
    start = "https://get.example.test/install.sh"
    target = str(httpx.URL(start).join(location))
    routes = {start: _redirect(location)}
    if target.startswith("https://"):
        routes[target] = _redirect("http://127.0.0.1/again")
    fetcher, requested = fetcher_for(routes)
    with pytest.raises(ArtifactURLRefused) as refused:
        await fetcher.fetch_installer(start)
    assert start in str(refused.value)
    assert all(url.startswith("https://") for url in requested)
    with pytest.raises(ArtifactURLRefused):
        await fetcher.download_library(start, LIBRARY_SHA256, tmp_path / "l.so")
    assert _files(tmp_path) == []


async def test_loopback_http_may_redirect_within_loopback_http(
    fetcher_for: MakeFetcher,
) -> None:
    fetcher, _ = fetcher_for(
        {
            "http://127.0.0.1:9/install.sh": _redirect("/artifacts/install.sh"),
            "http://127.0.0.1:9/artifacts/install.sh": httpx.Response(
                200, content=INSTALLER.replace(b"https://cdn.example.test/t", b"http://[::1]/t")
            ),
        }
    )
    pins = await fetcher.fetch_installer("http://127.0.0.1:9/install.sh")
    assert pins.library_url == "http://[::1]/t/libthunder.so"


async def test_too_many_redirects(fetcher_for: MakeFetcher) -> None:
    routes = {f"https://a.test/{i}": _redirect(f"https://a.test/{i + 1}") for i in range(10)}
    fetcher, requested = fetcher_for(routes)
    with pytest.raises(ArtifactError, match="redirected more than 5 times"):
        await fetcher.fetch_installer("https://a.test/0")
    assert len(requested) == 6


def test_an_https_installer_may_not_declare_an_http_base() -> None:
    text = f"default_artifact_base_url='http://127.0.0.1/t'\nlibthunder_sha256=\"{OTHER}\"\n"
    with pytest.raises(ArtifactURLRefused, match="plain http"):
        parse_installer(text, "https://get.example.test/install.sh")
    plain = "default_artifact_base_url='http://cdn.example.test'\n" + text.split("\n", 1)[1]
    with pytest.raises(ArtifactURLRefused, match="https only"):
        parse_installer(plain, "http://127.0.0.1/install.sh")
    assert parse_installer(text, "http://127.0.0.1/install.sh").artifact_base_url == (
        "http://127.0.0.1/t"
    )


async def test_an_installer_with_another_digest_is_refused_naming_both(
    fetcher_for: MakeFetcher,
) -> None:
    url = "https://get.example.test/install.sh"
    fetcher, _ = fetcher_for({url: httpx.Response(200, content=INSTALLER)})
    with pytest.raises(ArtifactDigestMismatch) as mismatch:
        await fetcher.fetch_installer(url, OTHER)
    message = str(mismatch.value)
    assert url in message
    assert INSTALLER_SHA256 in message
    assert OTHER in message
    with pytest.raises(ValueError, match="64 hex"):
        await fetcher.fetch_installer(url, "abc")


def _provider(
    fetcher: ArtifactFetcher, root: Path, **pins: str
) -> tuple[LibraryProvider, LibthunderCache]:
    cache = LibthunderCache(root, lambda url, dest, sha: fetcher.download_library(url, sha, dest))
    url = "https://get.example.test/install.sh"
    return LibraryProvider(fetcher, cache, url, **pins), cache


@pytest.mark.parametrize(
    ("pins", "text"),
    [
        ({"library_sha256": OTHER}, f"pins libthunder.so SHA-256 {LIBRARY_SHA256}"),
        ({"installer_sha256": OTHER}, f"SHA-256 {INSTALLER_SHA256} does not match"),
    ],
)
async def test_pins_that_do_not_match_refuse_the_library_and_stage_nothing(
    fetcher_for: MakeFetcher,
    tmp_path: Path,
    pins: dict[str, str],
    text: str,
) -> None:
    fetcher, requested = fetcher_for(
        {
            "https://get.example.test/install.sh": httpx.Response(200, content=INSTALLER),
            "https://cdn.example.test/t/libthunder.so": httpx.Response(200, content=LIBRARY),
        }
    )
    provider, _ = _provider(fetcher, tmp_path / "cache", **pins)
    with pytest.raises(ClaimError) as refused:
        await provider.current()
    assert text in str(refused.value)
    assert OTHER in str(refused.value)
    assert "https://get.example.test/install.sh" in str(refused.value)
    assert "https://cdn.example.test/t/libthunder.so" not in requested
    assert _files(tmp_path / "cache") == []
    with pytest.raises((ArtifactError, LibraryPinMismatch)):
        await provider.fetch_installer()


async def test_matching_pins_stage_the_library(
    fetcher_for: MakeFetcher,
    tmp_path: Path,
) -> None:
    fetcher, _ = fetcher_for(
        {
            "https://get.example.test/install.sh": httpx.Response(200, content=INSTALLER),
            "https://cdn.example.test/t/libthunder.so": httpx.Response(200, content=LIBRARY),
        }
    )
    provider, _ = _provider(
        fetcher,
        tmp_path / "cache",
        installer_sha256=INSTALLER_SHA256,
        library_sha256=LIBRARY_SHA256,
    )
    path = await provider.current()
    assert path.read_bytes() == LIBRARY
    assert (await provider.fetch_installer()).script == INSTALLER.decode()


def test_the_operator_passes_the_thundercluster_pins_to_the_daemon() -> None:
    spec = ThunderClusterSpec.model_validate(
        {"thunder": {"installerSHA256": INSTALLER_SHA256, "librarySHA256": LIBRARY_SHA256}}
    )
    command = daemon_command(spec)
    assert command[:3] == ["python", "-m", "thunder_dra.plugin"]
    env = {"NODE_NAME": "n", "POD_UID": "u", "THUNDER_API_TOKEN": "t"}
    config = parse_config(command[3:], env)
    assert (config.installer_sha256, config.library_sha256) == (INSTALLER_SHA256, LIBRARY_SHA256)
    unpinned = parse_config(daemon_command(ThunderClusterSpec.model_validate({}))[3:], env)
    assert (unpinned.installer_sha256, unpinned.library_sha256) == (None, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--library-sha256", "ABC"], "--library-sha256"),
        (["--installer-sha256", "0" * 63], "--installer-sha256"),
        (["--artifact-base-url", "http://get.example.test"], "must use https"),
    ],
)
def test_bad_pins_and_plain_http_artifact_bases_are_flag_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"NODE_NAME": "n", "POD_UID": "u", "THUNDER_API_TOKEN": "t"}
    with pytest.raises(SystemExit) as exited:
        parse_config(flags, env)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
