"""Shared pytest setup: everything under tests/integration carries the `integration` marker."""

from __future__ import annotations

import pathlib

import pytest

_INTEGRATION = pathlib.Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
