"""A stateful fake of the Thunder API and artifact host for tests (``README.md`` here).

In-process: ``FakeThunder(api_tokens=[...]).transport()``; as a process:
``python -m hack.fake_thunder`` or :func:`start_fake_thunder`.
"""

from hack.fake_thunder.admin_calls import FakeAdminError
from hack.fake_thunder.admin_client import AsyncFakeThunderAdmin, FakeThunderAdmin
from hack.fake_thunder.artifact_host import ARTIFACT_PREFIX, LIBRARY, LIBRARY_SHA256
from hack.fake_thunder.process import (
    FakeThunderProcess,
    FakeThunderStartError,
    start_fake_thunder,
)
from hack.fake_thunder.service import FakeThunder
from hack.fake_thunder.state import FAKE_ORG_ID

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
