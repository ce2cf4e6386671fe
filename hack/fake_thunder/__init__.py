"""A stateful fake of the Thunder API and artifact host for tests (``README.md`` here).

In-process: ``FakeThunder(api_tokens=[...]).transport()``; as a process:
``python -m hack.fake_thunder`` or :func:`start_fake_thunder`.
"""

from typing import TYPE_CHECKING

from hack.fake_thunder import artifact_host
from hack.fake_thunder.admin_calls import FakeAdminError
from hack.fake_thunder.admin_client import AsyncFakeThunderAdmin, FakeThunderAdmin
from hack.fake_thunder.artifact_host import ARTIFACT_PREFIX
from hack.fake_thunder.process import (
    FakeThunderProcess,
    FakeThunderStartError,
    start_fake_thunder,
)
from hack.fake_thunder.service import FakeThunder
from hack.fake_thunder.state import FAKE_ORG_ID

if TYPE_CHECKING:
    # Built on first use (library.py), not when the package is imported.
    from hack.fake_thunder.artifact_host import LIBRARY, LIBRARY_SHA256

__all__ = [
    "ARTIFACT_PREFIX",
    "FAKE_ORG_ID",
    "LIBRARY",
    "LIBRARY_SHA256",
    "AsyncFakeThunderAdmin",
    "FakeAdminError",
    "FakeThunder",
    "FakeThunderAdmin",
    "FakeThunderProcess",
    "FakeThunderStartError",
    "start_fake_thunder",
]


def __getattr__(name: str) -> object:
    if name in ("LIBRARY", "LIBRARY_SHA256"):
        return getattr(artifact_host, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
