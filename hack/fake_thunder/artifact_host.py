"""The fake artifact host (thunder-api.md 6.4), served by the fake service under ``/artifacts/``.

``/artifacts/install.sh`` is a short, inert POSIX sh script with the two pinned lines of
thunder-api.md 3.1 (base = this service's ``/artifacts``, digest = the payload's). It hands over to
``thunder-fake-installer`` when that command is on PATH (``hack/fake_host/bin``) and does
nothing otherwise. ``/artifacts/libthunder.so`` is the fake library ``library.py`` builds
from ``libthunder.c`` for this machine, a real shared object whose constructor reports on
the workload's stderr that it was preloaded and read ``config.json``; the host builds it
(or finds it in the cache) when it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hack.fake_thunder.library import library, library_sha256
from hack.fake_thunder.messages import FakeRequest, FakeResponse, HttpError
from hack.fake_thunder.routing import Route, route

if TYPE_CHECKING:
    from hack.fake_thunder.service import FakeThunder

ARTIFACT_PREFIX = "/artifacts"
if TYPE_CHECKING:
    # The served library and its digest, as module attributes built on first use.
    LIBRARY: bytes
    LIBRARY_SHA256: str


def __getattr__(name: str) -> object:
    if name == "LIBRARY":
        return library()
    if name == "LIBRARY_SHA256":
        return library_sha256()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def corrupted(payload: bytes) -> bytes:
    """Same length, different bytes: only the digest check can catch it."""
    middle = len(payload) // 2
    return payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]


def installer_script(artifact_base_url: str, *, with_digest: bool) -> str:
    digest_line = f'libthunder_sha256="{library_sha256()}"\n' if with_digest else ""
    return (
        "#!/bin/sh\n"
        "# Fake Thunder installer served by hack/fake_thunder for tests. Inert unless\n"
        "# thunder-fake-installer (hack/fake_host/bin) is on PATH, which then plays the\n"
        "# install from the THUNDER_* / THUNDERD_* variables it inherits.\n"
        "set -eu\n"
        f"default_artifact_base_url='{artifact_base_url}'\n"
        f"{digest_line}"
        "if command -v thunder-fake-installer >/dev/null 2>&1; then\n"
        '  THUNDER_FAKE_ARTIFACT_BASE_URL="$default_artifact_base_url" \\\n'
        "    exec thunder-fake-installer\n"
        "fi\n"
        "exit 0\n"
    )


class ArtifactHost:
    def __init__(self, service: FakeThunder) -> None:
        self._service = service
        self._library = library()

    def routes(self) -> list[Route]:
        return [
            route("GET", f"{ARTIFACT_PREFIX}/install.sh", self.installer),
            route("GET", f"{ARTIFACT_PREFIX}/libthunder.so", self.library),
        ]

    def installer(self, request: FakeRequest, params: dict[str, Any]) -> FakeResponse:
        switches = self._service.switches
        if switches.installer_status != 200:
            raise HttpError(switches.installer_status, "artifact unavailable")
        script = installer_script(
            request.base_url + ARTIFACT_PREFIX, with_digest=not switches.omit_digest
        )
        return FakeResponse(200, script.encode(), {"Content-Type": "text/x-shellscript"})

    def library(self, request: FakeRequest, params: dict[str, Any]) -> FakeResponse:
        switches = self._service.switches
        if switches.library_status != 200:
            raise HttpError(switches.library_status, "artifact unavailable")
        payload = corrupted(self._library) if switches.corrupt_library else self._library
        return FakeResponse(200, payload, {"Content-Type": "application/octet-stream"})
