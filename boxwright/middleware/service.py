"""The in-app shape: a service that drives runs in the background, and the ASGI glue around it.

``SandboxService`` starts ``run_agent`` runs whose events go into an ``EventLog`` through
``pipe_to_run_log``: the run is a task of its own (in the service's one registry, a child of its
TaskGroup once entered), so the request that started it, and every client tailing it, may come
and go without touching it. Stopping a run is an explicit cancel
(both bands: the durable ``cancel_requested`` flag and the in-process abort with
``RUN_CANCEL_REASON``), which also destroys its sandbox whatever the lifecycle says.

``SandboxMiddleware`` only puts the service on ``request.state.boxwright``; ``sandbox_routes``
offers ready-made routes (trigger, tail, cancel, record) for apps that want them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import inspect
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from boxwright._json import BoundedDecoder, JsonBoundsError
from boxwright.abort import AbortController, AbortSignal, wait_unless_aborted
from boxwright.agent import JournalCleanup, JournalOptions, run_agent, shared_secret
from boxwright.colocated import ToolExecHost
from boxwright.definition import EnsureContext, SandboxDefinition
from boxwright.errors import (
    EpochFencedError,
    InvalidRunIdError,
    InvalidThreadIdError,
    RunClaimLostError,
    RunExistsError,
    RunThreadMismatchError,
    ThreadBusyError,
)
from boxwright.events import Event, RunErrorEvent, now_ms
from boxwright.file_hooks import RunFileHooks
from boxwright.harnesses.base import Harness, Message
from boxwright.ids import check_client_run_id, check_thread_id
from boxwright.run_input import RunInputTooLargeError, decode_run_input, encode_run_input
from boxwright.runs import (
    ABORT_ERROR_CODES,
    RUN_CANCEL_REASON,
    EventLog,
    RunError,
    RunFailure,
    RunPatch,
    RunRecord,
    RunStore,
    check_run_id,
    create_run,
    is_terminal_status,
    pipe_to_run_log,
    request_run_cancel,
    was_cancel_requested,
)
from boxwright.secrets import TOKEN_PREFIX, redact, resolve_all_secrets, run_bridge_token
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, LockStore, SandboxInstanceStore, hold_lock
from boxwright.takeover import RunClaim, align_to_stored_log, is_out_of_band, sandbox_run_driver
from boxwright.tool_bridge import HostToolBridge
from boxwright.tool_bridge.tools import Tool

from .agui import agui_routes
from .approvals import ApprovalAnswer, ApprovalDesk
from .delivery import json_response, long_poll_response, record_view, sse_response, websocket_tail

log = logging.getLogger("boxwright.middleware")
T = TypeVar("T")

STATE_KEY: Final = "boxwright"
MAX_TRIGGER_BODY: Final = 2 * 1024 * 1024
MAX_APPROVAL_BODY: Final = 4096
# How often a queued run looks whether its thread's active run, driven by another process, has ended.
QUEUE_POLL_S: Final = 0.5
ThreadRuns: TypeAlias = Literal["busy", "queue"]
# Where the harness's loop runs: the host drives it (default), or the runner in the container (Docker).
RunMode: TypeAlias = Literal["host-driven", "colocated"]
# What leaving ``async with service:`` (or the app's lifespan) does to the runs still going.
OnClose: TypeAlias = Literal["detach", "drain", "cancel"]
ON_CLOSE: Final = ("detach", "drain", "cancel")


# "Bearer " + a derived bridge token (TOKEN_PREFIX + an HMAC-SHA256 hex digest).
_DERIVED_BEARER: Final = f"Bearer {TOKEN_PREFIX}".encode()
_DERIVED_LEN: Final = len(_DERIVED_BEARER) + 64


class ServiceClosedError(RuntimeError):
    """The service is shutting down (or has shut down): it starts no run and takes none over (HTTP 503)."""


class RunRequestRefused(ValueError):
    """A run factory's refusal of a trigger the client can fix (an unknown profile name, ...): HTTP 400."""

    code = "invalid_request"


@dataclass(eq=False)
class _Driven:
    """One run this process drives, started here or taken over: its in-process cancel band and its task."""

    thread_id: str
    abort: AbortController = field(default_factory=AbortController)
    task: asyncio.Task[Any] | None = None  # set once started; its result is a RunRecord, or None
    takeover: bool = False
    # Resolved once this process's insert of the record returned (won or lost): who owns the id is known.
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    # A takeover's claim once its lease is taken (None while it waits out another driver's lease).
    claim_of: Callable[[], RunClaim | None] = lambda: None
    # Set as the drive ends if it ended by losing its claim: the run may be left with no driver at all.
    lapsed: RunClaim | None = None
    # A tail (or a bridge call) asked for this takeover while it was already under way: an attach probe
    # that started it must not withdraw it (that tail would wait for a driver nobody starts).
    wanted: bool = False


class RecordDurability:
    """``definition.RunDurability`` over one run's record: what a dropped driver consults.

    A recorded cancel means destroy; otherwise the detach is stamped (``detached_since``, the
    sandbox key) so a reaper or a successor can find the sandbox. A stamp that lands nowhere
    (no record) raises, so the sandbox is destroyed rather than leaked.

    Under a claim (``claim=`` or ``claim_of=``, or ``durability.claim = claim`` once claimed)
    the stamp is a compare-and-set at the claim's epoch: a driver another took the run over
    from gets ``RunClaimLostError`` (its claim latches) and stamps, destroys and removes nothing.
    """

    def __init__(
        self,
        runs: RunStore,
        run_id: str,
        *,
        claim: RunClaim | None = None,
        claim_of: Callable[[], RunClaim | None] | None = None,
    ) -> None:
        self._runs = runs
        self._run_id = run_id
        self.claim = claim
        self._claim_of = claim_of
        self.detached = False  # the verdict: set once the stamp landed

    def _claim(self) -> RunClaim | None:
        if self.claim is None and self._claim_of is not None:
            self.claim = self._claim_of()
        return self.claim

    @property
    def superseded(self) -> bool:
        """Whether another driver owns the run now (this driver's claim latched)."""
        claim = self._claim()
        return claim is not None and claim.superseded

    async def holds_run(self) -> bool:
        """Whether this driver still holds the run's epoch (unclaimed: yes; unreadable store: yes)."""
        claim = self._claim()
        if claim is None:
            return True
        if claim.superseded:
            return False
        try:
            record = await self._runs.get(self._run_id)
        except Exception:
            return True
        if record is not None and record.driver_epoch != claim.epoch:
            claim.latch(RunClaimLostError(self._run_id, claim.epoch, record.driver_epoch))
            return False
        return True

    async def cancel_requested(self) -> bool:
        return await was_cancel_requested(self._runs, self._run_id)

    async def stamp_detached(self, sandbox_key: str) -> None:
        claim = self._claim()
        patch = RunPatch(detached_since=now_ms(), sandbox_key=sandbox_key)
        if claim is None:
            written = await self._runs.update(self._run_id, patch)
        else:
            if claim.superseded:
                claim.check()
            try:
                written = await self._runs.update(self._run_id, patch, expected_epoch=claim.epoch)
            except EpochFencedError as exc:
                if isinstance(exc, RunClaimLostError):
                    raise claim.latch(exc) from None
                raise claim.latch(RunClaimLostError(self._run_id, claim.epoch, exc.stored_epoch)) from None
        if written is None:
            raise LookupError(f"run {self._run_id!r} has no record to stamp its detach on")
        self.detached = True


@dataclass(frozen=True)
class RunSpec:
    """What a run factory decides for one ``POST /runs``: where and how the agent runs."""

    sandbox: SandboxDefinition
    harness: Harness
    tools: Sequence[Tool] | None = None
    durable: bool = True
    # This run's file-event hooks (the seed's chat-middleware ``sandbox`` group).
    file_hooks: Sequence[RunFileHooks] = ()
    # The harness's own session to resume (the coordinator's ``metadata.sessionId``, R4).
    session_id: str | None = None
    # ``"colocated"``: the runner in the container drives the harness; a takeover attaches to it.
    mode: RunMode = "host-driven"
    # ``start_run(wrap=)`` for a triggered run.
    wrap: Callable[[AsyncIterator[Event], AbortController], AsyncIterator[Event]] | None = None
    # The profile names chosen (never their values), kept on the run record: a takeover's request
    # carries them back as ``metadata.sandbox`` / ``metadata.harness`` for the factory to rebuild the run.
    sandbox_profile: str | None = None
    harness_profile: str | None = None


@dataclass(frozen=True)
class AttachOutcome:
    """What ``attach`` did: ``driving`` (and the claim's epoch) or why it did not."""

    driving: bool
    reason: str | None = None
    epoch: int | None = None


# How long /attach waits for a run's lease before it says another live driver holds it.
ATTACH_WAIT_S: Final = 2.0
# How many times in a row this process adopts a run again whose claim it lost (its lease lapsed and
# nobody claimed the run since); past that the run is left to the sweep (of any replica).
MAX_READOPTS: Final = 3


class StartRunRequest(msgspec.Struct, rename="camel", kw_only=True):
    """The body of ``POST /runs``: a ``prompt``, or AG-UI ``messages`` (coordinator R1).

    ``metadata`` is the client's, for the run factory only: it is never stored (R4).
    """

    thread_id: str
    prompt: str = ""
    messages: list[Message] | None = None
    metadata: dict[str, Any] | None = None
    run_id: str | None = None

    def conversation(self) -> Sequence[Message] | str:
        """What the agent is given: the messages when sent, else the prompt."""
        return self.messages if self.messages else self.prompt


RunChoice: TypeAlias = RunSpec | tuple[SandboxDefinition, Harness]
RunFactory: TypeAlias = Callable[[StartRunRequest], RunChoice | Awaitable[RunChoice]]


class SandboxService:
    """Starts, tails and cancels agent runs for one app; one per process, shared by every request.

    ``factory`` serves ``POST /runs`` (``sandbox_routes``); ``store`` and ``locks`` are handed
    to ``run_agent`` for sandbox reuse (defaults: the process-wide ones). A thread has one
    active run at a time, since its runs share one sandbox: ``thread_runs="busy"`` (the default)
    refuses a second start with ``ThreadBusyError`` (HTTP 409 ``thread_busy``), ``"queue"``
    records it at once and starts its agent when the thread's active run has ended.

    Lifecycle: ``async with service:`` (or ``Starlette(lifespan=service.lifespan)``) owns every
    run this process drives in one TaskGroup, and on leaving does what ``on_close`` says to the
    runs still going: ``"detach"`` (the default) lets durable runs go on in their sandboxes (the
    record stays ``running``, the claim's lease is released, so another replica takes them over;
    a run that is not durable cannot outlive us and is aborted), ``"drain"`` waits for them to
    end, ``"cancel"`` cancels them. A service never entered drives its runs in tasks of the loop,
    held by the same registry; ``aclose()`` waits for them.
    """

    def __init__(
        self,
        runs: RunStore,
        log: EventLog,
        *,
        locks: LockStore | None = None,
        store: SandboxInstanceStore | None = None,
        factory: RunFactory | None = None,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        thread_runs: ThreadRuns = "busy",
        on_close: OnClose = "detach",
        bridge: HostToolBridge | None = None,
        approvals: ApprovalDesk | None = None,
        runner_secret: str | None = None,
        tool_exec: ToolExecHost | None = None,
    ) -> None:
        if thread_runs not in ("busy", "queue"):
            raise ValueError(f"thread_runs is 'busy' or 'queue', not {thread_runs!r}")
        if on_close not in ON_CLOSE:
            raise ValueError(f"on_close is 'detach', 'drain' or 'cancel', not {on_close!r}")
        self.on_close: OnClose = on_close
        self.runs = runs
        # One active run per thread: a second start is refused (busy) or waits for the first (queue).
        self.thread_runs = thread_runs
        self._thread_locks: dict[str, asyncio.Lock] = {}
        self.log = log
        self.factory = factory
        # How long a dead driver's claim blocks a successor; renewed every third of it while alive.
        self.lease_ttl_ms = lease_ttl_ms
        self._locks = locks
        self._store = store
        # One tool bridge every run of this service registers on (the coordinator mounts it on its
        # own origin); None: each run with tools starts a listener of its own.
        self.bridge = bridge
        if bridge is not None:
            # After a takeover the agent's calls come to the successor (the public origin): one that
            # arrives before the run is registered here waits for it (_expected_bridge_call).
            bridge.app.hold_unregistered(self._expected_bridge_call)
        # The questions (the policy's ``ask``) runs driven here wait on; POST /runs/{id}/approval answers them.
        self.approvals = approvals if approvals is not None else ApprovalDesk()
        # Co-located runs: the replicas' shared secret the runner token is derived from (boxwright.colocated).
        self._runner_secret = runner_secret
        # Co-located runs: where their host tools are served (the coordinator's /tool-exec); None: each
        # run's drive starts a listener of its own.
        self.tool_exec = tool_exec
        # The one registry: every run this process drives (started here or taken over), by id.
        self._here: dict[str, _Driven] = {}
        self._group: asyncio.TaskGroup | None = None  # set between __aenter__ and __aexit__
        self._closing = False
        # Runs adopted again after a lost claim, and how many times in a row (bounded: MAX_READOPTS).
        self._readopted: dict[str, int] = {}
        # The tasks that adopt a run again, held until they end (a service never entered has no group).
        self._readopting: set[asyncio.Task[None]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> SandboxService:
        if self._group is not None:
            raise RuntimeError("this SandboxService is entered already: enter it once (its app's lifespan)")
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group, self._closing = group, False
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        group = self._group
        self._closing = True  # from now on nothing starts: the group is about to end
        try:
            await self._close(self.on_close)
        except BaseException:
            # Interrupted (the lifespan cancelled): the group cancels what is left, and awaits it.
            exc_info = sys.exc_info()
            raise
        finally:
            self._group = None
            if group is not None:
                await group.__aexit__(*exc_info)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[dict[str, Any]]:
        """A Starlette/FastAPI lifespan: ``Starlette(routes=..., lifespan=service.lifespan)``.

        The service is entered for the app's life and ``request.state.boxwright`` is the service
        (the lifespan state), with or without ``SandboxMiddleware``.
        """
        async with self:
            yield {STATE_KEY: self}

    def stop_accepting(self) -> None:
        """Refuse new runs and takeovers from now on (503) while the runs going here drain."""
        self._closing = True

    def _spawn(self, work: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T | None]:
        """A run's task, its errors logged (``_contained``): one run's failure ends no other."""
        return self._task(_contained(work, name), name)

    def _task(self, work: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """A child of the service's TaskGroup when entered, else a loop task the registry holds."""
        if self._closing:
            work.close()
            raise ServiceClosedError("the service is shutting down: it starts no run")
        if self._group is not None:
            return self._group.create_task(work, name=name)
        return asyncio.get_running_loop().create_task(work, name=name)

    async def _close(self, mode: OnClose) -> None:
        if mode == "cancel":
            for run_id in list(self._here):
                try:
                    await self.cancel_run(run_id)
                except Exception as exc:
                    log.error("run %r: could not cancel it at shutdown: %s", run_id, exc)
        elif mode == "detach":
            for entry in list(self._here.values()):
                # A cancelled drive is not a cancelled run: a durable one detaches (its record stays
                # running, its log open, its lease is released, its sandbox kept); one that is not
                # durable cannot outlive us and ends aborted. Awaited below.
                if entry.task is not None:
                    entry.task.cancel()
        # Until none is left: a queued run may start while its predecessor ends.
        while pending := [e.task for e in self._here.values() if e.task is not None and not e.task.done()]:
            await asyncio.wait(pending)

    async def start_run(
        self,
        sandbox: SandboxDefinition,
        harness: Harness,
        messages: Sequence[Message] | str,
        *,
        thread_id: str,
        run_id: str | None = None,
        tools: Sequence[Tool] | None = None,
        durable: bool = True,
        file_hooks: Sequence[RunFileHooks] = (),
        session_id: str | None = None,
        mode: RunMode = "host-driven",
        wrap: Callable[[AsyncIterator[Event], AbortController], AsyncIterator[Event]] | None = None,
        sandbox_profile: str | None = None,
        harness_profile: str | None = None,
    ) -> str:
        """Record the run and start driving it in the background; returns its id at once.

        ``durable`` journals the agent in its sandbox (it outlives this process) and lets a
        dropped driver detach instead of destroying. A run id that already has a record starts
        nothing (a retried trigger); one of another thread raises ``RunThreadMismatchError``,
        also when both requests come at once (the record's insert is atomic: one of them wins).
        ``wrap(events, abort)`` sees the agent's events before the log does, with the run's own
        cancel band (the AG-UI route ends a turn there when the agent calls a frontend tool).
        ``sandbox_profile`` / ``harness_profile``: the names the factory chose, stored on the record
        (names only) so a takeover rebuilds the run with them (``metadata.sandbox`` / ``.harness``).
        """
        run_id = check_run_id(run_id or uuid.uuid4().hex)
        check_thread_id(thread_id)
        lock = self._thread_locks.setdefault(thread_id, asyncio.Lock())
        # Serialised per thread: two starts racing must not both find the thread idle.
        async with lock:
            existing = await self.runs.get(run_id)
            if existing is not None:
                if existing.thread_id != thread_id:
                    raise RunThreadMismatchError(run_id, thread_id, existing.thread_id)
                return run_id
            active = await self.runs.find_active_run(thread_id)
            if active is not None and self.thread_runs == "busy":
                raise ThreadBusyError(thread_id, active.run_id)
            here = self._here.get(run_id)
            if here is not None:
                # Being started by a request of this process right now: once its insert returned, the
                # record says whose run it is (that request may have lost to another process).
                await here.recorded.wait()
                owner = await self.runs.get(run_id)
                owner_thread = owner.thread_id if owner is not None else here.thread_id
                if owner_thread != thread_id:
                    raise RunThreadMismatchError(run_id, thread_id, owner_thread)
                return run_id
            if self._closing:
                raise ServiceClosedError("the service is shutting down: it starts no run")
            try:
                # Stored with the record: a successor starts the agent from it if this process dies first.
                stored_input = encode_run_input(messages, limit=MAX_TRIGGER_BODY, secrets=_run_secrets(sandbox))
            except RunInputTooLargeError as exc:
                raise RunRequestRefused(str(exc)) from None
            entry = _Driven(thread_id)
            self._here[run_id] = entry  # registered before the next await: one drive per id here
            abort = entry.abort
            try:
                # The record exists before any provisioning, so a cancel or a tail finds the run at once.
                # An atomic insert: of requests racing for one id (other threads, other processes), one wins.
                await create_run(self.runs, run_id, thread_id)
                # Before the drive starts (and so before any claim a successor could take over).
                await self.runs.update(
                    run_id,
                    RunPatch(
                        sandbox_profile=sandbox_profile, harness_profile=harness_profile, input_messages=stored_input
                    ),
                )
            except RunExistsError as exc:
                self._unregister(run_id, entry)
                if exc.thread_id != thread_id:
                    raise RunThreadMismatchError(run_id, thread_id, exc.thread_id) from None
                return run_id  # this thread's retry, recorded meanwhile by another process
            except BaseException:
                self._unregister(run_id, entry)
                raise
            finally:
                entry.recorded.set()
        if not lock.locked() and self._thread_locks.get(thread_id) is lock:
            del self._thread_locks[thread_id]
        durability = RecordDurability(self.runs, run_id) if durable else None
        # Removed by this driver once the terminal record is written, never at the agent's exit.
        cleanup = JournalCleanup() if durable else None
        events = run_agent(
            sandbox,
            harness,
            messages,
            thread_id=thread_id,
            run_id=run_id,
            tools=tools,
            bridge=self.bridge,
            signal=abort.signal,
            store=self._store,
            locks=self._locks,
            lock_ttl_ms=self.lease_ttl_ms,
            session_id=session_id,
            journal=JournalOptions(cleanup=cleanup) if durable else None,
            durability=durability,
            file_hooks=file_hooks,
            mode=mode,
            runner_secret=self._runner_secret,
            tool_exec=self.tool_exec,
        )
        events = _failing_as_told(events, abort.signal)
        if wrap is not None:
            events = wrap(events, abort)
        if active is not None:
            events = self._after(active.run_id, abort.signal, events)
        detached = (lambda: durability.detached) if durability is not None else None
        claimed: asyncio.Event | None = None
        try:
            if durability is not None and self._locks is not None and self._locks.durable:
                # Several replicas share this store: drive under the run's claim (epoch 1), so a
                # successor that takes the run over fences out anything this driver still writes.
                claimed = asyncio.Event()
                work = self._drive_claimed(
                    events, run_id, thread_id, abort, detached, durability, cleanup, claimed, entry
                )
                entry.task = self._spawn(work, f"boxwright run {run_id!r}")
            else:
                piped = pipe_to_run_log(
                    events,
                    self.runs,
                    self.log,
                    run_id,
                    thread_id,
                    abort.signal,
                    detached=detached,
                    after_terminal=cleanup,
                )
                # pipe_to_run_log never raises: no containment needed.
                entry.task = self._task(piped, f"boxwright run {run_id!r}")
        except ServiceClosedError:
            self._unregister(run_id, entry)
            raise
        entry.task.add_done_callback(functools.partial(self._forget, run_id, entry))
        if claimed is not None:
            # Answered once this driver holds the run (epoch 1): a successor then never claims a run
            # whose first driver is alive and about to start its agent (the agent would start twice).
            waiter = asyncio.ensure_future(claimed.wait())
            try:
                await asyncio.wait({waiter, entry.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        return run_id

    async def _drive_claimed(
        self,
        events: AsyncIterator[Event],
        run_id: str,
        thread_id: str,
        abort: AbortController,
        detached: Callable[[], bool] | None,
        durability: RecordDurability | None = None,
        cleanup: JournalCleanup | None = None,
        claimed: asyncio.Event | None = None,
        entry: _Driven | None = None,
    ) -> RunRecord:
        assert self._locks is not None
        # A fresh run has no predecessor to wait out: no quiet window.
        driver = sandbox_run_driver(
            self.runs, self._locks, self.log, _no_replay, fence_quiet_ms=0, lease_ttl_ms=self.lease_ttl_ms
        )
        try:
            async with driver.claim(run_id) as claim:
                if durability is not None:
                    durability.claim = claim  # its detach stamp is fenced at this epoch from now on
                if claimed is not None:
                    claimed.set()
                # A lost claim stops the agent's drive; so does a cancel recorded by any process.
                claim.signal.add_listener(lambda reason: abort.abort(reason))
                claim.cancel_signal.add_listener(lambda _reason: abort.abort(RUN_CANCEL_REASON))
                try:
                    return await driver.pipe(
                        events, run_id, thread_id, detached=detached, claim=claim, after_terminal=cleanup
                    )
                finally:
                    if entry is not None and claim.lost:
                        entry.lapsed = claim
        except Exception as exc:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
            log.error("run %r: could not be driven under its claim: %s", run_id, exc)
            record = await self.runs.get(run_id)
            if record is None:
                raise
            return record

    async def _after(self, previous: str, signal: AbortSignal, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        """``events``, once run ``previous`` (the thread's active run) has ended: a thread's queue."""
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            while not signal.aborted:
                entry = self._here.get(previous)
                if entry is not None and entry.task is not None:
                    # Driven here: its end is an event to wait for, not something to poll.
                    await wait_unless_aborted(asyncio.wait({entry.task}), signal)
                    continue
                record = await self.runs.get(previous)
                if record is None or is_terminal_status(record.status):
                    break
                await asyncio.sleep(QUEUE_POLL_S)
            if signal.aborted:
                return  # cancelled while queued: nothing started; the pump records the abort
            async for event in events:
                yield event

    def _forget(self, run_id: str, entry: _Driven, _task: object) -> None:
        self._unregister(run_id, entry)
        if entry.lapsed is None:
            self._readopted.pop(run_id, None)
        elif not self._closing:
            # Its drive ended by losing the claim: unless another driver holds the run now, nobody
            # drives it, and a client tailing it here would wait for ever (no tail comes to start one).
            try:
                task = self._task(self._adopt_again(run_id, entry.lapsed), f"boxwright re-adopt {run_id!r}")
            except ServiceClosedError:
                return
            self._readopting.add(task)
            task.add_done_callback(self._readopting.discard)

    async def _adopt_again(self, run_id: str, lost: RunClaim) -> None:
        """Adopt ``run_id`` again after this process lost its claim at ``lost.epoch``; never raises.

        Only a run still running, not cancel-requested and still at the lost claim's epoch (nobody
        claimed it since: its lease lapsed, a stalled loop or a store that did not answer in time)
        is adopted, through the one takeover path (the claim waits for a lease another holds).
        """
        try:
            record = await self.runs.get(run_id)
            if record is None or record.status != "running" or record.cancel_requested is True:
                return
            if record.driver_epoch != lost.epoch:
                return  # another driver claimed it since: that one drives it
            count = self._readopted.get(run_id, 0)
            if count >= MAX_READOPTS:
                log.warning(
                    "run %r: lost its claim %d times in a row here; left to the sweep (of any replica)", run_id, count
                )
                self._readopted.pop(run_id, None)
                return
            self._readopted[run_id] = count + 1
            log.warning(
                "run %r: its claim at driver epoch %d was lost and nobody claimed the run since; adopting it again",
                run_id,
                lost.epoch,
            )
            await self.take_over_if_orphaned(run_id)
        except Exception as exc:
            log.warning("run %r: could not adopt it again: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))

    def _unregister(self, run_id: str, entry: _Driven) -> None:
        if self._here.get(run_id) is entry:
            del self._here[run_id]

    @property
    def active_runs(self) -> list[str]:
        """Ids of the runs this process is driving now (started here or taken over)."""
        return list(self._here)

    @property
    def driving_runs(self) -> list[str]:
        """``active_runs`` but takeovers still waiting for another live driver's lease (not driven here yet)."""
        return [run_id for run_id, entry in self._here.items() if not entry.takeover or entry.claim_of() is not None]

    async def fail_run(self, run_id: str, error: RunError, *, settle_s: float = 30.0) -> RunRecord | None:
        """Stop ``run_id``, driven here, as a cancel does (its sandbox destroyed) and end it ``failed`` with ``error``.

        The driver writes the one final status (``failed``, never ``aborted`` first); the cancel is
        recorded after it ended, since a flag its claim's watcher saw earlier would end it as a plain
        cancel. A driver that has not ended in ``settle_s`` seconds gets the failure written for it, at
        its epoch. Returns the record; a run not driven here is left alone (its own driver watches it).
        """
        entry = self._here.get(run_id)
        if entry is None or entry.task is None:
            return await self.runs.get(run_id)
        entry.abort.abort(RunFailure(error))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settle_s):
                await asyncio.wait({entry.task})
        current = await self.runs.get(run_id)
        if current is None:
            return None
        if not is_terminal_status(current.status):
            claim = entry.claim_of() if entry.takeover else None
            epoch = claim.epoch if claim is not None else current.driver_epoch
            log.warning("run %r: its driver did not end in %.0f s; recording its failure for it", run_id, settle_s)
            with contextlib.suppress(EpochFencedError):
                current = (
                    await self.runs.update(
                        run_id, RunPatch(status="failed", error=error, finished_at=now_ms()), expected_epoch=epoch
                    )
                    or current
                )
        return await request_run_cancel(self.runs, run_id) or current

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        """Stop ``run_id`` for good: record the cancel, abort it here if it runs here.

        The sandbox is destroyed (the abort reason is the cancel reason, and the record says
        so for a driver elsewhere). Returns the record (``None`` for an unknown run); a
        terminal run is left as it is.
        """
        record = await self.runs.get(check_run_id(run_id))
        if record is None or is_terminal_status(record.status):
            return record
        # Durable band first: a driver on another host only ever sees this one.
        record = await request_run_cancel(self.runs, run_id) or record
        entry = self._here.get(run_id)
        if entry is not None:
            entry.abort.abort(RUN_CANCEL_REASON)
        return record

    async def wait_run(self, run_id: str) -> RunRecord | None:
        """The final record of a run driven here once it ends; the stored record otherwise."""
        entry = self._here.get(run_id)
        if entry is not None and entry.task is not None:
            await asyncio.wait({entry.task})  # never cancels the run's task, whoever cancels us
            result = None if entry.task.cancelled() else entry.task.result()
            if isinstance(result, RunRecord):
                return result
        return await self.runs.get(run_id)

    async def events_response(self, run_id: str, request: Request) -> Response:
        """SSE tail of ``run_id`` from the request's ``Last-Event-ID`` / ``?offset=``.

        A client coming back for a run whose driver died is also the moment to take it over.
        """
        await self._before_tail(run_id)
        return await sse_response(self.log, self.runs, run_id, request)

    async def _before_tail(self, run_id: str) -> None:
        """What every tail route (SSE, long-poll, WebSocket) does first: adopt the run if it is orphaned."""
        try:
            await self.take_over_if_orphaned(run_id)
        except Exception as exc:  # the tail still serves what is stored; the next one tries again
            log.warning("run %r: could not take it over: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))

    async def take_over_if_orphaned(self, run_id: str) -> bool:
        """Start driving a running durable run that nobody here drives, from its journal.

        Needs the factory (it rebuilds the sandbox and harness for the record's thread) and a
        lock store that spans processes: the claim then waits out a live driver elsewhere and
        fences a dead one. Returns whether a takeover was started; the claim may still refuse.
        """
        if self.factory is None or self._locks is None or not self._locks.durable:
            return False
        if (here := self._here.get(run_id)) is not None:
            here.wanted = True
            return False
        if self._closing:
            return False
        # Registered before the first await: tails arriving together start one takeover, not one each.
        entry = _Driven("", takeover=True)
        entry.recorded.set()  # its record exists: that is why it is taken over
        self._here[run_id] = entry
        try:
            try:
                record = await self.runs.get(check_run_id(run_id))
            except Exception:
                record = None  # an id no run can have, or an unreadable store: nothing to take over
            if record is None or record.status != "running":
                self._unregister(run_id, entry)
                return False
            entry.thread_id = record.thread_id
            # The profiles the run was started with (names from its record): R4 keeps metadata unstored.
            chosen = {"sandbox": record.sandbox_profile, "harness": record.harness_profile}
            metadata = {k: v for k, v in chosen.items() if v is not None} or None
            spec = await _spec_for(
                self,
                StartRunRequest(prompt=RESUMED_PROMPT, thread_id=record.thread_id, run_id=run_id, metadata=metadata),
            )
        except BaseException:
            self._unregister(run_id, entry)
            raise
        locks = self._locks
        # A run whose first driver died before its agent started has nothing to attach to (no journal; or
        # co-located: no runner, or a runner without the run): the successor starts it from the stored input.
        fresh = None
        if record.input_messages is not None:
            try:
                fresh = decode_run_input(record.input_messages)
            except msgspec.DecodeError as exc:
                log.warning("run %r: its stored input is unreadable (%s); it is replayed only", run_id, exc)
        # The successor, once its terminal record landed, removes the journal it replayed.
        cleanup = JournalCleanup()

        def replay(rid: str, tid: str, signal: AbortSignal) -> AsyncIterator[Event]:
            async def stored() -> list[Event]:
                return await self.log.snapshot(rid)

            # The claim's signal, and this process's cancel band (cancel_run reaches a takeover too).
            stop = AbortSignal.any([signal, entry.abort.signal])
            durability = RecordDurability(self.runs, rid, claim_of=lambda: driver.held_claim(rid))
            sandbox_ctx = EnsureContext(
                thread_id=tid,
                run_id=rid,
                store=self._store,
                locks=locks,
                adapter_name=spec.harness.name,
                lock_ttl_ms=self.lease_ttl_ms,
            )
            events = run_agent(
                spec.sandbox,
                spec.harness,
                RESUMED_PROMPT,
                thread_id=tid,
                run_id=rid,
                tools=spec.tools,
                bridge=self.bridge,
                session_id=spec.session_id,
                signal=stop,
                store=self._store,
                locks=locks,
                lock_ttl_ms=self.lease_ttl_ms,
                # The stored log also tells the successor's watcher which file events it holds.
                journal=JournalOptions(attach=True, runs=self.runs, cleanup=cleanup, logged=stored, fresh=fresh),
                durability=durability,
                file_hooks=spec.file_hooks,
                # Co-located: the successor attaches to the runner's run instead of re-reading a journal.
                mode=spec.mode,
                runner_secret=self._runner_secret,
                tool_exec=self.tool_exec,
            )
            aligned = _failing_as_told(
                align_to_stored_log(events, stored, out_of_band=is_out_of_band), entry.abort.signal
            )
            return _EndingSandboxOnStop(
                aligned, stop, functools.partial(_end_stopped_sandbox, spec.sandbox, sandbox_ctx, durability, locks)
            )

        driver = sandbox_run_driver(
            self.runs, locks, self.log, replay, lease_ttl_ms=self.lease_ttl_ms, after_terminal=cleanup
        )
        entry.claim_of = lambda: driver.held_claim(run_id)

        async def adopt() -> bool:
            try:
                return await driver.resume(run_id, stop=entry.abort.signal)
            finally:
                # A claim taken and lost (its lease, mid-drive or before the first append): _forget adopts again.
                claim = driver.last_claim(run_id)
                if claim is not None and claim.lost:
                    entry.lapsed = claim

        try:
            entry.task = self._spawn(adopt(), f"boxwright takeover {run_id!r}")
        except ServiceClosedError:
            self._unregister(run_id, entry)
            return False
        entry.task.add_done_callback(functools.partial(self._forget, run_id, entry))
        return True

    async def _expected_bridge_call(self, run_id: str, authorization: bytes) -> Callable[[], bool] | None:
        """A tool-bridge call for a run not registered here: is it that run's agent, and is the run coming?

        Only a call bearing the run's derived token (``run_bridge_token`` under the replicas' secret) is
        vouched for: it is the agent of a running run whose driver went away, so the run is taken over
        here (if nobody here drives it yet), and the call waits while that drive is on its way (the
        claim may still refuse it: a live driver elsewhere). Anything else: ``None``, a 404 at once.
        """
        secret = shared_secret(self._runner_secret)
        # A cheap shape check first: no store read for a call that cannot carry a derived token.
        if not secret or not authorization.startswith(_DERIVED_BEARER) or len(authorization) != _DERIVED_LEN:
            return None
        try:
            record = await self.runs.get(run_id)
        except Exception:
            return None
        if record is None or record.status != "running":
            return None
        expected = f"Bearer {run_bridge_token(secret, run_id, record.thread_id)}".encode()
        if not hmac.compare_digest(authorization, expected):
            return None
        try:
            await self.take_over_if_orphaned(run_id)
        except Exception as exc:  # as for a tail: the next call (or tail) tries again
            log.warning("run %r: could not take it over: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))
            return None
        return lambda: run_id in self._here and not self._closing

    async def attach(self, run_id: str, *, wait_s: float = ATTACH_WAIT_S) -> AttachOutcome:
        """``POST /runs/{id}/attach``: adopt ``run_id`` if nobody drives it (R28, R40); never raises.

        A run that is unknown, terminal, cancel-requested or driven here is not driven again; one
        whose lease another live driver holds past ``wait_s`` is left to it (the waiting takeover
        is withdrawn, so the answer stays true). The log is never touched here.
        """
        record = await self.runs.get(check_run_id(run_id))
        if record is None:
            return AttachOutcome(False, reason="unknown-run")
        if is_terminal_status(record.status):
            return AttachOutcome(False, reason="terminal")
        if record.cancel_requested is True:
            return AttachOutcome(False, reason="cancel-requested")
        if run_id in self._here:
            return AttachOutcome(False, reason="driven-here", epoch=record.driver_epoch)
        try:
            started = await self.take_over_if_orphaned(run_id)
        except Exception as exc:
            log.warning("run %r: attach could not take it over: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))
            return AttachOutcome(False, reason="takeover-failed")
        entry = self._here.get(run_id)
        if not started or entry is None or entry.task is None:
            return AttachOutcome(False, reason="not-adoptable")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        # The claim is taken inside the takeover driver, which signals nothing: a short poll, bounded.
        while (claim := entry.claim_of()) is None and not entry.task.done() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if claim is not None:
            return AttachOutcome(True, epoch=claim.epoch)
        if not entry.task.done() and not entry.wanted:
            entry.task.cancel()  # still waiting for a live lease: nothing was claimed, nothing written
            await asyncio.wait({entry.task})
            claim = entry.claim_of()
            if claim is not None:  # claimed as it was withdrawn: detached again, another attach adopts it
                return AttachOutcome(False, reason="withdrawn", epoch=claim.epoch)
        return AttachOutcome(False, reason="lease-held")

    async def poll_response(self, run_id: str, request: Request) -> Response:
        """Long-poll page of ``run_id`` after ``?offset=``; an orphaned run is taken over first, as for SSE."""
        await self._before_tail(run_id)
        return await long_poll_response(self.log, self.runs, run_id, request)

    async def websocket(self, websocket: WebSocket, run_id: str, *, seq_frames: bool = False) -> None:
        """WebSocket tail of ``run_id`` (``delivery.websocket_tail``); an orphaned run is taken over first."""
        await self._before_tail(run_id)
        await websocket_tail(websocket, self.log, self.runs, run_id, seq_frames=seq_frames)

    async def aclose(self, *, cancel: bool = False) -> None:
        """Wait for every run driven here to end; ``cancel=True`` cancels them first. Never raises.

        The explicit form of ``on_close="drain"`` / ``"cancel"`` for a service never entered.
        """
        await self._close("cancel" if cancel else "drain")

    drain = aclose


class SandboxMiddleware:
    """Pure ASGI middleware: ``request.state.boxwright`` (and ``websocket.state``) is the service."""

    def __init__(self, app: ASGIApp, service: SandboxService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            # A new dict: the server may share the lifespan state between requests.
            scope = {**scope, "state": {**scope.get("state", {}), STATE_KEY: self.service}}
        await self.app(scope, receive, send)


# -- routes ---------------------------------------------------------------------------------------


def _error(status: int, message: str, code: str) -> Response:
    return json_response(status, {"error": message, "code": code})


async def _spec_for(service: SandboxService, body: StartRunRequest) -> RunSpec:
    assert service.factory is not None
    made: Any = service.factory(body)
    if inspect.isawaitable(made):
        made = await made
    if isinstance(made, RunSpec):
        return made
    sandbox, harness = made
    return RunSpec(sandbox=sandbox, harness=harness)


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    # Read by chunks: a client must not make us buffer an arbitrarily large body to refuse it.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


# Bounded in depth: msgspec skips an unknown field's value recursively, so 100k levels of ``[`` there
# were a RecursionError (a 500) rather than a 400.
_trigger_decoder = BoundedDecoder(StartRunRequest)


def _decode_trigger(request: Request, raw: bytes) -> StartRunRequest | Response:
    try:
        body = _trigger_decoder.decode(raw)
    except JsonBoundsError as exc:
        return _error(400, f"body must be valid JSON: {exc}", "invalid_body")
    except msgspec.ValidationError as exc:
        return _error(400, f"invalid body: {exc}", "invalid_body")
    except msgspec.DecodeError:
        return _error(400, "body must be valid JSON", "invalid_body")
    if body.messages is not None and not body.messages:
        return _error(400, "messages must be a non-empty list of message objects", "invalid_body")
    if body.messages is None and not body.prompt.strip():
        return _error(400, "prompt must be a non-empty string (or send messages)", "invalid_body")
    header = request.headers.get("x-run-id")
    run_id = header or body.run_id
    try:
        check_thread_id(body.thread_id)
    except InvalidThreadIdError as exc:
        return _error(400, f"invalid threadId: {exc}", exc.code)
    try:
        if run_id is not None:
            # What a client may choose: it lands in URLs, headers and logs (coordinator R37).
            check_client_run_id(run_id)
    except InvalidRunIdError as exc:
        return _error(400, f"invalid {'X-Run-Id' if header else 'runId'}: {exc}", exc.code)
    return msgspec.structs.replace(body, run_id=run_id)


def _refuse_run_id(run_id: str) -> Response | None:
    """400 ``invalid_run_id`` for a path id no run can have (``..``, ``%00``, over 200 characters, ...)."""
    try:
        check_run_id(run_id)
    except InvalidRunIdError as exc:
        return _error(400, str(exc), exc.code)
    return None


def _lost_upgrade(request: Request) -> bool:
    """A WebSocket client's handshake arrived as plain HTTP (a proxy dropped its ``Upgrade``, or mangled it).

    Not any ``Upgrade``: ``curl --http2`` asks every plain request for ``h2c``.
    """
    headers = request.headers
    asked = "websocket" in headers.get("upgrade", "").lower()
    return asked or "sec-websocket-key" in headers or "sec-websocket-version" in headers


def sandbox_routes(service: SandboxService) -> list[BaseRoute]:
    """Routes over ``service``: ``POST /runs``, ``GET /runs/{id}``, ``GET /runs/{id}/events`` (SSE),
    ``GET /runs/{id}/poll`` (long-poll), ``WS /runs/{id}/ws`` (and ``/stream``), ``POST /runs/{id}/cancel``,
    ``POST /runs/{id}/attach``, ``GET /threads/{t}/active``, ``POST /threads/{t}/cancel``.

    Mount them behind the app's own authentication: they authorize nothing themselves.
    """

    async def trigger(request: Request) -> Response:
        if service.factory is None:
            return _error(501, "this service was given no run factory", "no_factory")
        raw = await _bounded_body(request, MAX_TRIGGER_BODY)
        if raw is None:
            return _error(413, "body over 2 MiB", "too_large")
        body = _decode_trigger(request, raw)
        if isinstance(body, Response):
            return body
        try:
            spec = await _spec_for(service, body)
            run_id = await service.start_run(
                spec.sandbox,
                spec.harness,
                body.conversation(),
                thread_id=body.thread_id,
                run_id=body.run_id,
                tools=spec.tools,
                durable=spec.durable,
                file_hooks=spec.file_hooks,
                session_id=spec.session_id,
                mode=spec.mode,
                wrap=spec.wrap,
                sandbox_profile=spec.sandbox_profile,
                harness_profile=spec.harness_profile,
            )
        except RunThreadMismatchError as exc:
            # Named, so the client that lost a race for its run id knows whose run it is.
            return json_response(
                409, {"error": str(exc), "code": "thread_mismatch", "ownerThreadId": exc.existing_thread_id}
            )
        except ServiceClosedError as exc:
            return _error(503, str(exc), "service_closed")
        except ThreadBusyError as exc:
            return json_response(409, {"error": str(exc), "code": "thread_busy", "activeRunId": exc.active_run_id})
        except (InvalidRunIdError, InvalidThreadIdError, RunRequestRefused) as exc:
            return _error(400, str(exc), exc.code)
        except Exception as exc:
            log.error("could not start a run: %s", redact(f"{type(exc).__name__}: {exc}"))
            return _error(500, "could not start the run", "start_failed")
        return json_response(202, {"runId": run_id})

    async def record(request: Request) -> Response:
        refused = _refuse_run_id(request.path_params["run_id"])
        if refused is not None:
            return refused
        run_id = request.path_params["run_id"]
        # ``lastSeq`` (R5) is the log's, not the record's: a client resumes a WebSocket from it.
        try:
            view = await record_view(service.runs, service.log, run_id)
        except Exception as exc:
            log.error("run %r: could not read it: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))
            return _error(503, "the run could not be read", "store_unavailable")
        if view is None:
            return _error(404, "unknown run", "unknown_run")
        return json_response(200, view)

    async def events(request: Request) -> Response:
        return await service.events_response(request.path_params["run_id"], request)

    async def poll(request: Request) -> Response:
        return await service.poll_response(request.path_params["run_id"], request)

    async def tail(websocket: WebSocket) -> None:
        await service.websocket(websocket, websocket.path_params["run_id"])

    async def seq_tail(websocket: WebSocket) -> None:
        await service.websocket(websocket, websocket.path_params["run_id"], seq_frames=True)

    # The run log as a read-only Durable Streams stream (boxwright.streams.runlog owns the protocol).
    from boxwright.streams.runlog import RunStreams

    run_streams = RunStreams(service.runs, service.log)

    async def stream(request: Request) -> Response:
        if _lost_upgrade(request):
            # A WebSocket handshake whose Upgrade a proxy dropped reached us as plain HTTP: a Durable
            # Streams answer would look like success to a client that can never parse it.
            body = {"error": "expected websocket upgrade", "code": "upgrade_required"}
            return json_response(426, body, headers={"Upgrade": "websocket"})
        if request.method == "GET":
            await service._before_tail(request.path_params["run_id"])  # a tail like the others
        return await run_streams.response(request, request.path_params["run_id"])

    async def cancel(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        refused = _refuse_run_id(run_id)
        if refused is not None:
            return refused
        before = await service.runs.get(run_id)
        if before is None:
            return _error(404, "unknown run", "unknown_run")
        if is_terminal_status(before.status):
            # What the record says: a cancelled run that ended stays cancel-requested.
            requested = before.cancel_requested is True
            return json_response(200, {"runId": run_id, "status": before.status, "cancelRequested": requested})
        after = await service.cancel_run(run_id)
        requested = after is None or after.cancel_requested is True
        return json_response(202, {"runId": run_id, "cancelRequested": requested})

    async def approval(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        refused = _refuse_run_id(run_id)
        if refused is not None:
            return refused
        raw = await _bounded_body(request, MAX_APPROVAL_BODY)
        if raw is None:
            return _error(413, "an approval answer is at most 4 KiB", "too_large")
        try:
            answer = msgspec.json.decode(raw, type=ApprovalAnswer)
        except msgspec.DecodeError as exc:
            shape = '{"approvalId": str, "decision": "allow" | "deny"}'
            return _error(400, f"body must be {shape}: {exc}", "invalid_body")
        if await service.runs.get(run_id) is None:
            return _error(404, "unknown run", "unknown_run")
        if not service.approvals.answer(run_id, answer.approval_id, answer.decision == "allow"):
            # Answered already, timed out, or asked on another replica (the desk is per process).
            message = f"run {run_id!r} is not waiting on approval {answer.approval_id!r} here"
            return _error(404, message, "no_pending_approval")
        return json_response(200, {"runId": run_id, "approvalId": answer.approval_id, "decision": answer.decision})

    async def attach(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        refused = _refuse_run_id(run_id)
        if refused is not None:
            return refused
        outcome = await service.attach(run_id)
        if outcome.reason == "unknown-run":
            return _error(404, "unknown run", "unknown_run")
        if outcome.driving:
            return json_response(202, {"driving": True, "epoch": outcome.epoch})
        return json_response(200, {"driving": False, "reason": outcome.reason})

    def _thread(request: Request) -> str | Response:
        thread_id = request.path_params["thread_id"]
        try:
            return check_thread_id(thread_id)
        except InvalidThreadIdError as exc:
            return _error(400, f"invalid thread id: {exc}", exc.code)

    async def thread_active(request: Request) -> Response:
        thread_id = _thread(request)
        if isinstance(thread_id, Response):
            return thread_id
        active = await service.runs.find_active_run(thread_id)
        return json_response(200, {"runId": active.run_id if active is not None else None})

    async def thread_cancel(request: Request) -> Response:
        thread_id = _thread(request)
        if isinstance(thread_id, Response):
            return thread_id
        active = await service.runs.find_active_run(thread_id)
        if active is None:
            return Response(status_code=204)
        after = await service.cancel_run(active.run_id)
        requested = after is None or after.cancel_requested is True
        return json_response(202, {"runId": active.run_id, "cancelRequested": requested})

    return [
        Route("/runs", trigger, methods=["POST"]),
        Route("/runs/{run_id}", record, methods=["GET"]),
        Route("/runs/{run_id}/events", events, methods=["GET"]),
        Route("/runs/{run_id}/poll", poll, methods=["GET"]),
        WebSocketRoute("/runs/{run_id}/ws", tail),
        # One path, two protocols: a WebSocket upgrade tails the run (coordinator R12), HTTP is Durable Streams.
        WebSocketRoute("/runs/{run_id}/stream", seq_tail),
        Route("/runs/{run_id}/stream", stream, methods=["GET", "HEAD", "PUT", "POST", "DELETE"]),
        Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        # The standard AG-UI endpoint (boxwright.middleware.agui): POST a RunAgentInput, read the run.
        *agui_routes(service, spec_for=_spec_for, bounded_body=_bounded_body),
        Route("/runs/{run_id}/approval", approval, methods=["POST"]),
        Route("/runs/{run_id}/attach", attach, methods=["POST"]),
        Route("/threads/{thread_id}/active", thread_active, methods=["GET"]),
        Route("/threads/{thread_id}/cancel", thread_cancel, methods=["POST"]),
    ]


__all__ = [
    "AttachOutcome",
    "OnClose",
    "RecordDurability",
    "RunChoice",
    "RunFactory",
    "RunRequestRefused",
    "RunSpec",
    "SandboxMiddleware",
    "SandboxService",
    "ServiceClosedError",
    "StartRunRequest",
    "sandbox_routes",
]


# run_agent wants a trailing user message; a takeover starts nothing, it re-reads the journal.
RESUMED_PROMPT = "(resumed from the run journal)"


def _no_replay(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[Event]:
    raise RuntimeError(f"run {run_id!r}: this driver starts runs; taking one over needs a replaying drive")


async def _failing_as_told(events: AsyncIterator[Event], signal: AbortSignal) -> AsyncIterator[Event]:
    """``events``, the agent's report of its own abort (a RUN_ERROR coded cancelled or aborted) restated
    as the failure the abort reason carries (``RunFailure``, ``fail_run``), so the log and the record
    say why the run was stopped, and its status is written once."""
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        async for event in events:
            reason = signal.reason if signal.aborted else None
            if isinstance(reason, RunFailure) and isinstance(event, RunErrorEvent) and event.code in ABORT_ERROR_CODES:
                event = msgspec.structs.replace(event, message=reason.error.message, code=reason.error.code)
            yield event


class _EndingSandboxOnStop(AsyncIterator[Event]):
    """A takeover's events that, closed after a stop for good (a cancel, ``fail_run``), see the sandbox ended.

    A successor re-enters the sandbox only after the dead driver's lease and the log's quiet window;
    a stop that comes first ends the run before its drive pulls one event (or while its ensure is
    under way), so ``run_agent``'s own teardown, which destroys the sandbox it entered, never ran or
    had nothing to destroy, and the dead host's agent would run on in there, billed and writing. A
    class, not an async generator: the close of one never started does not run its body, and that
    close is the one thing the run's pump does with a stream stopped before its first pull.
    """

    def __init__(
        self, events: AsyncIterator[Event], signal: AbortSignal, end_sandbox: Callable[[], Awaitable[None]]
    ) -> None:
        self._events = events
        self._signal = signal
        self._end_sandbox = end_sandbox
        self._closed = False

    async def __anext__(self) -> Event:
        return await anext(self._events)

    async def aclose(self) -> None:
        if self._closed:
            return  # the puller closes it, then the pump once more
        self._closed = True
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            # RunFailure equals the cancel reason: a failure stops for good too. A lost claim does not.
            if self._signal.aborted and self._signal.reason == RUN_CANCEL_REASON:
                await self._end_sandbox()


async def _end_stopped_sandbox(
    sandbox: SandboxDefinition, ctx: EnsureContext, durability: RecordDurability, locks: LockStore
) -> None:
    """Destroy the run's recorded sandbox, as a cancel does, unless another driver owns the run now; never raises.

    Under the sandbox's lock (the one ``ensure`` takes), so it cannot race a re-entry. After a drive
    that entered and destroyed it, nothing is recorded any more: one read, no destroy.
    """
    try:
        if not await durability.holds_run():
            return  # superseded: the sandbox is the successor's
        async with hold_lock(locks, f"sandbox:{sandbox.instance_key(ctx)}", ttl_ms=ctx.lock_ttl_ms):
            await sandbox.destroy(ctx)
    except Exception as exc:
        log.warning(
            "run %r: stopped before its takeover re-entered the sandbox; could not destroy it: %s",
            ctx.run_id,
            redact(f"{type(exc).__name__}: {exc}"),
        )


def _run_secrets(sandbox: SandboxDefinition) -> list[str]:
    """The secret values registered for a run (its workspace's): masked in its stored input."""
    if sandbox.workspace is None:
        return []
    return list(resolve_all_secrets(sandbox.workspace.secrets).values())


async def _contained(work: Coroutine[Any, Any, T], name: str) -> T | None:
    """A run's task body in the service's group: one run's error must not cancel the others."""
    try:
        return await work
    except Exception as exc:
        log.error("%s ended with an error: %s", name, redact(f"{type(exc).__name__}: {exc}"))
        return None
