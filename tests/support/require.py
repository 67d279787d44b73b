"""Skip a test whose real component is missing, except under CI, where that is a failure."""

from __future__ import annotations

import shutil
from typing import NoReturn

import pytest

from boxwright.testkit.providers import REQUIRE_INTEGRATION_ENV, integration_required

AGENT_BIN = "/opt/boxwright-agents/node_modules/.bin"


def missing(reason: str) -> NoReturn:
    if integration_required():
        pytest.fail(f"required component missing ({REQUIRE_INTEGRATION_ENV}=1): {reason}")
    pytest.skip(reason)


def agent_cli(name: str) -> str:
    """Path of an agent CLI: on PATH, or where .ci/run installs them."""
    found = shutil.which(name) or shutil.which(name, path=AGENT_BIN)
    if found is None:
        missing(f"`{name}` is not installed (npm install; .ci/run puts it in {AGENT_BIN})")
    return found
