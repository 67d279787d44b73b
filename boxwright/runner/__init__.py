"""The in-container runner: co-locates the harness with the tool bridge; only tool execution crosses back.

``python -m boxwright.runner`` (or ``boxwright runner``) serves ``GET /health``, ``POST /run`` and
``POST /runs/{id}/cancel`` (``server``); the request is ``protocol.ContainerRunRequest``.
"""

from __future__ import annotations

from .protocol import RUNNER_TOKEN_ENV, ContainerRunRequest, RunnerWorkspace, parse_container_run_request

__all__ = ["RUNNER_TOKEN_ENV", "ContainerRunRequest", "RunnerWorkspace", "parse_container_run_request"]
