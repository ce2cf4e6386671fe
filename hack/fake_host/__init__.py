"""Fake host tools (``nvidia-smi``, ``thunder``, ``sudo``, the installer backend) for the
node daemon's tests; standard library only. See ``README.md`` for the state directory."""

from hack.fake_host.state import BIN_DIR, STATE_ENV, FakeHost

__all__ = ["BIN_DIR", "STATE_ENV", "FakeHost"]
