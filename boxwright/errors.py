"""Every public exception of boxwright, in one place.

Each error carries the values it names as attributes, so callers can branch on
them without parsing messages, and its message says what was wrong.
"""

from __future__ import annotations


class BoxwrightError(Exception):
    """Base class of every error boxwright raises on purpose."""


class EventDecodeError(BoxwrightError, ValueError):
    """An event (or an NDJSON line of events) could not be decoded."""


class UnsupportedCapabilityError(BoxwrightError):
    """A provider was asked for something its capabilities do not include."""

    def __init__(self, provider: str, capability: str, hint: str | None = None) -> None:
        self.provider = provider
        self.capability = capability
        self.hint = hint
        message = f"sandbox provider {provider!r} does not support {capability!r}"
        if hint:
            message += f": {hint}"
        super().__init__(message)


class MissingSandboxError(BoxwrightError):
    """A harness that needs a sandbox was run without one."""

    def __init__(self, adapter_name: str) -> None:
        self.adapter_name = adapter_name
        super().__init__(
            f"harness {adapter_name!r} runs inside a sandbox, but none was given; pass sandbox=define_sandbox(...)"
        )


class SandboxCommandError(BoxwrightError):
    """A command that backs an fs or git operation exited non-zero."""

    def __init__(self, op: str, exit_code: int, stderr: str) -> None:
        self.op = op
        self.exit_code = exit_code
        self.stderr = stderr
        tail = stderr.strip()[-500:]
        super().__init__(f"{op} failed with exit code {exit_code}" + (f": {tail}" if tail else ""))


class SandboxPathError(BoxwrightError, ValueError):
    """A path resolves outside the sandbox's workspace root."""

    def __init__(self, path: str, root: str, reason: str = "escapes the workspace root") -> None:
        self.path = path
        self.root = root
        super().__init__(f"path {path!r} {reason} {root!r}")


class ProviderUnavailableError(BoxwrightError):
    """The provider cannot run on this machine (no binary, daemon, login or credential)."""

    def __init__(self, provider: str, reason: str, help: str | None = None) -> None:
        self.provider = provider
        self.reason = reason
        self.help = help
        super().__init__(f"sandbox provider {provider!r} is unavailable: {reason}" + (f" ({help})" if help else ""))


class SandboxNotFoundError(BoxwrightError):
    """A sandbox id or workspace root does not exist."""

    def __init__(self, provider: str, sandbox_id: str, reason: str = "does not exist") -> None:
        self.provider = provider
        self.sandbox_id = sandbox_id
        super().__init__(f"{provider} sandbox {sandbox_id!r} {reason}")


class ProcessExitedError(BoxwrightError):
    """Input was written to a process whose stdin is already closed (it exited or end() was called)."""

    def __init__(self, pid: int, reason: str) -> None:
        self.pid = pid
        super().__init__(f"cannot write to stdin of process {pid}: {reason}")


class AbortError(BoxwrightError):
    """An operation was started with, or stopped by, an aborted signal."""

    def __init__(self, reason: object = None) -> None:
        self.reason = reason
        super().__init__(f"aborted: {reason}" if reason is not None else "aborted")


class SecretResolutionError(BoxwrightError, LookupError):
    """A secret reference could not be resolved. The message names the secret, never a value."""

    def __init__(self, message: str, secret_name: str | None = None) -> None:
        self.secret_name = secret_name
        super().__init__(message)


class InvalidPolicyError(BoxwrightError, ValueError):
    """A sandbox policy or auth mode was given a value outside its allowed set."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} must be {allowed}, got {value!r}")


class LeaseLostError(BoxwrightError):
    """A lock's lease was lost while its holder still ran (renewal failed, or another holder took it over)."""

    def __init__(self, key: str, reason: str | None = None) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"lease on lock {key!r} was lost" + (f": {reason}" if reason else ""))


class StoreClosedError(BoxwrightError, RuntimeError):
    """A store's database was used after it was closed."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"database {path!r} is closed")


class StoreUnavailableError(BoxwrightError, ConnectionError):
    """A networked store (Redis) could not be reached or dropped the connection mid-call.

    The call's outcome is unknown when the connection dropped after the request was sent; a
    store never retries a write on its own, so a batch is never applied twice.
    """

    def __init__(self, url: str, action: str, detail: str) -> None:
        self.url = url
        self.action = action
        self.detail = detail
        super().__init__(f"store {url} is unreachable ({action}): {detail}; check that the server is up and the URL")


class WorkspaceSourceError(BoxwrightError):
    """The workspace source could not be landed (clone failed, local directory missing)."""

    def __init__(self, source: str, detail: str, *, ref: str | None = None, dir: str | None = None) -> None:
        self.source = source
        self.ref = ref
        self.dir = dir
        where = f" at ref {ref!r}" if ref is not None else ""
        into = f" into {dir}" if dir is not None else ""
        super().__init__(f"could not land workspace source {source}{where}{into}: {detail}")


class GitSkillError(BoxwrightError):
    """A git skill repository could not be cloned."""

    def __init__(self, repo: str, url: str, dir: str, detail: str) -> None:
        self.repo = repo
        self.url = url
        self.dir = dir
        super().__init__(f"could not clone git skill {repo!r} from {url} into {dir}: {detail}")


class SetupStepError(BoxwrightError):
    """A workspace setup step exited non-zero; ``output`` is the tail of what it printed."""

    def __init__(self, command: str, exit_code: int, output: str = "") -> None:
        self.command = command
        self.exit_code = exit_code
        self.output = output
        super().__init__(f"setup step failed: {command} (exit {exit_code})" + (f"\n{output}" if output else ""))


class BootstrapShellError(BoxwrightError):
    """The setup shell died, closed its output or stayed silent past the step deadline."""

    def __init__(self, command: str, reason: str, output: str = "") -> None:
        self.command = command
        self.reason = reason
        self.output = output
        super().__init__(f"setup shell failed running {command!r}: {reason}" + (f"\n{output}" if output else ""))


class ToolDefinitionError(BoxwrightError, ValueError):
    """A tool could not be declared: bad name, unsupported signature, or no JSON Schema for its types."""

    def __init__(self, tool_name: str, reason: str) -> None:
        self.tool_name = tool_name
        self.reason = reason
        super().__init__(f"cannot declare tool {tool_name!r}: {reason}")


class ToolArgumentsError(BoxwrightError, ValueError):
    """A tool call's arguments do not match the tool's input schema; ``detail`` names the bad field."""

    def __init__(self, tool_name: str, detail: str) -> None:
        self.tool_name = tool_name
        self.detail = detail
        super().__init__(f"Invalid arguments for tool {tool_name!r}: {detail}")


class UnknownToolError(BoxwrightError, LookupError):
    """A tool was called by a name the bridge does not serve."""

    def __init__(self, tool_name: str) -> None:
        self.tool_name = tool_name
        super().__init__(f"Unknown tool: {tool_name}")


class RemoteToolError(BoxwrightError):
    """The host's tool-exec endpoint refused or failed a call; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, tool_name: str, status: int, detail: str) -> None:
        self.tool_name = tool_name
        self.status = status
        self.detail = detail
        super().__init__(f'remote tool "{tool_name}" failed: {status} {detail}'.rstrip())


class ToolBridgeConfigError(BoxwrightError, ValueError):
    """The tool bridge was configured in a way it cannot serve (duplicate run, unusable token, no URL)."""


def _shown_id(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class InvalidRunIdError(BoxwrightError, ValueError):
    """A run id was refused (``boxwright.ids``): empty, ``.``/``..``, a separator, a control character,
    a lone surrogate, or too long; ``reason`` names which. An HTTP 400 ``invalid_run_id``."""

    code = "invalid_run_id"

    def __init__(self, run_id: object, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run id {_shown_id(run_id)} {reason}")


class InvalidThreadIdError(BoxwrightError, ValueError):
    """A thread id was refused, by the same rules as a run id (``boxwright.ids``). An HTTP 400 ``invalid_thread_id``."""

    code = "invalid_thread_id"

    def __init__(self, thread_id: object, reason: str) -> None:
        self.thread_id = thread_id
        self.reason = reason
        super().__init__(f"thread id {_shown_id(thread_id)} {reason}")


class JournalAttachUnavailableError(BoxwrightError):
    """A journal cannot be attached to or read, and waiting longer would not change that.

    ``reason`` is ``unknown-run``, ``terminal-run``, ``journal-timeout`` (nobody created the
    journal in time) or ``journal-stalled`` (it exists but gave no byte in time); ``target``
    is the run id, or the journal path when no run id was given.
    """

    def __init__(self, target: str, reason: str, detail: str = "") -> None:
        self.target = target
        self.reason = reason
        self.detail = detail
        super().__init__(f"cannot attach to run {target} ({reason})" + (f": {detail}" if detail else ""))


class JournalTruncatedError(BoxwrightError):
    """A journal read ended before the run's exit sentinel, and nobody asked it to stop."""

    def __init__(self, target: str, detail: str = "") -> None:
        self.target = target
        super().__init__(
            f"the journal of run {target} ended without its exit sentinel" + (f": {detail}" if detail else "")
        )


class JournalFrameError(BoxwrightError, ValueError):
    """A base64-framed journal read was cut short or garbled."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"journal read returned a broken base64 frame: {detail}")


class AgentProcessExitError(BoxwrightError):
    """A journaled agent exited non-zero; ``stderr`` is the tail of its stderr sidecar."""

    def __init__(self, exit_code: int, stderr: str = "") -> None:
        self.exit_code = exit_code
        self.stderr = stderr
        super().__init__(f"Agent process exited with code {exit_code}" + (f": {stderr[:1000]}" if stderr else ""))


class DurableRunIdRequiredError(BoxwrightError, ValueError):
    """A durable run was started without a run id, so no successor could find its journal."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        super().__init__(
            f"harness {adapter!r} runs durably and needs a run_id: a successor host recomputes the journal "
            "path from it, so none is generated; pass run_id=..."
        )


class HalfDurableRunError(BoxwrightError, ValueError):
    """``durability=`` without ``journal=``: the sandbox would be kept while the agent in it is killed."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r}: durability is one opt-in: durability= (keep the sandbox when the consumer goes) "
            "needs journal=JournalOptions() (the agent outlives the consumer); pass both, or neither"
        )


class DurableThreadIdRequiredError(BoxwrightError, ValueError):
    """Attaching to a durable run needs the thread id the run was started with."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        super().__init__(
            f"harness {adapter!r} is attaching to a durable run and needs its thread_id; pass thread_id=..."
        )


class DurableAttachNotSupportedError(BoxwrightError):
    """An attach was routed into a path that does not journal; retrying will not help."""

    def __init__(self, adapter: str, reason: str) -> None:
        self.adapter = adapter
        self.reason = reason
        super().__init__(f"harness {adapter!r} cannot attach to a durable run: {reason}")


# A run id the stores refuse (boxwright.ids; decision 7) is the same error the journal raises.
RunIdError = InvalidRunIdError


class InvalidOffsetError(BoxwrightError, ValueError):
    """A read offset was malformed, belongs to another run, or was never issued by this run's log (an HTTP 400)."""

    def __init__(self, run_id: str, offset: object, reason: str) -> None:
        self.run_id = run_id
        self.offset = offset
        self.reason = reason
        shown = repr(offset) if len(repr(offset)) <= 80 else repr(offset)[:77] + "..."
        super().__init__(f"invalid offset {shown} for run {run_id!r}: {reason}")


class EpochFencedError(BoxwrightError):
    """A superseded driver tried to write: the run's ``driver_epoch`` is no longer the one it holds."""

    def __init__(self, run_id: str, held_epoch: int | None, stored_epoch: int | None, action: str) -> None:
        self.run_id = run_id
        self.held_epoch = held_epoch
        self.stored_epoch = stored_epoch
        self.action = action
        stored = "no run record" if stored_epoch is None else f"driver epoch {stored_epoch}"
        super().__init__(
            f"{action} for run {run_id!r} refused: the writer holds driver epoch {held_epoch}, the store has {stored}"
        )


StaleDriverError = EpochFencedError


class EventLogClosedError(BoxwrightError, RuntimeError):
    """An append reached a run's event log after it was closed; a closed log never takes another event."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"the event log of run {run_id!r} is closed")


class InvalidRunStatusError(BoxwrightError, ValueError):
    """A run status outside running|interrupted|completed|failed|aborted, in a patch or read from a store."""

    def __init__(self, run_id: str, status: object) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"run {run_id!r}: {status!r} is not a run status (running, interrupted, completed, failed, aborted)"
        )


class RunAlreadyDrivenError(BoxwrightError, RuntimeError):
    """A RunController was asked to start a run it is still driving."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} is already being driven by this controller")


class RunThreadMismatchError(BoxwrightError, ValueError):
    """A run id already names a run of another thread (an HTTP 409): one run id, one thread."""

    def __init__(self, run_id: str, thread_id: str, existing_thread_id: str) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.existing_thread_id = existing_thread_id
        super().__init__(f"run {run_id!r} belongs to another thread, not to {thread_id!r}")


class RunExistsError(BoxwrightError, LookupError):
    """``RunStore.create`` found a record under that id already (created by another request, maybe at once)."""

    def __init__(self, run_id: str, thread_id: str) -> None:
        self.run_id = run_id
        self.thread_id = thread_id  # the thread of the record that exists
        super().__init__(f"run {run_id!r} exists already (thread {thread_id!r})")


class ThreadBusyError(BoxwrightError, RuntimeError):
    """A run was started on a thread that has an active run (an HTTP 409 ``thread_busy``)."""

    def __init__(self, thread_id: str, active_run_id: str) -> None:
        self.thread_id = thread_id
        self.active_run_id = active_run_id
        super().__init__(
            f"thread {thread_id!r} has an active run {active_run_id!r}: one run per thread at a time; "
            "wait for it to end or cancel it (POST /runs/{id}/cancel), or choose SandboxService(thread_runs='queue')"
        )


class RunClaimNotAcquiredError(BoxwrightError):
    """A driver could not claim a run: ``unknown``, already ``terminal``, or ``superseded`` (its viewer came back)."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id!r} was not claimed: {reason}")


class RunClaimLostError(EpochFencedError):
    """A claim holder was superseded mid-drive: its epoch moved on (``observed_epoch``) or its lease was lost.

    An ``EpochFencedError``, so ``pipe_to_run_log`` stops at once and writes nothing more for it.
    """

    def __init__(self, run_id: str, held_epoch: int, observed: int | str | None) -> None:
        self.run_id = run_id
        self.held_epoch = held_epoch
        self.observed_epoch = observed
        self.stored_epoch = observed if isinstance(observed, int) else None
        self.action = "write"
        seen = "the lease was lost" if observed == "lease-lost" else f"the store has driver epoch {observed}"
        BoxwrightError.__init__(self, f"run {run_id!r}: the claim at driver epoch {held_epoch} is lost: {seen}")


class RunDriverPipeOutsideClaimError(BoxwrightError, RuntimeError):
    """``pipe`` of a run driver was called while no claim on that run is held: there is no epoch to fence with."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r}: pipe was called outside its claim (call it from inside driver.claim)")


class RunLogNotQuiescentError(BoxwrightError, TimeoutError):
    """A run's event log kept growing: another writer is still live, so a successor must not append."""

    def __init__(self, run_id: str, quiet_ms: float, probes: int) -> None:
        self.run_id = run_id
        self.quiet_ms = quiet_ms
        self.probes = probes
        super().__init__(f"the event log of run {run_id!r} did not stay still for {quiet_ms}ms in {probes} probes")


class SandboxReclaimFailedError(BoxwrightError):
    """The sandbox of a finished run could not be destroyed: it is still up (and billed)."""

    def __init__(self, run_id: str, sandbox_key: str, detail: str = "") -> None:
        self.run_id = run_id
        self.sandbox_key = sandbox_key
        super().__init__(
            f"could not reclaim sandbox {sandbox_key!r} of run {run_id!r}" + (f": {detail}" if detail else "")
        )
