"""run_agent(): one agent run, from ensure() to the last event.

The order of what a consumer sees is fixed: RUN_STARTED first; then the
harness's translated events, interleaved with ``sandbox.file`` events from the
workspace watcher (and tool-bridge events); then ``file.changed`` with the
working tree's diff; RUN_FINISHED or RUN_ERROR last, exactly once, whatever
happened. Stopping the iteration (or aborting ``signal``) kills the agent and
destroys the sandbox: a cancelled run leaves nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from ._faults import fault_point
from .abort import AbortController, AbortSignal
from .auth import AuthMode
from .colocated import RUNNER_SECRET_ENV, ToolExecHost, colocated_drive
from .definition import CANCEL_REASON, EnsureContext, RunDurability, SandboxDefinition, Tenant, with_sandbox
from .errors import AbortError, DurableRunIdRequiredError, HalfDurableRunError, JournalAttachUnavailableError
from .events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    create_run_scoped_id_gen,
    now_ms,
)
from .file_hooks import FileHookContext, FileHookDispatcher, RunFileHooks
from .harnesses.base import (
    BridgeConfig,
    Harness,
    HarnessContext,
    HarnessPlan,
    LineSplitter,
    Message,
    RunFrame,
    executable_argv,
)
from .harnesses.base import prompt_from_messages as _prompt_from_messages
from .harnesses.interactive import AgentChannel, Interactive, Resumable
from .harnesses.relay import RelayedAgent, attach_relayed_agent, start_relayed_agent
from .host_paths import expose_host_command, host_path_env
from .journal import (
    DEFAULT_FIRST_BYTE_TIMEOUT_MS,
    DEFAULT_JOURNAL_POLL_MS,
    DEFAULT_STDERR_TAIL_BYTES,
    JournalPaths,
    RunLookup,
    _journal_exists,
    await_attachable_journal,
    decode_base64_frame,
    encode_run_id,
    journal_cleanup_command,
    journal_dir_of,
    journal_files_path,
    journal_paths,
    journal_stderr_read_command,
    parse_exit_sentinel,
    read_journal,
    start_journaled_agent,
)
from .projection import TARGETS, project_workspace, projection_for
from .runs import RUN_ABORTED_CODE, RUN_CANCELLED_CODE
from .sandbox import ProcessOptions, SandboxHandle, SpawnHandle
from .scrub import EventScrubber, mask_then_tail
from .secrets import SecretScope, process_secret_values, redact, resolve_all_secrets, run_bridge_token
from .shell import quote
from .stores.base import DEFAULT_LEASE_TTL_MS, LockStore, SandboxInstanceStore
from .tool_bridge import BridgeRegistration, HostToolBridge, start_host_tool_bridge
from .tool_bridge.tools import Tool, as_tools
from .watcher import FileEvent, WorkspaceWatcher, file_event_chunk, parse_listing

log = logging.getLogger("boxwright.agent")

STDERR_TAIL = 4096
# Shows new files too: `git diff` alone is blind to files git does not track yet.
DIFF_COMMAND = (
    "git diff 2>/dev/null && "  # outside a work tree git diff fails: no more git to start
    "git ls-files -z --others --exclude-standard 2>/dev/null | "
    "xargs -0 -r -n1 git diff --no-index -- /dev/null 2>/dev/null; true"
)
_SPLIT = "boxwright-diff"
_DONE = object()
T = TypeVar("T")


async def _write_files(handle: SandboxHandle, files: Mapping[str, str], cwd: str) -> None:
    # Through the shell, so the paths mean what they mean to the agent; the content goes by env,
    # never argv, because a config file may hold a token.
    for path, content in files.items():
        folder = path.rsplit("/", 1)[0] or "/"
        result = await handle.process.exec(
            f'umask 077 && mkdir -p {quote(folder)} && printf %s "$BOXWRIGHT_FILE" > {quote(path)}',
            ProcessOptions(cwd=cwd, env={"BOXWRIGHT_FILE": content}),
        )
        if result.exit_code != 0:
            raise OSError(f"could not write {path} in the sandbox: {result.stderr.strip()}")


async def _remove_files(handle: SandboxHandle, files: Sequence[str], cwd: str) -> None:
    if files:
        with contextlib.suppress(Exception):
            await handle.process.exec("rm -f " + " ".join(quote(p) for p in files), ProcessOptions(cwd=cwd))


class JournalCleanup:
    """The removal of one run's journal, handed by ``run_agent`` to whoever writes the run's end.

    ``run_agent`` never removes a journal at the exit sentinel: the events after it (the diff,
    the last file events, RUN_FINISHED) are not in the log yet, and a driver dying there would
    leave a successor nothing to replay. Given one of these (``JournalOptions(cleanup=...)``),
    it only arms it at the sentinel; the driver calls it (``await cleanup(record)``, the shape of
    ``pipe_to_run_log``'s ``after_terminal``) once the terminal record is durably written at
    its epoch. Unarmed (the agent's end was never read) it does nothing.
    """

    __slots__ = ("_target",)

    def __init__(self) -> None:
        self._target: tuple[SandboxHandle, JournalPaths] | None = None

    @property
    def armed(self) -> bool:
        return self._target is not None

    def arm(self, handle: SandboxHandle, paths: JournalPaths) -> None:
        self._target = (handle, paths)

    async def __call__(self, _record: object = None) -> bool:
        """Remove the journal and its stderr sidecar; ``True`` iff that ran and succeeded. Never raises."""
        target, self._target = self._target, None
        if target is None:
            return False
        handle, paths = target
        try:
            result = await handle.process.exec(journal_cleanup_command(paths))
        except Exception as exc:
            log.warning("could not remove the journal %s: %s", paths.journal, exc)
            return False
        return result.exit_code == 0


@dataclass(frozen=True)
class JournalOptions:
    """Run the agent journaled, so the run outlives this process (see ``boxwright.journal``).

    A fresh run starts the agent detached from the request (its output goes to a file in the
    sandbox); ``attach=True`` starts nothing and re-reads the journal of a run another driver
    started, from byte 0, translating it again (``boxwright.takeover`` drops what is stored).
    ``dir`` None asks the sandbox (``journal_dir_of``): each sandbox's journals are its own.
    ``cleanup``: see ``JournalCleanup``. Without one, a fresh run removes its journal after its
    terminal event was delivered, and an attaching reader never removes it (the reaper's
    ``prune_journals`` does).
    ``logged``: an attaching reader's view of the run's stored events, from which its watcher
    learns which file events the log already holds (see ``_resume_file_events``).
    ``first_byte_timeout_ms`` bounds an attach only (a fresh run's agent may print late).
    """

    dir: str | None = None
    cleanup: JournalCleanup | None = None
    attach: bool = False
    runs: RunLookup | None = None
    logged: Callable[[], Awaitable[Sequence[Event]]] | None = None
    first_byte_timeout_ms: float | None = DEFAULT_FIRST_BYTE_TIMEOUT_MS
    poll_interval_ms: float = DEFAULT_JOURNAL_POLL_MS
    # An attach's fallback: the run's stored input. When no journal appears within the attach wait and
    # the sandbox has none (the first driver died before it started the agent), the agent is started
    # fresh from these instead of failing the run. A journal that exists is always replayed.
    fresh: Sequence[Message] | str | None = None


class _Run:
    """The moving parts of one drive: the agent process, its readers and the watcher."""

    def __init__(self, thread_id: str, run_id: str, scrub: EventScrubber | None = None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.scrub = scrub
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.stderr: list[str] = []
        # Every task of this drive (the output pumps, the journal reader): owned here, cancelled and
        # awaited by ``close``, so none outlives the run's teardown.
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        name = getattr(work, "__qualname__", "task")
        task = asyncio.get_running_loop().create_task(work, name=f"boxwright {name} {self.run_id!r}")
        self.tasks.append(task)
        return task

    def on_file(self, event: FileEvent) -> None:
        self.queue.put_nowait(file_event_chunk(event, thread_id=self.thread_id, run_id=self.run_id))

    def on_bridge_event(self, name: str, value: Any) -> None:
        """A host tool started, finished or failed: spliced into the run's events in arrival order."""
        self.queue.put_nowait(
            CustomEvent(name=name, value=value, metadata={"threadId": self.thread_id, "runId": self.run_id})
        )

    def stderr_tail(self) -> str:
        return mask_then_tail("".join(self.stderr), STDERR_TAIL, self.scrub)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks)  # their own errors are reported where they are awaited


async def run_agent(
    sandbox: SandboxDefinition,
    harness: Harness,
    messages: Sequence[Message] | str,
    *,
    thread_id: str,
    run_id: str | None = None,
    tools: Sequence[Tool | Callable[..., Any]] | None = None,
    bridge: HostToolBridge | None = None,
    signal: AbortSignal | None = None,
    store: SandboxInstanceStore | None = None,
    locks: LockStore | None = None,
    lock_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    tenant: Tenant | None = None,
    session_id: str | None = None,
    cwd: str = "/workspace",
    auth_mode: AuthMode | None = None,
    host_env: Mapping[str, str] | None = None,
    journal: JournalOptions | None = None,
    durability: RunDurability | None = None,
    file_hooks: Sequence[RunFileHooks] = (),
    mode: Literal["host-driven", "colocated"] = "host-driven",
    runner_secret: str | None = None,
    deadline: float | None = None,
    tool_exec: ToolExecHost | None = None,
) -> AsyncIterator[Event]:
    """Run ``harness`` in ``sandbox`` on ``messages`` and yield its work as AG-UI events.

    ``mode="colocated"`` (Docker): the in-container runner drives the harness next to the
    bridge and only tool execution crosses back (``boxwright.colocated``). There ``journal``
    is the runner's own NDJSON (``journal.attach`` re-attaches to it), and ``runner_secret``
    (default ``$BOXWRIGHT_RUNNER_SECRET``; a durable run needs one) is what every host entitled
    to the run derives the runner's token from; ``tool_exec`` serves its host tools (default: a
    listener of the drive's own; a coordinator passes its ``/tool-exec`` registry). A host-driven
    run derives its tool bridge's token from the same secret when there is one, so a replica that
    takes it over serves the agent's calls under the token it already holds (else: a random token).

    ``journal`` makes the agent outlive this process; ``durability`` (the run record) decides
    what a dropped consumer means: detach (keep the sandbox) unless a cancel is recorded.
    Durability is one opt-in: ``durability`` without ``journal`` raises ``HalfDurableRunError``
    (journal alone is a journaled agent that ends with its sandbox), and a journaled run needs
    the caller's ``run_id`` (``DurableRunIdRequiredError``). Both raise on the first step.
    ``lock_ttl_ms``: the lease of the sandbox's lock while ``ensure`` holds it (renewed meanwhile):
    how long a host that dies creating the sandbox keeps the next one out (``SandboxService`` passes
    its run lease).
    ``file_hooks``: this run's file-event hooks, called after the sandbox's (``boxwright.file_hooks``).
    ``deadline``: seconds the whole run may take; past it the agent is stopped as by a cancel and the
    run ends with one ``RUN_ERROR`` coded ``deadline_exceeded`` (an agent that retries an unreachable
    model for ever, as Codex does, then ends).
    """
    if journal is not None and not run_id:
        # A successor recomputes the journal path from the run id: a generated one could never be found.
        raise DurableRunIdRequiredError(harness.name)
    run_id = run_id or uuid.uuid4().hex
    if durability is not None and journal is None:
        # Kept sandbox, killed agent: the half state the seed rules out (durability is ONE opt-in).
        raise HalfDurableRunError(run_id)
    frame = RunFrame(thread_id, run_id)
    clock = _RunClock()
    for event in frame.start():
        yield clock(event)
    if isinstance(messages, str):
        messages = [Message(role="user", content=messages)]
    try:
        prompt, system = _prompt_from_messages(messages, harness.name)
        # Before any sandbox exists: a value that is not a tool must not cost a provisioned sandbox.
        declared = as_tools(tools)
        timer = _deadline_timer(deadline)
    except ValueError as exc:
        for event in frame.error(str(exc), "invalid_input"):
            yield clock(event)
        return
    if timer is not None:
        signal = AbortSignal.any([signal, timer.signal])
    ctx = EnsureContext(
        thread_id=thread_id,
        run_id=run_id,
        store=store,
        locks=locks,
        tenant=tenant,
        signal=signal,
        adapter_name=harness.name,
        lock_ttl_ms=lock_ttl_ms,
    )
    # This run's own secret values (its bridge token, the harness's credentials): masked in its
    # events, and in logs while it runs; released when it ends.
    secrets = SecretScope()
    # And the app's own (a local-process agent can read its host's argv and env): never in a run's events.
    scrub = EventScrubber(process_secret_values(), scope=secrets)
    entered: Any = None  # the sandbox scope, once with_sandbox gave it (an abort may come before)
    try:
        async with with_sandbox(sandbox, ctx, durability=durability) as scope:
            entered = scope
            hctx = HarnessContext(
                run_id=run_id,
                thread_id=thread_id,
                prompt=prompt,
                system_prompt=system,
                capabilities=scope.handle.capabilities,
                provider=scope.handle.provider,
                gen_id=create_run_scoped_id_gen(run_id),
                cwd=cwd,
                policy=sandbox.policy,
                bridge=None,
                session_id=session_id,
                auth_mode=auth_mode,
                host_env=dict(os.environ if host_env is None else host_env),
                file_suffix=encode_run_id(run_id),
            )
            if sandbox.workspace is not None:
                scrub.add(resolve_all_secrets(sandbox.workspace.secrets).values())
            drive = (
                colocated_drive(
                    scope.handle,
                    harness,
                    run_id=run_id,
                    thread_id=thread_id,
                    messages=messages,
                    tools=declared,
                    host_env=hctx.host_env,
                    scrub=scrub,
                    signal=signal,
                    cwd=cwd,
                    durable=journal is not None,
                    attach=journal is not None and journal.attach,
                    runner_secret=runner_secret,
                    owns=lambda: not _superseded(durability),
                    tool_exec=tool_exec,
                    # A takeover's fallback when the runner never had the run (boxwright.colocated).
                    fresh=_as_messages(journal.fresh) if journal is not None and journal.attach else None,
                    logged=journal.logged if journal is not None and journal.attach else None,
                )
                if mode == "colocated"
                else _drive(
                    sandbox,
                    scope.handle,
                    harness,
                    hctx,
                    frame,
                    signal,
                    declared,
                    bridge,
                    journal,
                    scrub,
                    file_hooks,
                    owns=lambda: not _superseded(durability),
                    bridge_secret=shared_secret(runner_secret),
                )
            )
            with secrets:
                async with contextlib.aclosing(drive):
                    async for event in drive:
                        for out in scrub.feed(event):
                            yield clock(out)
                    for out in scrub.flush():
                        yield clock(out)
    except Exception as exc:
        if not (isinstance(exc, AbortError) and signal is not None and signal.aborted):
            # Anything before or around the drive (ensure, bootstrap, projection): one RUN_ERROR naming it.
            log.warning("run %s failed: %s", run_id, exc)
            for event in frame.error(scrub.mask(redact(f"{type(exc).__name__}: {exc}")), _error_code(exc)):
                yield clock(event)
            return
        # A step that gave up because the run was stopped (a Stop pressed while the agent starts): an abort, below.
    if signal is not None and signal.aborted:
        if entered is not None and entered.ending in ("detached", "superseded"):
            return  # the agent goes on in its sandbox; a later driver reports how it ends
        # Coded so a run log records ``aborted``, never ``failed``: a stop is not a failure.
        if timer is not None and timer.hit:
            message = f"the run exceeded its deadline of {deadline:g} s and was stopped (run_agent's deadline=)"
            code = DEADLINE_EXCEEDED_CODE
        elif signal.reason == CANCEL_REASON:
            message, code = "the run was cancelled", RUN_CANCELLED_CODE
        else:
            message, code = f"the run was aborted: {signal.reason}", RUN_ABORTED_CODE
        for event in frame.error(message, code):
            yield clock(event)


DEADLINE_EXCEEDED_CODE = "deadline_exceeded"


class _DeadlineTimer:
    """Aborts its signal once the run's deadline passes. The reason is a cancel's: a run past its
    deadline is stopped and its sandbox ended as a cancel ends them, never detached."""

    def __init__(self, seconds: float) -> None:
        self.hit = False
        self._controller = AbortController()
        self.signal = self._controller.signal
        asyncio.get_running_loop().call_later(seconds, self._fire)

    def _fire(self) -> None:
        if not self.signal.aborted:
            self.hit = True
            self._controller.abort(CANCEL_REASON)


def _deadline_timer(deadline: float | None) -> _DeadlineTimer | None:
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline):
        raise ValueError(f"deadline must be a number of seconds > 0, got {deadline!r}")
    if deadline <= 0:
        raise ValueError(f"deadline must be a number of seconds > 0, got {deadline!r}")
    return _DeadlineTimer(float(deadline))


class _RunClock:
    """Stamps each event as run_agent emits it, never earlier than the one before.

    A translator stamps an event when it reads the agent's line, and the terminal one is held
    back for the file events and the diff: a client ordering by time must see the run end last.
    """

    def __init__(self) -> None:
        self.last = 0

    def __call__(self, event: Event) -> Event:
        self.last = max(now_ms(), self.last)
        if event.timestamp == self.last:
            return event
        return msgspec.structs.replace(event, timestamp=self.last)


def _error_code(exc: BaseException) -> str:
    return getattr(exc, "code", None) or type(exc).__name__


def _as_messages(given: Sequence[Message] | str | None) -> Sequence[Message] | None:
    return [Message(role="user", content=given)] if isinstance(given, str) else given


def _superseded(durability: RunDurability | None) -> bool:
    # A record-backed durability knows when another driver took the run over (its claim latched):
    # from then on this drive touches nothing in the sandbox the successor now owns.
    try:
        return bool(getattr(durability, "superseded", False))
    except Exception:
        return False


async def _attach_or_start_fresh(
    handle: SandboxHandle,
    harness: Harness,
    hctx: HarnessContext,
    journal: JournalOptions,
    signal: AbortSignal | None,
) -> tuple[JournalOptions, HarnessContext]:
    """An attach with a stored input: the attach itself when the journal is there (or appears in
    the wait), else a fresh start from ``journal.fresh`` (the agent never started: nothing to replay).

    Only a journal the sandbox answered "absent" for starts the agent: a probe that could not tell
    (an unreachable sandbox) fails the attach as before, so an agent is never started twice.
    """
    assert journal.fresh is not None
    paths = journal_paths(hctx.run_id, journal.dir or journal_dir_of(handle))
    try:
        await await_attachable_journal(handle, paths, hctx.run_id, runs=journal.runs, signal=signal)
    except JournalAttachUnavailableError as exc:
        if exc.reason != "journal-timeout" or await _journal_exists(handle, paths, hctx.run_id) is not False:
            raise
        log.warning("run %s: no journal in its sandbox (its agent never started): starting it now", hctx.run_id)
        given = journal.fresh
        prompt, system = _prompt_from_messages(
            [Message(role="user", content=given)] if isinstance(given, str) else given, harness.name
        )
        fresh = dataclasses.replace(journal, attach=False, logged=None, fresh=None)
        return fresh, dataclasses.replace(hctx, prompt=prompt, system_prompt=system)
    return dataclasses.replace(journal, fresh=None), hctx


async def _drive(
    sandbox: SandboxDefinition,
    handle: SandboxHandle,
    harness: Harness,
    hctx: HarnessContext,
    frame: RunFrame,
    signal: AbortSignal | None,
    tools: Sequence[Tool],
    bridge: HostToolBridge | None,
    journal: JournalOptions | None,
    scrub: EventScrubber,
    file_hooks: Sequence[RunFileHooks] = (),
    owns: Callable[[], bool] = lambda: True,
    bridge_secret: str | None = None,
) -> AsyncGenerator[Event, None]:
    if journal is not None and journal.attach and journal.fresh is not None:
        journal, hctx = await _attach_or_start_fresh(handle, harness, hctx, journal, signal)
    executable = getattr(harness, "executable", None)
    agent_cli: list[str] | None = None
    if isinstance(executable, str) and executable.split():
        # Found on the host and shown read-only to a sandbox that can be shown host paths (bubblewrap):
        # an agent CLI installed in /opt or ~/.local runs there as it does on the host, by absolute path.
        hctx.executable = expose_host_command(handle, executable.split()[0], host_path_env(hctx.host_env))
        agent_cli = executable_argv(executable, hctx)
    if sandbox.workspace is not None and harness.name in TARGETS:
        projection = projection_for(sandbox.workspace, sandbox.workspace_hash())
        # The CLI's own plugin installer is the very executable the run starts, found the same way.
        await project_workspace(handle, projection, harness.name, executable=agent_cli or ("claude",))
    run = _Run(hctx.thread_id, hctx.run_id, scrub)
    attaching = journal is not None and journal.attach
    # A successor serves the agent's calls at once, but their events wait until its replay is past the
    # stored log (see _HeldBridgeEvents).
    bridge_events = _HeldBridgeEvents(run.on_bridge_event, held=attaching)
    own_bridge: HostToolBridge | None = None
    registration: BridgeRegistration | None = None
    # A harness may answer its permission prompts from the policy through the bridge (Claude Code).
    permission_tool = getattr(harness, "permission_tool", None)
    permission = permission_tool(sandbox.policy, emit=bridge_events.emit) if callable(permission_tool) else None
    if tools or permission is not None:
        if bridge is None:
            # No listener shared by the app: one for this run, closed with it.
            bridge = own_bridge = await start_host_tool_bridge(provider=handle.provider)
        # Before anything else of a takeover's drive, so an agent's call held for this run is served
        # soon. Derived from the replicas' secret when there is one: the agent's MCP config still
        # holds the token its first driver gave it (boxwright.secrets.run_bridge_token).
        registration = bridge.register(
            hctx.run_id,
            tools,
            thread_id=hctx.thread_id,
            signal=signal,
            emit_custom_event=bridge_events.emit,
            permission=permission,
            token=run_bridge_token(bridge_secret, hctx.run_id, hctx.thread_id),
        )
        scrub.add([registration.token])
        hctx.bridge = BridgeConfig(url=registration.url, token=registration.token)
    plan: HarnessPlan = harness.plan(hctx)
    scrub.add(plan.secrets)
    hooks = FileHookDispatcher(sandbox.hooks, file_hooks, FileHookContext(hctx.run_id, hctx.thread_id))
    watcher: WorkspaceWatcher | None = None
    held: Event | None = None
    process: SpawnHandle | None = None
    channel: AgentChannel | None = None
    relay: RelayedAgent | None = None

    async def teardown() -> None:
        if channel is not None:
            await channel.close()
        if relay is not None:
            if signal is not None and signal.aborted and signal.reason == CANCEL_REASON and owns():
                # A cancel stops a relayed agent here (another host's agent is no process of ours to kill);
                # any other end leaves it to the sandbox's fate, or to a successor.
                with contextlib.suppress(Exception):
                    await relay.kill()
            await relay.close()
        if process is not None:
            # Normally long gone; after an error or a cancel, the agent must not outlive the run.
            with contextlib.suppress(Exception):
                await _detached_kill(process)
        await run.close()
        await hooks.aclose()
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()
        if owns():
            await _remove_files(handle, list(plan.files), hctx.cwd)
        if registration is not None:
            registration.close()
        if own_bridge is not None:
            await own_bridge.close()

    ended = False  # the agent's end was read: teardown may wait until the terminal event is out
    remove_journal: JournalPaths | None = None  # removed by this drive once its terminal event is out
    try:
        await _write_files(handle, plan.files, hctx.cwd)
        if sandbox.file_events:
            on_file = _calling_hooks(run.on_file, hooks) if hooks.active else run.on_file
            watcher = WorkspaceWatcher(handle, on_file, root=hctx.cwd, hold=attaching)
            listing = None
            if journal is not None and not attaching:
                # Before the agent starts, so any successor finds it (see _resume_file_events).
                listing = await _store_listing(
                    handle, journal_paths(hctx.run_id, journal.dir or journal_dir_of(handle)), watcher, hctx.cwd
                )
            await watcher.start(listing)
        translator = harness.translator(hctx)
        # A protocol agent (ACP) is answered on its stdin while it runs: see harnesses/interactive.py.
        interactive = isinstance(translator, Interactive)
        stdin = plan.stdin if hctx.capabilities.writable_stdin else None
        journaled: asyncio.Task[tuple[int | None, str]] | None = None
        if journal is not None:
            paths = journal_paths(hctx.run_id, journal.dir or journal_dir_of(handle))
            caught_up: tuple[int, Callable[[], None]] | None = None
            if not journal.attach:
                # No signal: a dropped request must not kill a durable agent; a cancel destroys the sandbox.
                if interactive:
                    # A protocol agent's stdin must outlive this host too: see harnesses/relay.py.
                    relay = await start_relayed_agent(handle, plan.command, paths, env=plan.env, cwd=hctx.cwd)
                else:
                    await start_journaled_agent(handle, plan.command, paths, stdin=stdin, env=plan.env, cwd=hctx.cwd)
            else:
                if interactive:
                    relay, sent = await attach_relayed_agent(handle, paths)
                    if isinstance(translator, Resumable):
                        translator.resume(sent)
                if watcher is not None:
                    caught_up = (await _resume_file_events(handle, paths, journal, watcher), watcher.release)
                if registration is not None:
                    caught_up = await _releasing_bridge_events(handle, paths, caught_up, bridge_events)
            if relay is not None and isinstance(translator, Interactive):
                # Attached before the journal is read: a replayed request still unanswered is answered now.
                channel = AgentChannel(relay, handle, hctx.cwd, run.queue.put_nowait, signal)
                channel.listen(translator, only=lambda reason: reason == CANCEL_REASON)
                translator.attach(channel)
            journaled = run.spawn(_pump_journal(handle, paths, journal, translator, run, signal, caught_up))
            if relay is not None:
                journaled.add_done_callback(_setter(relay.exited))
        else:
            # An interactive agent is told of a cancel first (its channel kills it after a grace period).
            process = await handle.process.spawn(
                plan.command, ProcessOptions(cwd=hctx.cwd, env=plan.env, signal=None if interactive else signal)
            )
            run.spawn(_pump_stdout(process.stdout, translator, run))
            run.spawn(_pump_stderr(process.stderr, run))
            if isinstance(translator, Interactive):
                channel = AgentChannel(process, handle, hctx.cwd, run.queue.put_nowait, signal)
                channel.listen(translator)
                translator.attach(channel)
            elif stdin is not None:
                with contextlib.suppress(Exception):  # an agent that exits at once closes its stdin
                    await process.stdin.write(stdin)
            if channel is None:
                with contextlib.suppress(Exception):
                    await process.stdin.end()

        while (item := await run.queue.get()) is not _DONE:
            for event in _events(item):
                if isinstance(event, RunStartedEvent):
                    continue  # ours went first
                if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
                    held = held or event  # the terminal event waits for the diff
                    continue
                yield event
        if journaled is not None:
            journal_exit, stderr_tail = await journaled
            if channel is not None:
                await channel.close()  # the conversation's tasks end with the agent
            if journal_exit is None:
                return  # the read was stopped (cancel or detach): the agent's end is not ours to report
            exit_code = journal_exit
            if journal is not None and journal.cleanup is None and not journal.attach:
                remove_journal = paths
        else:
            assert process is not None
            exit_code = await process.wait()
            if channel is not None:
                await channel.close()  # its writer and its requests end with the agent
            await asyncio.gather(*run.tasks)
            stderr_tail = run.stderr_tail()
        for event in translator.finish(exit_code, stderr_tail):
            if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
                held = held or event
            elif not isinstance(event, RunStartedEvent):
                yield event
        # The watcher's last listing and the diff both read the finished tree: one command takes
        # both, so the end of a run costs that one read, never a fixed wait.
        diff = await _final_reads(handle, hctx.cwd, watcher, bool(getattr(harness, "emit_diff", True)))
        await hooks.drain()  # the run ends once its file hooks have seen every event
        bridge_events.release()  # a replay that ended before its caught-up point: they go out last
        while not run.queue.empty():  # last file and bridge events
            for event in _events(run.queue.get_nowait()):
                yield event
        if diff.strip():
            yield CustomEvent(
                name="file.changed",
                value={"path": ".", "diff": diff, "threadId": hctx.thread_id, "runId": hctx.run_id},
            )
        ended = True
    finally:
        if not ended:
            await teardown()
    try:
        if signal is not None and signal.aborted:
            return  # run_agent reports the cancel
        if held is not None:
            frame.ended = True
            yield held
        else:
            for event in frame.finish():
                yield event
        if remove_journal is not None and owns():
            # A journaled run without a record: its end is the terminal event its consumer now has.
            with contextlib.suppress(Exception):
                await handle.process.exec(journal_cleanup_command(remove_journal))
    finally:
        # After the terminal event: its consumer need not wait for the last kill, the watch
        # task's end or the bridge's close, which change nothing it is told.
        await teardown()


def shared_secret(runner_secret: str | None) -> str | None:
    """The secret every replica of a service shares: ``runner_secret``, else ``$BOXWRIGHT_RUNNER_SECRET``."""
    return runner_secret if runner_secret is not None else os.environ.get(RUNNER_SECRET_ENV) or None


class _HeldBridgeEvents:
    """A run's tool-bridge events, held on a takeover until its replay is past the stored log.

    Why: the successor serves the agent's calls as soon as it registers the run (one may have been
    waiting, ``ToolBridgeApp.hold_unregistered``), before its replay of the journal has caught up,
    and ``align_to_stored_log`` drops an out-of-band event met inside the stored prefix: the call
    would run and its events be lost. Held, they go out in arrival order once released.
    """

    def __init__(self, emit: Callable[[str, Any], None], *, held: bool) -> None:
        self._emit = emit
        self._held: list[tuple[str, Any]] | None = [] if held else None

    def emit(self, name: str, value: Any) -> None:
        if self._held is None:
            self._emit(name, value)
        else:
            self._held.append((name, value))

    def release(self) -> None:
        held, self._held = self._held, None
        for name, value in held or ():
            self._emit(name, value)


async def _releasing_bridge_events(
    handle: SandboxHandle,
    paths: JournalPaths,
    caught_up: tuple[int, Callable[[], None]] | None,
    events: _HeldBridgeEvents,
) -> tuple[int, Callable[[], None]]:
    """``caught_up`` extended to release ``events`` too (at the journal's size now when there was none)."""
    if caught_up is None:
        size = 0
        with contextlib.suppress(Exception):  # unreadable: released at once (the events may then be dropped)
            size = int((await handle.process.exec(f"wc -c < {quote(paths.journal)} 2>/dev/null || echo 0")).stdout)
        return size, events.release
    size, first = caught_up

    def both() -> None:
        first()
        events.release()

    return size, both


async def _store_listing(handle: SandboxHandle, paths: JournalPaths, watcher: WorkspaceWatcher, cwd: str) -> str | None:
    """The watcher's start listing, taken by the sandbox into a private file beside the journal and
    returned (written there, not sent: a large workspace's listing is no argument or env value).
    ``None`` if that failed: the run goes on, a successor then reports less (see _resume_file_events)."""
    files = quote(journal_files_path(paths))
    listing = f"{{ {watcher.listing_command}; true; }}"
    command = f"umask 077 && mkdir -p {quote(paths.dir)} && {listing} > {files} && cat {files}"
    try:
        result = await handle.process.exec(command, ProcessOptions(cwd=cwd))
    except Exception as exc:
        log.warning("%s: could not store the workspace listing: %r", files, exc)
        return None
    if result.exit_code != 0:
        log.warning("%s: could not store the workspace listing: %s", files, result.stderr.strip())
        return None
    return result.stdout


async def _resume_file_events(
    handle: SandboxHandle, paths: JournalPaths, journal: JournalOptions, watcher: WorkspaceWatcher
) -> int:
    """Tell a successor's (held) watcher what the run's log knows; returns the journal's size now.

    Why a stored listing, not journaled file events: file events come from a watcher racing the
    agent, and a driver can die between seeing a change and logging it, so no record the driver
    keeps can be complete. The workspace itself is: the first driver's listing from before its
    agent started, plus the file events its log holds, is what the log already knows; this
    watcher's start listing is the tree now, and ``reconcile`` between them is exactly what the
    log lacks. Its release waits until the replay has translated the journal as it was when this
    listing was taken (the returned size): every tool call that wrote one of these files is in
    those bytes (an agent logs a call before running it), so each file event follows its call,
    and the replay is past the stored log, whose alignment would drop an out-of-band event met
    inside its prefix.
    """
    split = "boxwright-files"
    files = quote(journal_files_path(paths))
    command = (
        f"if [ -f {files} ]; then printf y; cat {files}; fi; printf '\\0{split}\\0\\n'; "
        f"wc -c < {quote(paths.journal)} 2>/dev/null || echo 0"
    )
    baseline: dict[str, str] | None = None
    size = 0
    try:
        output = (await handle.process.exec(command)).stdout
        stored, found, rest = output.partition(f"\0{split}\0\n")
        if found:
            size = int(rest.strip() or 0)
            if stored.startswith("y"):
                baseline = parse_listing(stored[1:])
    except Exception as exc:  # no listing: the gap before this watcher cannot be reported, the rest can
        log.warning("%s: the workspace listing from before the run is unreadable: %r", paths.journal, exc)
    if baseline is None:
        # An older driver's run: what changed before this watcher started is not reported.
        log.warning("%s: no workspace listing from before the run; earlier file events may be missing", paths.journal)
    reported: dict[str, str] = {}
    if journal.logged is not None:
        for event in await journal.logged():
            value = event.value if isinstance(event, CustomEvent) and event.name == "sandbox.file" else None
            if isinstance(value, dict) and isinstance(value.get("path"), str):
                reported[value["path"]] = str(value.get("type"))
    watcher.resume_from(baseline, reported)
    return size


def _calling_hooks(on_file: Callable[[FileEvent], None], hooks: FileHookDispatcher) -> Callable[[FileEvent], None]:
    def both(event: FileEvent) -> None:
        on_file(event)
        hooks.push(event)

    return both


async def _final_reads(handle: SandboxHandle, cwd: str, watcher: WorkspaceWatcher | None, diff: bool) -> str:
    """The watcher's last listing (handed to it) and the working tree's diff (returned), in one exec."""
    if watcher is None:
        return (await handle.process.exec(DIFF_COMMAND, ProcessOptions(cwd=cwd))).stdout if diff else ""
    if not diff:
        await watcher.finish()
        return ""
    # A NUL cannot occur in a listed path: the marker cannot be mistaken for a line of the listing.
    command = f"{{ {watcher.listing_command}; }}; printf '\\0{_SPLIT}\\0\\n'; {DIFF_COMMAND}"
    output = (await handle.process.exec(command, ProcessOptions(cwd=cwd))).stdout
    listing, found, rest = output.partition(f"\0{_SPLIT}\0\n")
    await watcher.finish(listing if found else None)
    return rest


async def _detached_kill(process: SpawnHandle) -> None:
    task = asyncio.ensure_future(process.kill())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), 5)


def _setter(event: asyncio.Event) -> Callable[[asyncio.Task[Any]], None]:
    def done(_task: asyncio.Task[Any]) -> None:
        event.set()

    return done


def _events(item: Any) -> list[Event]:
    return item if isinstance(item, list) else [item]


async def _pump_stdout(stdout: AsyncIterator[str], translator: Any, run: _Run) -> None:
    splitter = LineSplitter()
    try:
        async for chunk in stdout:
            for line in splitter.feed(chunk):
                if line.strip():
                    run.queue.put_nowait(translator.feed(line))
        for line in splitter.flush():
            run.queue.put_nowait(translator.feed(line))
        if splitter.dropped:
            log.warning("run %s: dropped %d agent output line(s) over the size limit", run.run_id, splitter.dropped)
    finally:
        run.queue.put_nowait(_DONE)


async def _pump_journal(
    handle: SandboxHandle,
    paths: JournalPaths,
    options: JournalOptions,
    translator: Any,
    run: _Run,
    signal: AbortSignal | None,
    caught_up: tuple[int, Callable[[], None]] | None = None,
) -> tuple[int | None, str]:
    """Translate the journal up to the exit sentinel; returns (exit code or None if stopped, stderr tail).

    ``caught_up`` = (size, call): ``call()`` once the lines up to byte ``size`` are translated,
    right after their events are queued (a successor's watcher release, see ``_resume_file_events``).
    """
    exit_code: int | None = None

    def check(position: int) -> None:
        nonlocal caught_up
        if caught_up is not None and position >= caught_up[0]:
            call = caught_up[1]
            caught_up = None
            call()

    try:
        check(0)
        if options.attach:
            await await_attachable_journal(handle, paths, run.run_id, runs=options.runs, signal=signal)
        lines = read_journal(
            handle,
            paths,
            signal=signal,
            poll_interval_ms=options.poll_interval_ms,
            # Only an attach is bounded: a fresh run started its agent itself, and an agent may print
            # nothing for long (measured: loaded, OpenCode's first line came after 10 s, killing the run).
            # Its wrapper always writes the sentinel; a removed journal still ends the read.
            first_byte_timeout_ms=options.first_byte_timeout_ms if options.attach else None,
            run_id=run.run_id,
        )
        async with contextlib.aclosing(lines):
            async for entry in lines:
                if not entry.line.strip():
                    check(entry.end_position)
                    continue
                exit_code = parse_exit_sentinel(entry.line, paths)
                if exit_code is not None:
                    # Not released here: the run's last events (translator.finish) may be in the
                    # stored log still ahead; the watcher's finish releases after them.
                    fault_point("agent.exit-sentinel")
                    break
                run.queue.put_nowait(translator.feed(entry.line))
                check(entry.end_position)
                fault_point("agent.journal-line")
    finally:
        run.queue.put_nowait(_DONE)
    if exit_code is None:
        return None, ""
    stderr = ""
    if exit_code != 0:
        with contextlib.suppress(Exception):
            # The tail starts mid-file, maybe inside a key: read one key's length more, mask, then
            # drop that margin, so no piece of a value cut in half at the window's start survives.
            margin = run.scrub.longest if run.scrub is not None else 0
            wanted = DEFAULT_STDERR_TAIL_BYTES + margin
            read = await handle.process.exec(journal_stderr_read_command(paths, wanted))
            raw = decode_base64_frame(read.stdout)
            stderr = raw.decode("utf-8", "replace")
            if run.scrub is not None:
                stderr = run.scrub.mask(stderr)
                if len(raw) >= wanted:
                    stderr = stderr[margin:]
    if options.cleanup is not None:
        # Not removed here: the run's last events are not in its log yet (see JournalCleanup).
        options.cleanup.arm(handle, paths)
    return exit_code, stderr


async def _pump_stderr(stderr: AsyncIterator[str], run: _Run) -> None:
    async for chunk in stderr:
        run.stderr.append(chunk)
        if sum(map(len, run.stderr)) > 4 * STDERR_TAIL:
            run.stderr[:] = [run.stderr_tail()]
