"""The fake artifact host (contract 6.4), served by the fake service under ``/artifacts/``.

``/artifacts/install.sh`` is a short, inert POSIX sh script with the two pinned lines of
contract 3.1 (base = this service's ``/artifacts``, digest = the payload's). It hands over to
``thunder-fake-installer`` when that command is on PATH (``hack/fake_host/bin``) and does
nothing otherwise. ``/artifacts/libthunder.so`` is a small deterministic payload.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from hack.fake_thunder.messages import FakeRequest, FakeResponse, HttpError
from hack.fake_thunder.routing import Route, route

if TYPE_CHECKING:
    from hack.fake_thunder.service import FakeThunder

ARTIFACT_PREFIX = "/artifacts"
PAYLOAD_SIZE = 16 * 1024


def library_payload() -> bytes:
    """16 KiB of deterministic bytes standing in for the ~32 MB library."""
    chunks = [b"\x7fELF fake libthunder.so for tests\n"]
    seed = b"fake-libthunder"
    while sum(map(len, chunks)) < PAYLOAD_SIZE:
        seed = hashlib.sha256(seed).digest()
        chunks.append(seed)
    return b"".join(chunks)[:PAYLOAD_SIZE]


LIBRARY = library_payload()
LIBRARY_SHA256 = hashlib.sha256(LIBRARY).hexdigest()


def corrupted(payload: bytes) -> bytes:
    """Same length, different bytes: only the digest check can catch it."""
    middle = len(payload) // 2
    return payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]


def installer_script(artifact_base_url: str, *, with_digest: bool) -> str:
    digest_line = f'libthunder_sha256="{LIBRARY_SHA256}"\n' if with_digest else ""
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
        payload = corrupted(LIBRARY) if switches.corrupt_library else LIBRARY
        return FakeResponse(200, payload, {"Content-Type": "application/octet-stream"})
