"""``boxwright serve`` hands uvicorn its hardened WebSocket protocol only where it fits uvicorn's internals."""

from __future__ import annotations

import logging

import pytest
import uvicorn

from boxwright.coordinator import serve
from boxwright.coordinator.ws_protocol import CoordinatorWebSocketProtocol


def test_the_installed_uvicorn_gets_the_hardened_protocol() -> None:
    assert serve._ws_protocol() is CoordinatorWebSocketProtocol


@pytest.mark.parametrize("version", ["0.30.6", "0.53.0"])
def test_an_older_uvicorn_gets_its_own_with_a_warning(
    version: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", version)
    with caplog.at_level(logging.WARNING, logger="boxwright.serve"):
        assert serve._ws_protocol() == "auto"
    assert f"uvicorn {version}" in caplog.text and ">= 0.54" in caplog.text
