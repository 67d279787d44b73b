"""Gemini CLI as a harness: ``gemini --acp``, driven by the ACP client (``harnesses.acp``).

Why ACP and not ``-p -o stream-json`` (both measured against the fake model's Gemini API, Gemini
CLI 0.61.0): the two take the same time (a shell-tool turn: stream-json 7.7 s wall for the bare
CLI, ACP 7.5-8.2 s through ``run_agent``, most of it the CLI's own start), but only ACP has a
permission hook (``session/request_permission``, answered by the sandbox policy), a protocol cancel
and ``session/load`` for resume; stream-json offers ``--approval-mode`` alone.

Measured: with ``GEMINI_API_KEY`` set, the CLI needs an auth method chosen before a session:
in ACP that is ``authenticate{methodId:"gemini-api-key"}`` (no settings file needed).
``GOOGLE_GEMINI_BASE_URL`` points the @google/genai SDK at another endpoint (the tests' fake).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..auth import AuthMode, resolve_auth_mode
from .acp import AcpHarness, acp

NAME = "gemini"
INSTALL_COMMAND = "npm install @google/gemini-cli"
API_KEY_METHOD = "gemini-api-key"
# Copied from the host in api-key mode: the key, and where to send it (a proxy or a fake).
HOST_ENV = ("GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL")
APPROVAL_MODES = ("default", "auto_edit", "yolo", "plan")


def gemini_cli(
    model: str | None = None,
    *,
    executable: str = "gemini",
    approval_mode: str | None = None,
    auth_mode: AuthMode | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> AcpHarness:
    """The Gemini CLI harness over ACP.

    ``approval_mode`` None leaves the CLI's default (it asks, and the policy answers); ``yolo``
    makes it ask nothing. ``auth_mode`` ``api-key`` (default) copies ``GEMINI_API_KEY`` (and
    ``GOOGLE_GEMINI_BASE_URL``) from run_agent's ``host_env`` and authenticates with it; ``host`` uses the
    login the CLI already has in its HOME.
    """
    if not executable.split():
        raise ValueError("executable must name the gemini command")
    if approval_mode is not None and approval_mode not in APPROVAL_MODES:
        raise ValueError(f"approval_mode must be one of {', '.join(APPROVAL_MODES)}, got {approval_mode!r}")
    if isinstance(extra_args, str):
        raise ValueError("extra_args must be a list of strings, not one string")
    mode = resolve_auth_mode(auth_mode, None)
    argv = [*executable.split(), "--acp"]
    if model:
        argv += ["-m", model]
    if approval_mode:
        argv += ["--approval-mode", approval_mode]
    argv += list(extra_args)
    # Measured: in an untrusted folder the CLI drops the MCP servers session/new gives it (the bridge
    # never appears) and overrides the approval mode. The workspace is the sandbox's: trust it.
    merged = {"GEMINI_CLI_TRUST_WORKSPACE": "true", **(env or {})}
    harness = acp(argv, name=NAME, env=merged, auth_method=API_KEY_METHOD if mode == "api-key" else None)
    return replace(harness, install_hint=INSTALL_COMMAND, host_env_names=HOST_ENV if mode == "api-key" else ())
