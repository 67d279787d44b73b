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
from .errors import (
    BoxwrightError,
    DurableRunIdRequiredError,
    DurableThreadIdRequiredError,
    HalfDurableRunError,
    RunClaimLostError,
    RunClaimNotAcquiredError,
    RunDriverPipeOutsideClaimError,
    SandboxReclaimFailedError,
    UnsupportedCapabilityError,
)
from .events import Event, chunk_fingerprint, create_run_scoped_id_gen, decode_event, encode_event
from .harnesses.base import Message
from .harnesses.claude_code import claude_code
from .harnesses.command import command_harness
from .journal import (
    RunExitProbe,
    journal_follow_command,
    journal_read_command,
    probe_run_exit,
    prune_journals,
    read_journal,
    read_journal_ndjson,
)
from .policy import define_sandbox_policy
from .providers import bubblewrap_sandbox, local_process_sandbox
from .reaper import ReapResult, reap_detached_runs, sandbox_reclaimer
from .runs import (
    RUN_CANCEL_REASON,
    RunController,
    RunRecord,
    pipe_to_run_log,
    request_run_cancel,
)
from .sandbox import Capabilities, SandboxHandle, SandboxProvider
from .secrets import bearer, create_secrets
from .takeover import (
    JournalReplayDivergedError,
    JournalReplayThreadIdMismatchError,
    align_to_stored_log,
    sandbox_run_driver,
)
from .tool_bridge import create_tool_bridge_core, define_tool, start_host_tool_bridge, tool
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
    "DurableRunIdRequiredError",
    "DurableThreadIdRequiredError",
    "EnsureContext",
    "Event",
    "HalfDurableRunError",
    "JournalOptions",
    "JournalReplayDivergedError",
    "JournalReplayThreadIdMismatchError",
    "Lifecycle",
    "Message",
    "ReapResult",
    "RunClaimLostError",
    "RunClaimNotAcquiredError",
    "RunController",
    "RunDriverPipeOutsideClaimError",
    "RunExitProbe",
    "RunRecord",
    "SandboxDefinition",
    "SandboxHandle",
    "SandboxHooks",
    "SandboxProvider",
    "SandboxReclaimFailedError",
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
    "create_tool_bridge_core",
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
    "journal_follow_command",
    "journal_read_command",
    "local_process_sandbox",
    "local_source",
    "mcp_skill",
    "none_source",
    "pipe_to_run_log",
    "probe_run_exit",
    "provide_sandbox_stores",
    "prune_journals",
    "read_journal",
    "read_journal_ndjson",
    "reap_detached_runs",
    "request_run_cancel",
    "run_agent",
    "sandbox_reclaimer",
    "sandbox_run_driver",
    "start_host_tool_bridge",
    "tool",
    "watch_workspace",
    "with_sandbox",
]
