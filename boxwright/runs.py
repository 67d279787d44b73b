"""Run records, run event logs, and the pump that drives one run's events into both.

A run has two durable facts. Its record (``RunRecord`` in a ``RunStore``) says how it
stands: status, error, usage, which sandbox backs it, which driver may write it. Its
event log (``EventLog``) holds every AG-UI event it produced, each under an offset a
client resumes from. ``pipe_to_run_log`` drives one event stream into both and never
raises; ``RunController`` runs many of those at once. Backends: ``stores.memory``
(``memory_run_backend()``) and ``stores.sqlite`` (``SqliteRunStore`` + ``SqliteEventLog``
on one ``SqliteDatabase``); ``testkit.runs`` checks any other backend.

Offsets
    ``<tag>_<seq>``, e.g. ``9f86d081884c7d65_00000000000000000042``: ``tag`` is the first
    16 hex digits of sha256(UTF-8 run id), ``seq`` the event's 1-based position in its
    run's log, zero-padded to 20 digits. Within a run they sort as strings in append
    order; ``<tag>_00000000000000000000`` is the tail of an empty log. The tag lets a log
    refuse an offset that another run issued (``InvalidOffsetError``, an HTTP 400)
    without putting the run id itself, which may be long or hold ``/``, into every
    offset. Only ``[0-9a-f_]`` occurs, so an offset is safe in a query string, a header
    and an SSE id, and is never one of the reserved read tokens ``-1`` (from the start)
    and ``now`` (the current tail), as the Durable Streams protocol requires. A tag is
    64 bits of a hash: two run ids sharing one (odds 2**-64 per pair) would accept each
    other's offsets; it is a guard against mistakes, not an access control.

Epoch fence (decision 3)
    ``append(..., epoch=e)`` lands only while the run record's ``driver_epoch`` is ``e``,
    checked in the same transaction as the write; ``update(..., expected_epoch=e)`` the
    same for a record write. A driver superseded by a takeover (which bumped the epoch)
    therefore can never land one more batch nor a terminal status: it gets
    ``EpochFencedError``. ``epoch=None`` appends unfenced (a single-host app with no
    takeover).

Run ids and thread ids are checked by ``boxwright.ids`` (empty, ``.``/``..``, ``/``, ``\\``,
control characters, lone surrogates (decision 7), over 200 characters are refused with
``InvalidRunIdError`` / ``InvalidThreadIdError``). A reused run id is not an error:
``create_or_resume`` hands back the existing record unchanged (spec R6, R42) and its log
continues where it stopped (or refuses appends once closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeGuard, get_args, runtime_checkable

import msgspec
from msgspec import UNSET, UnsetType

from boxwright import ids as _ids
from boxwright._faults import fault_point
from boxwright._pull import Ended, Failed, Puller
from boxwright.abort import AbortController, AbortSignal, wait_unless_aborted
from boxwright.errors import (
    EpochFencedError,
    EventLogClosedError,
    InvalidOffsetError,
    InvalidRunStatusError,
    RunAlreadyDrivenError,
    RunExistsError,
)
from boxwright.events import (
    EVENT_TYPES,
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TokenUsage,
    now_ms,
)

log = logging.getLogger("boxwright.runs")

RUN_CANCEL_REASON: Final = "boxwright:cancel-requested"
RUN_ACCEPTED_EVENT: Final = "run.accepted"
# RUN_ERROR codes that mean the run was stopped, not that it broke: its status is ``aborted``.
RUN_CANCELLED_CODE: Final = "cancelled"
RUN_ABORTED_CODE: Final = "aborted"
ABORT_ERROR_CODES: Final = frozenset({RUN_CANCELLED_CODE, RUN_ABORTED_CODE})
DURABILITY_BATCH: Final = 32
# A batch is cut early at these, so a reader sees a run start, a tool call complete and a run end at once.
FLUSH_EVENT_TYPES: Final = frozenset({"RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "TOOL_CALL_END"})

START_OFFSET: Final = "-1"
NOW_OFFSET: Final = "now"

# -- record ---------------------------------------------------------------------------------------

RunStatus: TypeAlias = Literal["running", "interrupted", "completed", "failed", "aborted"]
RUN_STATUSES: Final[frozenset[str]] = frozenset(get_args(RunStatus))
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "aborted"})


def is_run_status(value: object) -> TypeGuard[RunStatus]:
    """Whether ``value`` is exactly one of the five status strings (no subclass, no case folding)."""
    return type(value) is str and value in RUN_STATUSES


def is_terminal_status(value: object) -> bool:
    """``completed``, ``failed`` or ``aborted``; ``running`` and ``interrupted`` are not terminal."""
    return type(value) is str and value in TERMINAL_STATUSES


class RunError(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True):
    message: str
    code: str | None = None


class RunRecord(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True):
    """A run's lifecycle record. Times are epoch milliseconds; ``None`` means the field was never set.

    Frozen, so a record a store hands out can never alias what it stores.
    """

    run_id: str
    thread_id: str
    status: RunStatus
    started_at: int
    updated_at: int
    finished_at: int | None = None
    error: RunError | None = None
    usage: TokenUsage | None = None
    sandbox_key: str | None = None
    detached_since: int | None = None
    cancel_requested: bool | None = None
    driver_epoch: int | None = None
    # The profiles (by name, never their values) a run factory chose: a successor that takes the run
    # over rebuilds it from these, since the trigger's metadata is never stored.
    sandbox_profile: str | None = None
    harness_profile: str | None = None
    # The trigger's input (its messages, or its prompt, as JSON; registered secrets masked; never the
    # metadata): a successor starts the agent from it when the first driver died before the agent did.
    input_messages: str | None = None


class RunPatch(msgspec.Struct, rename="camel", kw_only=True, frozen=True, omit_defaults=True):
    """The fields an ``update`` writes: UNSET (the default) keeps a field, ``None`` clears it.

    ``status`` cannot be cleared. ``updated_at`` is stamped by the store on every write.
    """

    status: RunStatus | UnsetType = UNSET
    finished_at: int | UnsetType | None = UNSET
    error: RunError | UnsetType | None = UNSET
    usage: TokenUsage | UnsetType | None = UNSET
    sandbox_key: str | UnsetType | None = UNSET
    detached_since: int | UnsetType | None = UNSET
    cancel_requested: bool | UnsetType | None = UNSET
    driver_epoch: int | UnsetType | None = UNSET
    sandbox_profile: str | UnsetType | None = UNSET
    harness_profile: str | UnsetType | None = UNSET
    input_messages: str | UnsetType | None = UNSET


PATCH_FIELDS: Final[tuple[str, ...]] = RunPatch.__struct_fields__


def patch_changes(run_id: str, patch: RunPatch) -> dict[str, Any]:
    """The fields ``patch`` sets (clearing ones as ``None``), its status checked."""
    changes = {name: value for name in PATCH_FIELDS if (value := getattr(patch, name)) is not UNSET}
    if "status" in changes and not is_run_status(changes["status"]):
        raise InvalidRunStatusError(run_id, changes["status"])
    return changes


def apply_patch(record: RunRecord, patch: RunPatch, updated_at: int) -> RunRecord:
    """``record`` with ``patch`` applied and ``updated_at`` stamped."""
    changes = patch_changes(record.run_id, patch)
    return msgspec.structs.replace(record, **changes, updated_at=updated_at)


# The one validator (boxwright.ids), re-exported: every store and log call checks its run id with it.
check_run_id = _ids.check_run_id
check_thread_id = _ids.check_thread_id


def check_epoch(run_id: str, held: int, stored: int | None, action: str) -> None:
    """Raise ``EpochFencedError`` unless the store's epoch is the one the writer holds."""
    if stored != held:
        raise EpochFencedError(run_id, held, stored, action)


# -- offsets --------------------------------------------------------------------------------------

_OFFSET_RE = re.compile(r"([0-9a-f]{16})_([0-9]{20})")


@functools.lru_cache(maxsize=4096)
def run_offset_tag(run_id: str) -> str:
    """The 16-hex-digit prefix every offset of ``run_id``'s log carries."""
    return hashlib.sha256(check_run_id(run_id).encode()).hexdigest()[:16]


def format_offset(run_id: str, seq: int) -> str:
    """The offset of the ``seq``-th event (1-based) of ``run_id``'s log; ``seq=0`` is an empty log's tail."""
    return f"{run_offset_tag(run_id)}_{seq:020d}"


def parse_offset(run_id: str, offset: object) -> int | None:
    """The position an offset names in ``run_id``'s log: ``-1`` is 0, ``now`` is ``None`` (the tail, unknown here).

    Raises ``InvalidOffsetError`` for anything else that this run's log cannot have issued. Whether
    the position exists yet is the log's to check.
    """
    check_run_id(run_id)
    if offset == START_OFFSET:
        return 0
    if offset == NOW_OFFSET:
        return None
    if not isinstance(offset, str):
        raise InvalidOffsetError(run_id, offset, f"an offset is a string, not {type(offset).__name__}")
    match = _OFFSET_RE.fullmatch(offset)
    if match is None:
        raise InvalidOffsetError(
            run_id, offset, "malformed: expected '-1', 'now' or an offset the log issued ('<16 hex>_<20 digits>')"
        )
    tag = run_offset_tag(run_id)
    if match[1] != tag:
        raise InvalidOffsetError(
            run_id, offset, f"it was issued by another run's log (run tag {match[1]}, this run's is {tag})"
        )
    return int(match[2])


def offset_never_issued(run_id: str, offset: str, last_seq: int) -> InvalidOffsetError:
    return InvalidOffsetError(
        run_id, offset, f"this run's log never issued it: its last offset is {format_offset(run_id, last_seq)}"
    )


async def last_stored_event(log: EventLog, run_id: str, tail: str | None = None) -> Event | None:
    """``run_id``'s last stored event (``None`` for an empty log); ``tail``: the log's tail, when already read.

    Reads one event and never waits.
    """
    if tail is None:
        tail = await log.tail(run_id)
    seq = parse_offset(run_id, tail) or 0
    if seq <= 0:
        return None
    reader = log.read(run_id, format_offset(run_id, seq - 1), live=False)
    async with contextlib.aclosing(reader):  # type: ignore[type-var]  # every store's read is an async generator
        async for _offset, event in reader:
            return event
    return None


async def wait_event_or_abort(event: asyncio.Event, signal: AbortSignal | None) -> bool:
    """Wait for ``event``; ``False`` if ``signal`` aborted first (a reader's wait for the next append)."""
    if signal is None:
        await event.wait()
        return True
    if signal.aborted:
        return False
    await wait_unless_aborted(event.wait(), signal)
    return not signal.aborted


# -- protocols ------------------------------------------------------------------------------------


@runtime_checkable
class RunStore(Protocol):
    async def get(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id``, or ``None``."""
        ...

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        """A new ``running`` record, or the existing one unchanged (a terminal run is never resurrected)."""
        ...

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        """Apply ``patch`` and return the record written; an unknown run is a no-op returning ``None``.

        With ``expected_epoch``, the write lands only while the stored ``driver_epoch`` equals it
        (checked atomically); otherwise ``EpochFencedError`` and nothing changes.
        """
        ...

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        """The ``running`` run of ``thread_id`` that started last, or ``None``."""
        ...


@runtime_checkable
class RunCreation(Protocol):
    """An atomic insert (both built-in stores have it; feature-detect with ``isinstance``)."""

    async def create(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        """A new ``running`` record; ``RunExistsError`` (with the existing record's thread) if the id has one.

        Atomic: of any number of concurrent creates of one id, exactly one returns.
        """
        ...


async def create_run(runs: RunStore, run_id: str, thread_id: str) -> RunRecord:
    """A new record for ``run_id`` or ``RunExistsError``: the store's atomic ``create`` when it has one.

    A store without it gets a lookup then ``create_or_resume``: two requests racing for one id
    there may both pass, which only an atomic insert rules out.
    """
    if isinstance(runs, RunCreation):
        return await runs.create(run_id, thread_id)
    existing = await runs.get(run_id)
    if existing is not None:
        raise RunExistsError(run_id, existing.thread_id)
    return await runs.create_or_resume(run_id, thread_id)


@runtime_checkable
class RunListing(Protocol):
    """Optional store features (feature-detect with ``isinstance``; both built-in stores have them)."""

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        """Every run of ``thread_id``, oldest ``started_at`` first."""
        ...

    async def list_reclaimable(self, now_ms: int, ttl_ms: int) -> list[RunRecord]:
        """Running, detached runs with ``detached_since <= now_ms - ttl_ms``, longest-detached first."""
        ...


@runtime_checkable
class RunningListing(Protocol):
    """Optional: every ``running`` run, oldest ``started_at`` first (a sweep looks for ones nobody drives)."""

    async def list_running(self, limit: int) -> list[RunRecord]:
        """At most ``limit`` running runs, oldest first."""
        ...


@runtime_checkable
class EventLog(Protocol):
    async def append(self, run_id: str, events: Sequence[Event], *, epoch: int | None = None) -> list[str]:
        """Store ``events`` as one batch, all or nothing; returns one new offset per event, in order.

        Raises ``EpochFencedError`` when ``epoch`` is given and the run's ``driver_epoch`` is not it,
        ``EventLogClosedError`` once the log is closed. An empty batch returns ``[]`` and checks nothing.
        """
        ...

    def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        """``(offset, event)`` for every event strictly after ``after``, then (``live``) each new one
        as it lands, until the log is closed or ``signal`` aborts (both end the iteration quietly).

        ``-1`` reads from the start, ``now`` from the tail as it is when iteration begins. A run
        event such as ``RUN_FINISHED`` does not end a read; only ``close`` does. An offset that is
        malformed, from another run, or past the tail raises ``InvalidOffsetError`` on the first step.
        """
        ...

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[Event]:
        """The first ``limit`` (default all) stored events, as a new list; never waits; ``[]`` for unknown runs."""
        ...

    async def tail(self, run_id: str) -> str:
        """The offset of the last stored event (an empty or unknown log's is ``format_offset(run_id, 0)``)."""
        ...

    async def close(self, run_id: str) -> None:
        """Mark the log finished and wake every reader. Idempotent, never fenced; a closed log takes no appends."""
        ...

    async def is_closed(self, run_id: str) -> bool:
        """Whether ``close`` was called for ``run_id`` (``False`` for an unknown run)."""
        ...


# -- cancel (the durable band) --------------------------------------------------------------------


class RunFailure(str):
    """An abort reason that stops a run as a cancel does and ends it ``failed`` with ``error``.

    It equals ``RUN_CANCEL_REASON`` (a str of that value), so everything that treats a cancel as
    "stop for good" (the sandbox destroyed, a co-located runner told to cancel, never a detach)
    does the same for it; the driver then records ``failed`` with ``error`` as the run's one final
    status (the inactivity watchdog: never an ``aborted`` that a later write turns into ``failed``).
    """

    error: RunError

    def __new__(cls, error: RunError) -> RunFailure:
        made = super().__new__(cls, RUN_CANCEL_REASON)
        made.error = error
        return made


async def request_run_cancel(runs: RunStore, run_id: str) -> RunRecord | None:
    """Record that a user asked ``run_id`` to stop: writes ``cancel_requested=True`` and nothing else."""
    return await runs.update(run_id, RunPatch(cancel_requested=True))


async def was_cancel_requested(runs: RunStore, run_id: str) -> bool:
    """Whether a cancel is recorded for ``run_id``; a store that cannot be read counts as no."""
    try:
        record = await runs.get(run_id)
    except Exception as exc:
        _log(log, logging.WARNING, "could not read whether run %r was cancelled (%s); assuming not", run_id, exc)
        return False
    return record is not None and record.cancel_requested is True


# -- pipe_to_run_log ------------------------------------------------------------------------------


def _log(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    # A raising logger must not break a pump that promises never to raise.
    with contextlib.suppress(Exception):
        logger.log(level, message, *args)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


def total_usage(usages: Sequence[TokenUsage] | None) -> TokenUsage | None:
    """One usage from a RUN_FINISHED / RUN_ERROR usage list: counts summed, provider/model kept when shared."""
    if not usages:
        return None
    if len(usages) == 1:
        return msgspec.structs.replace(usages[0])

    def shared(name: str) -> str | None:
        values = {getattr(u, name) for u in usages}
        return values.pop() if len(values) == 1 else None

    def summed(name: str) -> int | None:
        counts = [getattr(u, name) for u in usages if getattr(u, name) is not None]
        return sum(counts) if counts else None

    counted = (
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "reasoning_tokens",
        "cached_input_tokens",
        "cache_write_input_tokens",
    )
    return TokenUsage(provider=shared("provider"), model=shared("model"), **{name: summed(name) for name in counted})


class _Aborted(Exception):
    pass


class _Pump:
    """The state of one ``pipe_to_run_log`` call."""

    def __init__(
        self,
        runs: RunStore,
        events: EventLog,
        run_id: str,
        thread_id: str,
        epoch: int | None,
        logger: logging.Logger,
    ) -> None:
        self.runs = runs
        self.events = events
        self.run_id = run_id
        self.thread_id = thread_id
        self.epoch = epoch
        self.logger = logger
        self.started_at = now_ms()
        self.buffer: list[Event] = []
        self.failure: RunError | None = None  # the stream, a RUN_ERROR event or the log failed: status failed
        self.abort: RunError | None = None  # the signal fired (or the task was cancelled): status aborted
        self.usage: TokenUsage | None = None
        self.last_type: str | None = None  # type of the last event that landed
        self.stopped = False  # nothing more may be appended: the log refused or failed
        self.fenced = False  # a successor driver owns the run: write nothing, close nothing
        self.log_closed = False
        # The AG-UI envelope of the log, kept here, its one writer, so every reader (the AG-UI client's
        # verifier among them) sees RUN_STARTED first and nothing after the terminal event.
        self.announce = False  # a fresh log: RUN_STARTED + run.accepted go first, with the first event
        self.run_started = False  # the log holds its RUN_STARTED: a later one from the stream is dropped
        self.terminal: RunFinishedEvent | RunErrorEvent | None = None  # the stream's end, once pulled

    # -- the stream side --

    async def run(self, stream: AsyncIterable[Event], signal: AbortSignal | None) -> None:
        try:
            await self.runs.create_or_resume(self.run_id, self.thread_id)
        except Exception as exc:
            # The log is what clients read; a record that could not be made must not stop delivery.
            _log(self.logger, logging.ERROR, "run %r: could not create its record: %s", self.run_id, exc)
        if signal is not None and signal.aborted:
            self.note_abort(signal.reason)
            await _close_stream(stream, self)
            return
        # A fresh run announces itself (with its first event, see ``announcement``); a successor's log
        # already holds the announcement and the run's RUN_STARTED.
        self.announce = await self.log_is_empty()
        self.run_started = not self.announce
        if not self.announce:
            await self.adopt_stored_end()
        await self.pump(stream, signal)

    async def adopt_stored_end(self) -> None:
        """A successor's log that already ends with the run's terminal event: that event is the verdict.

        Its driver died after the event landed and before the record said so. The stream is still
        pulled (its teardown ends the sandbox as the run's end would), but nothing it yields, raises
        or replays differently may change what readers were told: a run whose log says RUN_ERROR is
        recorded failed with that error, never completed because the replay had nothing new.
        """
        try:
            last = await last_stored_event(self.events, self.run_id)
        except Exception as exc:
            _log(self.logger, logging.WARNING, "run %r: could not read its last stored event: %s", self.run_id, exc)
            return
        if isinstance(last, (RunFinishedEvent, RunErrorEvent)):
            _log(self.logger, logging.INFO, "run %r: its log already ends with %s", self.run_id, last.type)
            self.observe(last)
            self.last_type = last.type

    def announcement(self, first: Event | None) -> list[Event]:
        """What a fresh log starts with: RUN_STARTED (the stream's own when it comes first), then run.accepted.

        AG-UI clients verify that a run's first event is RUN_STARTED, so the announcement that
        lets a client joining during a slow start find the log comes right after it.
        """
        self.announce = False
        self.run_started = True
        started = first if isinstance(first, RunStartedEvent) else None
        if started is None:
            started = RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id, timestamp=now_ms())
        accepted = CustomEvent(
            name=RUN_ACCEPTED_EVENT, value={"runId": self.run_id, "threadId": self.thread_id}, timestamp=now_ms()
        )
        return [started, accepted]

    async def log_is_empty(self) -> bool:
        try:
            return await self.events.tail(self.run_id) == format_offset(self.run_id, 0)
        except Exception:
            return True  # unknown: announcing twice is harmless, never announcing is not

    async def pump(self, stream: AsyncIterable[Event], signal: AbortSignal | None) -> None:
        # One long-lived waiter for the abort, raced against each pull: no task per event.
        abort_waiter: asyncio.Future[object] | None = None
        remove_listener: Callable[[], None] = lambda: None  # noqa: E731
        if signal is not None:
            abort_waiter = asyncio.get_running_loop().create_future()
            waiter = abort_waiter

            def on_abort(reason: object) -> None:
                if not waiter.done():
                    waiter.set_result(reason)

            remove_listener = signal.add_listener(on_abort)
        iterator: AsyncIterator[Event] | None = None
        try:
            iterator = aiter(stream)
            # Every step of the stream, and its close, runs in this one task: a ContextVar or a cancel
            # scope the producer holds across a ``yield`` stays in its task (a task per pull broke both).
            puller: Puller[Event] = Puller(iterator)
            async with asyncio.TaskGroup() as tasks:
                pulling = tasks.create_task(puller.run(), name=f"boxwright pull {self.run_id!r}")
                try:
                    await self.pull_all(puller, signal, abort_waiter)
                except Exception as exc:  # caught here: out of the group it would be an ExceptionGroup
                    self.note_stream_failure(exc)
                finally:
                    if abort_waiter is not None and abort_waiter.done():
                        pulling.cancel()  # an abort interrupts the pull in flight, as it always did
                    puller.stop()
        except Exception as exc:
            self.note_stream_failure(exc)
        finally:
            remove_listener()
            if iterator is not None:
                await _close_stream(iterator, self)  # a no-op once the puller closed it
        # Events already pulled from the stream are kept, whatever ended it.
        await self.flush()

    async def pull_all(
        self, puller: Puller[Event], signal: AbortSignal | None, abort_waiter: asyncio.Future[object] | None
    ) -> None:
        while not self.stopped:
            if signal is not None and signal.aborted:
                self.note_abort(signal.reason)
                return
            try:
                event = await self.next_event(puller, abort_waiter)
            except StopAsyncIteration:
                return
            except _Aborted:
                assert signal is not None
                self.note_abort(signal.reason)
                return
            if not isinstance(event, EVENT_TYPES):
                message = f"the event stream yielded a {type(event).__name__}, not an AG-UI event"
                self.note_failure(RunError(message=message, code="invalid-event"))
                return
            if self.terminal is not None:
                # AG-UI: nothing follows a run's end. The stream is still pulled to its own end (its
                # teardown and journal cleanup run there), but what it yields now is not the run's.
                _log(self.logger, logging.DEBUG, "run %r: %s after the terminal event dropped", self.run_id, event.type)
                continue
            if self.announce:
                self.buffer.extend(self.announcement(event))
                if isinstance(event, RunStartedEvent):
                    await self.flush()
                    continue
            elif isinstance(event, RunStartedEvent) and self.run_started:
                continue  # the log's RUN_STARTED opened the run; a second one would start another run
            self.run_started = True
            self.observe(event)
            self.buffer.append(event)
            if len(self.buffer) >= DURABILITY_BATCH or event.type in FLUSH_EVENT_TYPES:
                await self.flush()

    async def next_event(self, puller: Puller[Event], abort_waiter: asyncio.Future[object] | None) -> Event:
        pending = puller.next()
        if self.announce and not pending.done():
            await asyncio.sleep(0)
            if not pending.done():
                # A slow first event (provisioning, a queue): the log must exist for readers meanwhile.
                self.buffer.extend(self.announcement(None))
                await self.flush()
        if self.buffer and not pending.done():
            await asyncio.sleep(0)  # one step for the producer: is its next event already there?
            if not pending.done():
                # The producer is about to wait: deliver what it gave so far instead of holding it back.
                await self.flush()
        if abort_waiter is not None and not pending.done():
            # Both are plain futures: the race creates no task.
            racers: set[asyncio.Future[Any]] = {pending, abort_waiter}
            await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                raise _Aborted
        item = await pending  # pulled before (or with) the abort: kept; the loop then stops
        if isinstance(item, (Ended, Failed)) and abort_waiter is not None and abort_waiter.done():
            raise _Aborted  # a producer that ends (or raises) on the abort was stopped, not finished
        if isinstance(item, Ended):
            raise StopAsyncIteration
        if isinstance(item, Failed):
            raise item.error
        return item

    def observe(self, event: Event) -> None:
        if isinstance(event, (RunErrorEvent, RunFinishedEvent)):
            self.terminal = event
        if isinstance(event, RunErrorEvent):
            error = RunError(message=event.message, code=event.code)
            if event.code in ABORT_ERROR_CODES:
                # The producer reporting its own abort (a driver under a claim has no signal here):
                # a cancelled run ends ``aborted``, never ``failed``.
                self.abort = self.abort or error
            else:
                self.note_failure(error)
            self.usage = total_usage(event.usage) or self.usage
        elif isinstance(event, RunFinishedEvent):
            self.usage = total_usage(event.usage) or self.usage

    def note_failure(self, error: RunError) -> None:
        if self.failure is None:
            self.failure = error

    def note_stream_failure(self, exc: Exception) -> None:
        if self.terminal is not None:
            # The run had ended (its terminal event is the verdict readers got): a later raise,
            # in the stream's own teardown, changes neither its status nor its log.
            _log(self.logger, logging.WARNING, "run %r: its stream raised after its end: %s", self.run_id, exc)
            return
        self.note_failure(RunError(message=_describe(exc), code=_error_code(exc)))

    def note_abort(self, reason: object) -> None:
        if self.abort is not None or self.terminal is not None:
            return  # a stop that comes after the run's end does not make it aborted
        if isinstance(reason, RunFailure):
            self.note_failure(reason.error)  # stopped as a cancel is, but the verdict is a failure
            self.abort = reason.error
        elif reason == RUN_CANCEL_REASON:
            self.abort = RunError(message="the run was cancelled", code=RUN_CANCELLED_CODE)
        else:
            shown = _describe(reason) if isinstance(reason, BaseException) else str(reason)
            self.abort = RunError(message=f"the run was aborted: {shown}", code=RUN_ABORTED_CODE)

    # -- the log side --

    async def flush(self) -> None:
        if self.buffer:
            batch, self.buffer = self.buffer, []
            await self.append(batch)

    async def append(self, batch: list[Event]) -> None:
        if self.stopped or not batch:
            return
        fault_point("run.append")
        try:
            await self.events.append(self.run_id, batch, epoch=self.epoch)
        except EpochFencedError as exc:
            self.stopped = self.fenced = True
            _log(
                self.logger, logging.WARNING, "run %r: superseded, stopping without another write: %s", self.run_id, exc
            )
        except Exception as exc:
            # The batch is never retried: it may have landed before the error, and a retry would duplicate it.
            self.stopped = True
            self.log_closed = isinstance(exc, EventLogClosedError)
            _log(self.logger, logging.ERROR, "run %r: could not append %d event(s): %s", self.run_id, len(batch), exc)
            self.note_failure(
                RunError(message=f"could not append to the event log: {_describe(exc)}", code="log-error")
            )
        else:
            self.last_type = batch[-1].type

    async def append_closing_error(self) -> None:
        """The RUN_ERROR that tells readers an early end; tried once, also after a failed append (R48)."""
        error = self.failure or self.abort
        # After the run's terminal event (RUN_FINISHED or RUN_ERROR) nothing more goes into its log.
        if error is None or self.fenced or self.log_closed or self.last_type in ("RUN_ERROR", "RUN_FINISHED"):
            return
        event = RunErrorEvent(
            message=error.message, code=error.code, run_id=self.run_id, thread_id=self.thread_id, timestamp=now_ms()
        )
        try:
            await self.events.append(self.run_id, [event], epoch=self.epoch)
        except EpochFencedError as exc:
            self.stopped = self.fenced = True
            _log(self.logger, logging.WARNING, "run %r: superseded before its closing error: %s", self.run_id, exc)
        except Exception as exc:
            _log(self.logger, logging.ERROR, "run %r: could not append its closing RUN_ERROR: %s", self.run_id, exc)
            # The original error stays the primary one; the failed report is added to it.
            amended = RunError(message=f"{error.message}; append: {_describe(exc)}", code=error.code)
            if self.failure is not None:
                self.failure = amended
            else:
                self.abort = amended
        else:
            self.last_type = "RUN_ERROR"

    async def finish(
        self,
        detached: Callable[[], bool] | None = None,
        after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
    ) -> RunRecord:
        """Flush, append a closing RUN_ERROR after an early end, write the status, close the log.

        A run that ended by abort and whose sandbox detached (``detached()`` answers after the
        stream's own teardown ran) keeps running elsewhere: its log stays open, nothing more is
        appended and its status stays ``running``, so a successor can take it over (R39).
        """
        await self.flush()
        if self.abort is not None and not self.failure and detached is not None and _verdict(detached):
            _log(self.logger, logging.INFO, "run %r detached: its log stays open for a successor", self.run_id)
            return await self.reread(
                RunRecord(
                    run_id=self.run_id,
                    thread_id=self.thread_id,
                    status="running",
                    started_at=self.started_at,
                    updated_at=now_ms(),
                    driver_epoch=self.epoch,
                )
            )
        if self.announce and not self.fenced:
            await self.append(self.announcement(None))  # a stream that ended before its first event
        await self.append_closing_error()
        status: RunStatus = "failed" if self.failure else "aborted" if self.abort else "completed"
        error = self.failure or self.abort
        finished_at = now_ms()
        local = RunRecord(
            run_id=self.run_id,
            thread_id=self.thread_id,
            status=status,
            started_at=self.started_at,
            updated_at=finished_at,
            finished_at=finished_at,
            error=error,
            usage=self.usage,
            driver_epoch=self.epoch,
        )
        superseded = msgspec.structs.replace(local, status="running", finished_at=None, error=None)
        if self.fenced:
            return await self.reread(superseded)
        record: RunRecord | None = None
        fault_point("run.finish")
        try:
            record = await self.runs.update(
                self.run_id,
                RunPatch(
                    status=status,
                    finished_at=finished_at,
                    error=error,
                    usage=self.usage if self.usage is not None else UNSET,
                ),
                expected_epoch=self.epoch,
            )
        except EpochFencedError as exc:
            # Our last batch landed but the record moved on since: the successor owns both now.
            _log(self.logger, logging.WARNING, "run %r: terminal status suppressed: %s", self.run_id, exc)
            return await self.reread(superseded)
        except Exception as exc:
            _log(self.logger, logging.ERROR, "run %r: could not record status %s: %s", self.run_id, status, exc)
        try:
            await self.events.close(self.run_id)
        except Exception as exc:
            _log(self.logger, logging.ERROR, "run %r: could not close its event log: %s", self.run_id, exc)
        if record is not None and is_terminal_status(record.status) and after_terminal is not None:
            # Only once the terminal record is durably written (and not suppressed): what follows the
            # end, such as removing the journal a successor would replay, must never come before it.
            try:
                await after_terminal(record)
            except Exception as exc:
                _log(self.logger, logging.WARNING, "run %r: its after-terminal step failed: %s", self.run_id, exc)
        return record if record is not None else local

    async def reread(self, fallback: RunRecord) -> RunRecord:
        try:
            record = await self.runs.get(self.run_id)
        except Exception as exc:
            _log(self.logger, logging.ERROR, "run %r: could not re-read its record: %s", self.run_id, exc)
            return fallback
        return record if record is not None else fallback


def _error_code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else None


async def _close_stream(stream: object, pump: _Pump) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        _log(pump.logger, logging.WARNING, "run %r: closing its event stream raised: %s", pump.run_id, exc)


async def pipe_to_run_log(
    stream: AsyncIterable[Event],
    runs: RunStore,
    events: EventLog,
    run_id: str,
    thread_id: str,
    signal: AbortSignal | None = None,
    epoch: int | None = None,
    *,
    logger: logging.Logger | None = None,
    detached: Callable[[], bool] | None = None,
    after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
) -> RunRecord:
    """Drive ``stream`` into ``run_id``'s log and record; returns the final record and never raises.

    - The record is created (or resumed) first. A fresh log starts with the run's RUN_STARTED
      (the stream's own when it comes first, else one made here) and a ``CUSTOM run.accepted``,
      appended at once if the stream's first event is slow, so a client joining during a slow
      start finds the log; a later RUN_STARTED from the stream is dropped, and so is anything it
      yields after its terminal event (RUN_FINISHED or RUN_ERROR): AG-UI clients verify both.
      A stop or a raise that comes after the terminal event changes neither status nor log.
    - Events are appended in batches of up to 32, cut early at RUN_STARTED, RUN_FINISHED,
      RUN_ERROR and TOOL_CALL_END, and whenever the stream has nothing ready (so a pause in the
      agent never holds events back from readers). A batch is never retried.
    - A RUN_ERROR event, a raising stream, or a failing append ends the run ``failed`` with that
      error, but a RUN_ERROR coded ``cancelled`` or ``aborted`` (the producer reporting its own
      abort) ends it ``aborted``; ``signal`` (checked before each pull, and raced against a pull
      that waits) ends it ``aborted`` (``code="cancelled"`` for ``RUN_CANCEL_REASON``); otherwise
      ``completed``. An
      early end appends a closing RUN_ERROR unless the last event landed was terminal; if that
      append fails, its error is added to the message (``; append: ...``).
    - Then the status is written (fenced at ``epoch``) and the log closed, each guarded. A failed
      write returns a record rebuilt locally. With ``epoch``, a driver found superseded (by the
      log or the record) stops at once: no RUN_ERROR, no status, no close, since the successor
      owns the run; it returns the stored record.
    - A resumed log that already ends with RUN_FINISHED or RUN_ERROR (its driver died before the
      record said so) keeps that end: the status comes from it, and nothing more is appended.
    - ``after_terminal(record)`` runs after a terminal status was written (never when it was
      suppressed or failed), e.g. to remove the run's journal; its error is logged.
    - Cancelling the calling task finishes the run ``aborted`` (shielded), then re-raises.
    """
    pump = _Pump(runs, events, run_id, thread_id, epoch, logger or log)
    try:
        await pump.run(stream, signal)
    except asyncio.CancelledError:
        pump.note_abort("the task driving the run was cancelled")
        await asyncio.shield(_finish_after_close(pump, stream, detached, after_terminal))
        raise
    except Exception as exc:  # pragma: no cover - run() guards every call; this keeps the promise regardless
        pump.note_failure(RunError(message=_describe(exc)))
    # Shielded: a cancellation arriving now must not leave the status unwritten or the log open.
    return await asyncio.shield(_finish_after_close(pump, stream, detached, after_terminal))


async def _finish_after_close(
    pump: _Pump,
    stream: AsyncIterable[Event],
    detached: Callable[[], bool] | None,
    after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
) -> RunRecord:
    # The detach verdict is published by the stream's own teardown (the sandbox lifecycle): close the
    # stream first, so the verdict is read after it ran, never before (R39).
    if detached is not None and pump.abort is not None:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    return await pump.finish(detached, after_terminal)


def _verdict(detached: Callable[[], bool]) -> bool:
    try:
        return bool(detached())
    except Exception:
        return False


# -- RunController --------------------------------------------------------------------------------

StreamSource: TypeAlias = AsyncIterable[Event] | Callable[[str], AsyncIterable[Event]]
# Creates a run's task from its coroutine and name (a TaskGroup's create_task, say).
Spawn: TypeAlias = Callable[[Coroutine[Any, Any, "RunRecord"], str], "asyncio.Task[RunRecord]"]


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A started run: ``await handle.done`` gives its final record (the task never raises but on cancellation)."""

    run_id: str
    done: asyncio.Task[RunRecord]


async def _raising(exc: Exception) -> AsyncIterator[Event]:
    raise exc
    yield  # pragma: no cover - makes this an async generator


class RunController:
    """Drives many runs at once in background tasks, each into its own log, and tails them.

    Keeps a strong reference to every task until it ends; ``drain()`` waits for all of them.
    ``spawn`` creates each run's task (default: a task of the running loop); an owner such as
    ``SandboxService`` passes its TaskGroup's ``create_task`` so every run is a child of it.
    """

    def __init__(
        self,
        runs: RunStore,
        events: EventLog,
        *,
        logger: logging.Logger | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        self._runs = runs
        self._events = events
        self._logger = logger or log
        self._spawn = spawn
        self._active: dict[str, tuple[asyncio.Task[RunRecord], AbortController]] = {}

    def start(
        self,
        stream: StreamSource,
        run_id: str,
        thread_id: str,
        *,
        signal: AbortSignal | None = None,
        epoch: int | None = None,
        detached: Callable[[], bool] | None = None,
        after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
    ) -> RunHandle:
        """Begin driving ``run_id`` and return at once (``detached``, ``after_terminal``: see ``pipe_to_run_log``).

        ``stream`` is the run's events, or a factory called once, inside the run's task, with
        ``run_id`` (a raising factory fails the run like a raising stream). Raises
        ``RunAlreadyDrivenError`` if this controller is still driving ``run_id``.
        """
        if run_id in self._active:
            raise RunAlreadyDrivenError(run_id)
        controller = AbortController()
        combined = AbortSignal.any([signal, controller.signal]) if signal is not None else controller.signal
        work = self._drive(stream, run_id, thread_id, combined, epoch, detached, after_terminal)
        name = f"boxwright run {run_id!r}"
        if self._spawn is not None:
            task = self._spawn(work, name)
        else:
            task = asyncio.get_running_loop().create_task(work, name=name)
        self._active[run_id] = (task, controller)
        task.add_done_callback(functools.partial(self._forget, run_id))
        return RunHandle(run_id, task)

    async def _drive(
        self,
        stream: StreamSource,
        run_id: str,
        thread_id: str,
        signal: AbortSignal,
        epoch: int | None,
        detached: Callable[[], bool] | None = None,
        after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
    ) -> RunRecord:
        source: AsyncIterable[Event]
        if isinstance(stream, AsyncIterable):
            source = stream
        else:
            try:
                source = stream(run_id)
            except Exception as exc:
                source = _raising(exc)
        return await pipe_to_run_log(
            source,
            self._runs,
            self._events,
            run_id,
            thread_id,
            signal,
            epoch,
            logger=self._logger,
            detached=detached,
            after_terminal=after_terminal,
        )

    def _forget(self, run_id: str, task: asyncio.Task[RunRecord]) -> None:
        entry = self._active.get(run_id)
        if entry is not None and entry[0] is task:
            del self._active[run_id]

    def cancel(self, run_id: str, reason: object = RUN_CANCEL_REASON) -> bool:
        """Abort a run this controller drives (the in-process cancel band); ``False`` if it drives no such run."""
        entry = self._active.get(run_id)
        if entry is None:
            return False
        entry[1].abort(reason)
        return True

    def attach(
        self, run_id: str, from_offset: str = START_OFFSET, signal: AbortSignal | None = None
    ) -> AsyncIterator[tuple[str, Event]]:
        """Tail ``run_id``'s log from ``from_offset`` (see ``EventLog.read``); works for runs driven anywhere."""
        return self._events.read(run_id, from_offset, signal=signal)

    async def status(self, run_id: str) -> RunRecord | None:
        return await self._runs.get(run_id)

    @property
    def active_runs(self) -> list[str]:
        return list(self._active)

    async def drain(self) -> None:
        """Wait until every run started here has finished, including runs started meanwhile. Never raises."""
        while True:
            pending = [task for task, _ in self._active.values() if not task.done()]
            if not pending:
                return
            await asyncio.wait(pending)


__all__ = [
    "ABORT_ERROR_CODES",
    "DURABILITY_BATCH",
    "FLUSH_EVENT_TYPES",
    "NOW_OFFSET",
    "PATCH_FIELDS",
    "RUN_ABORTED_CODE",
    "RUN_ACCEPTED_EVENT",
    "RUN_CANCELLED_CODE",
    "RUN_CANCEL_REASON",
    "RUN_STATUSES",
    "START_OFFSET",
    "TERMINAL_STATUSES",
    "EventLog",
    "RunController",
    "RunCreation",
    "RunError",
    "RunFailure",
    "RunHandle",
    "RunListing",
    "RunPatch",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "RunningListing",
    "StreamSource",
    "apply_patch",
    "check_epoch",
    "check_run_id",
    "check_thread_id",
    "create_run",
    "format_offset",
    "is_run_status",
    "is_terminal_status",
    "last_stored_event",
    "offset_never_issued",
    "parse_offset",
    "patch_changes",
    "pipe_to_run_log",
    "request_run_cancel",
    "run_offset_tag",
    "total_usage",
    "wait_event_or_abort",
    "was_cancel_requested",
]
