"""The in-container runner: co-locates the harness with the tool bridge; only tool execution crosses back.

``python -m boxwright.runner`` (or ``boxwright runner``) serves ``GET /health``, ``POST /run``,
``GET /runs/{id}`` and ``/runs/{id}/events``, ``POST /runs/{id}/cancel``, ``POST /runs/{id}/attach``
(a successor host takes the run's tool calls over) and ``POST /shutdown`` (``server``); the request
is ``protocol.ContainerRunRequest``. Tool calls no host answers are held (``tool_exec``).
"""

from __future__ import annotations

from .protocol import RUNNER_TOKEN_ENV, ContainerRunRequest, RunnerWorkspace, parse_container_run_request

__all__ = ["RUNNER_TOKEN_ENV", "ContainerRunRequest", "RunnerWorkspace", "parse_container_run_request"]
