"""What the host sends the in-container runner: msgspec structs, validated strictly.

The body names secrets, never carries them: the runner reads each value from its own env
(set by the host when it started the runner, per exec, never in the container's config).
An unknown field, or a "name" that is not an env-var name (a value pasted where a name
belongs), is a 400 naming the field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from .._json import BoundedDecoder
from ..errors import InvalidRunIdError, InvalidThreadIdError
from ..harnesses.base import Message
from ..ids import check_run_id, check_thread_id
from ..tool_bridge.remote import ToolDescriptor

RUNNER_TOKEN_ENV = "BOXWRIGHT_RUNNER_TOKEN"
HARNESSES = ("claude-code",)
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


class RunnerWorkspace(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The workspace as the runner sees it: where it is, and the names of the env it may read."""

    path: str = "/workspace"
    source: dict[str, Any] = msgspec.field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names of env values handed to the harness (credentials, model URL)


class ContainerRunRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    run_id: str
    thread_id: str
    messages: tuple[Message, ...]
    harness: Literal["claude-code"]
    model: str
    workspace: RunnerWorkspace
    tool_descriptors: tuple[ToolDescriptor, ...]
    tool_exec_url: str
    tool_exec_token: str
    # How long a tool call no host answers is held for a successor (``runner.tool_exec``), in seconds.
    tool_exec_hold_seconds: float = 120.0


class RunnerAttachRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """``POST /runs/{id}/attach``: the successor host's tool-exec URL and run token, for the run's calls from now on."""

    tool_exec_url: str
    tool_exec_token: str


class RunnerRequestError(ValueError):
    """A bad ``/run`` body; the message names the field."""


# Bounded in depth: ``workspace.source`` and the messages hold any JSON, and 100k levels of ``[`` there
# were a RecursionError (a 500) rather than a 400.
_run_decoder = BoundedDecoder(ContainerRunRequest)
_attach_decoder = BoundedDecoder(RunnerAttachRequest)


def parse_container_run_request(body: bytes) -> ContainerRunRequest:
    try:
        request = _run_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise RunnerRequestError(f"invalid run request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RunnerRequestError(f"run request body is not JSON: {exc}") from None
    for name, value in (
        ("runId", request.run_id),
        ("threadId", request.thread_id),
        ("model", request.model),
        ("toolExecUrl", request.tool_exec_url),
        ("toolExecToken", request.tool_exec_token),
    ):
        if not value.strip():
            raise RunnerRequestError(f"invalid run request: `{name}` must not be empty")
    if not request.messages:
        raise RunnerRequestError("invalid run request: `messages` must not be empty")
    try:
        # The host's rule (S10): the ids land in the NDJSON, the run's file name and the runner's log.
        check_run_id(request.run_id)
        check_thread_id(request.thread_id)
    except (InvalidRunIdError, InvalidThreadIdError) as exc:
        raise RunnerRequestError(f"invalid run request: {exc}") from None
    if not request.tool_exec_url.startswith(("http://", "https://")):
        raise RunnerRequestError("invalid run request: `toolExecUrl` must be an http(s) URL")
    if not 0 < request.tool_exec_hold_seconds <= 3600:
        raise RunnerRequestError("invalid run request: `toolExecHoldSeconds` must be in (0, 3600]")
    for name in request.workspace.secrets:
        if not _ENV_NAME.match(name):
            # Never echo it: a value pasted where a name belongs is a secret.
            raise RunnerRequestError(
                "invalid run request: `workspace.secrets` holds names of env values only "
                "(A-Z, 0-9, _), and one entry is not such a name"
            )
    return request


def parse_runner_attach_request(body: bytes) -> RunnerAttachRequest:
    try:
        request = _attach_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise RunnerRequestError(f"invalid attach request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RunnerRequestError(f"attach request body is not JSON: {exc}") from None
    if not request.tool_exec_url.startswith(("http://", "https://")):
        raise RunnerRequestError("invalid attach request: `toolExecUrl` must be an http(s) URL")
    if not request.tool_exec_token.strip():
        raise RunnerRequestError("invalid attach request: `toolExecToken` must not be empty")
    return request
