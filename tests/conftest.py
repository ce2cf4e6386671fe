"""Shared pytest set-up: markers by folder, and the fixtures of the local test platform."""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its top-level folder, so `-m unit` and friends select them."""
    for item in items:
        try:
            kind = Path(str(item.fspath)).relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))
