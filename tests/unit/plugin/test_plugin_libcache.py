"""The libthunder cache: one verified download per digest, corruption never staged."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from thunder_dra.plugin.files import libcache

PAYLOAD = b"\x7fELF fake libthunder " * 1000
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
URL = "https://artifacts.example/libthunder.so"


class FakeFetch:
    """Writes ``body`` to the destination; ``gate`` holds downloads until set."""

    def __init__(self, body: bytes = PAYLOAD) -> None:
        self.body = body
        self.calls: list[tuple[str, Path, str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, url: str, dest_path: Path, expected_sha256: str) -> None:
        self.calls.append((url, dest_path, expected_sha256))
        await self.gate.wait()
        await asyncio.to_thread(dest_path.write_bytes, self.body)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def test_concurrent_claims_share_one_download(tmp_path: Path) -> None:
    fetch = FakeFetch()
    fetch.gate.clear()
    cache = libcache.LibthunderCache(tmp_path, fetch)
    waiters = [asyncio.ensure_future(cache.ensure(DIGEST, URL)) for _ in range(10)]
    await asyncio.sleep(0.05)
    fetch.gate.set()
    paths = await asyncio.gather(*waiters)
    assert len(fetch.calls) == 1
    assert fetch.calls[0][0] == URL
    assert fetch.calls[0][2] == DIGEST
    expected = tmp_path / "sha256" / DIGEST / "libthunder.so"
    assert set(paths) == {expected}
    assert expected.read_bytes() == PAYLOAD
    assert stat.S_IMODE(expected.stat().st_mode) == 0o444
    assert await cache.ensure(DIGEST, URL) == expected
    assert len(fetch.calls) == 1


async def test_a_verified_cached_file_is_found_without_a_thread_hand_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = libcache.LibthunderCache(tmp_path, FakeFetch())
    await cache.ensure(DIGEST, URL)

    async def no_thread(*args: object) -> None:
        raise AssertionError(f"handed to a thread: {args}")

    # Every prepare asks for the library: a stat on the loop, not a worker's.
    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    assert await cache.ensure(DIGEST, URL) == cache.path_for(DIGEST)


async def test_a_restarted_daemon_reuses_the_cached_file(tmp_path: Path) -> None:
    await libcache.LibthunderCache(tmp_path, FakeFetch()).ensure(DIGEST, URL)
    fetch = FakeFetch()
    cache = libcache.LibthunderCache(tmp_path, fetch)
    assert await cache.ensure(DIGEST, URL) == cache.path_for(DIGEST)
    assert fetch.calls == []


async def test_a_corrupted_download_is_rejected_and_nothing_is_staged(tmp_path: Path) -> None:
    fetch = FakeFetch(body=PAYLOAD + b"tampered")
    cache = libcache.LibthunderCache(tmp_path, fetch)
    with pytest.raises(libcache.DigestMismatchError) as info:
        await cache.ensure(DIGEST, URL)
    assert DIGEST in str(info.value)
    assert URL in str(info.value)
    assert "nothing was cached" in str(info.value)
    assert info.value.actual == hashlib.sha256(PAYLOAD + b"tampered").hexdigest()
    assert _tree(tmp_path) == []
    assert not (tmp_path / "sha256" / DIGEST).exists()
    fetch.body = PAYLOAD  # the next claim tries again
    assert (await cache.ensure(DIGEST, URL)).read_bytes() == PAYLOAD


async def test_a_failed_download_leaves_nothing(tmp_path: Path) -> None:
    async def failing(url: str, dest_path: Path, expected_sha256: str) -> None:
        await asyncio.to_thread(dest_path.write_bytes, b"partial")
        raise ConnectionError("artifact host unreachable")

    cache = libcache.LibthunderCache(tmp_path, failing)
    with pytest.raises(ConnectionError):
        await cache.ensure(DIGEST, URL)
    assert _tree(tmp_path) == []


async def test_startup_verification_removes_a_corrupted_file_which_is_fetched_again(
    tmp_path: Path,
) -> None:
    path = await libcache.LibthunderCache(tmp_path, FakeFetch()).ensure(DIGEST, URL)
    other = b"another version"
    other_digest = hashlib.sha256(other).hexdigest()
    await libcache.LibthunderCache(tmp_path, FakeFetch(other)).ensure(other_digest, URL)
    path.chmod(0o644)
    path.write_bytes(b"bit rot")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "tmp" / "leftover.part").write_bytes(b"x")

    fetch = FakeFetch()
    cache = libcache.LibthunderCache(tmp_path, fetch)
    assert await cache.verify_all() == [DIGEST]
    assert not path.exists()
    assert not (tmp_path / "tmp").exists()
    assert await cache.cached_digests() == [other_digest]
    assert (await cache.ensure(DIGEST, URL)).read_bytes() == PAYLOAD
    assert len(fetch.calls) == 1


async def test_a_cancelled_caller_does_not_cancel_the_shared_download(tmp_path: Path) -> None:
    fetch = FakeFetch()
    fetch.gate.clear()
    cache = libcache.LibthunderCache(tmp_path, fetch)
    impatient = asyncio.ensure_future(cache.ensure(DIGEST, URL))
    patient = asyncio.ensure_future(cache.ensure(DIGEST, URL))
    await asyncio.sleep(0.01)
    impatient.cancel()
    fetch.gate.set()
    assert (await patient).read_bytes() == PAYLOAD
    assert impatient.cancelled()


async def test_invalid_digests_are_refused(tmp_path: Path) -> None:
    cache = libcache.LibthunderCache(tmp_path, FakeFetch())
    for bad in ("../../etc", DIGEST.upper(), DIGEST[:-1]):
        with pytest.raises(libcache.LibraryCacheError, match="invalid SHA-256"):
            await cache.ensure(bad, URL)


async def test_prune_keeps_what_claims_use(tmp_path: Path) -> None:
    cache = libcache.LibthunderCache(tmp_path, FakeFetch())
    await cache.ensure(DIGEST, URL)
    old = b"old"
    old_digest = hashlib.sha256(old).hexdigest()
    await libcache.LibthunderCache(tmp_path, FakeFetch(old)).ensure(old_digest, URL)
    assert await cache.prune(keep=[DIGEST]) == [old_digest]
    assert await cache.cached_digests() == [DIGEST]


@pytest.fixture
def artifact_server() -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/libthunder.so", requests
    finally:
        server.shutdown()
        server.server_close()


async def test_download_from_a_real_http_server(
    tmp_path: Path, artifact_server: tuple[str, list[str]]
) -> None:
    url, requests = artifact_server

    async with httpx.AsyncClient() as client:

        async def http_fetch(url: str, dest_path: Path, expected_sha256: str) -> None:
            async with client.stream("GET", url) as response:
                response.raise_for_status()
                chunks = [chunk async for chunk in response.aiter_bytes()]
            await asyncio.to_thread(dest_path.write_bytes, b"".join(chunks))

        cache = libcache.LibthunderCache(tmp_path, http_fetch)
        results = await asyncio.gather(*(cache.ensure(DIGEST, url) for _ in range(5)))
    assert requests == ["/libthunder.so"]
    assert results[0].read_bytes() == PAYLOAD


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_pinned_digest_is_cached_for_its_ttl() -> None:
    calls = 0
    value = DIGEST

    async def resolve() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return value

    clock = Clock()
    pinned = libcache.PinnedDigest(resolve, ttl=60, clock=clock)
    assert await asyncio.gather(*(pinned.get() for _ in range(5))) == [DIGEST] * 5
    assert calls == 1
    clock.now += 59
    assert await pinned.get() == DIGEST
    assert calls == 1
    value = "b" * 64
    clock.now += 2
    assert await pinned.get() == "b" * 64
    assert calls == 2
    pinned.invalidate()
    assert await pinned.get() == "b" * 64
    assert calls == 3


async def test_pinned_digest_serves_the_last_value_when_the_host_fails() -> None:
    fail = False
    calls = 0

    async def resolve() -> str:
        nonlocal calls
        calls += 1
        if fail:
            raise httpx.ConnectError("artifact host down")
        return DIGEST

    clock = Clock()
    pinned = libcache.PinnedDigest(resolve, ttl=60, retry_after=10, clock=clock)
    assert await pinned.get() == DIGEST
    fail = True
    clock.now += 61
    assert await pinned.get() == DIGEST
    assert calls == 2
    clock.now += 5  # within retry_after: no new attempt
    assert await pinned.get() == DIGEST
    assert calls == 2
    clock.now += 6
    assert await pinned.get() == DIGEST
    assert calls == 3


async def test_pinned_digest_errors_without_a_previous_value() -> None:
    async def down() -> str:
        raise httpx.ConnectError("artifact host down")

    with pytest.raises(httpx.ConnectError):
        await libcache.PinnedDigest(down).get()

    async def malformed() -> str:
        return "not-a-digest"

    with pytest.raises(libcache.LibraryCacheError):
        await libcache.PinnedDigest(malformed).get()


def test_sha256_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(PAYLOAD)
    assert libcache.sha256_file(path) == DIGEST
    assert os.path.getsize(path) == len(PAYLOAD)
