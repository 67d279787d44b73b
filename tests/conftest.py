"""Shared pytest setup: everything under tests/integration and tests/security carries the `integration` marker."""

from __future__ import annotations

import pathlib

import pytest

_HERE = pathlib.Path(__file__).parent
# tests/security drives real sandboxes (real bwrap, real processes): integration tests too.
_INTEGRATION = (_HERE / "integration", _HERE / "security")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(directory in item.path.parents for directory in _INTEGRATION):
            item.add_marker(pytest.mark.integration)
