"""boxwright: run coding-agent CLIs in sandboxes from any Python ASGI app, as durable AG-UI event streams.

The public API, re-exported; each name lives in the module of its one idea.
"""

from .abort import AbortController, AbortSignal
from .agent import JournalOptions, run_agent
from .definition import (
    EnsureContext,
    Lifecycle,
    SandboxDefinition,
    SandboxHooks,
    Tenant,
    define_sandbox,
    provide_sandbox_stores,
    with_sandbox,
)
from .errors import BoxwrightError, UnsupportedCapabilityError
from .events import Event, chunk_fingerprint, create_run_scoped_id_gen, decode_event, encode_event
from .harnesses.base import Message
from .harnesses.claude_code import claude_code
from .harnesses.command import command_harness
from .policy import define_sandbox_policy
from .providers import bubblewrap_sandbox, local_process_sandbox
from .runs import (
    RUN_CANCEL_REASON,
    RunController,
    RunRecord,
    pipe_to_run_log,
    request_run_cancel,
)
from .sandbox import Capabilities, SandboxHandle, SandboxProvider
from .secrets import bearer, create_secrets
from .takeover import align_to_stored_log
from .tool_bridge import define_tool, start_host_tool_bridge, tool
from .watcher import watch_workspace
from .workspace import (
    agent_skill,
    define_workspace,
    file_skill,
    git_skill,
    git_source,
    github_repo,
    local_source,
    mcp_skill,
    none_source,
)

__all__ = [
    "RUN_CANCEL_REASON",
    "AbortController",
    "AbortSignal",
    "BoxwrightError",
    "Capabilities",
    "EnsureContext",
    "Event",
    "JournalOptions",
    "Lifecycle",
    "Message",
    "RunController",
    "RunRecord",
    "SandboxDefinition",
    "SandboxHandle",
    "SandboxHooks",
    "SandboxProvider",
    "Tenant",
    "UnsupportedCapabilityError",
    "agent_skill",
    "align_to_stored_log",
    "bearer",
    "bubblewrap_sandbox",
    "chunk_fingerprint",
    "claude_code",
    "command_harness",
    "create_run_scoped_id_gen",
    "create_secrets",
    "decode_event",
    "define_sandbox",
    "define_sandbox_policy",
    "define_tool",
    "define_workspace",
    "encode_event",
    "file_skill",
    "git_skill",
    "git_source",
    "github_repo",
    "local_process_sandbox",
    "local_source",
    "mcp_skill",
    "none_source",
    "pipe_to_run_log",
    "provide_sandbox_stores",
    "request_run_cancel",
    "run_agent",
    "start_host_tool_bridge",
    "tool",
    "watch_workspace",
    "with_sandbox",
]
