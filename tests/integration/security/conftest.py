"""Fixtures of the security tests: the daemon tests' CRDs, fake Thunder and zone pool."""

from tests.integration.daemon.conftest import crds, fake, pool

__all__ = ["crds", "fake", "pool"]
