"""Taking a run over from a driver that died: align the replay with the log, claim, fence, drive.

A successor re-reads the agent's journal from byte 0 and translates it again;
translation is deterministic (ids from the run-scoped generator), so its
events repeat what the log already holds, timestamps aside. ``align_to_stored_log``
drops that stored prefix (compared by fingerprint) and forwards only the rest;
a mismatch means the replay is not the same run, and nothing is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeVar, overload

import msgspec

from ._faults import fault_point
from .abort import AbortController, AbortSignal, sleep_unless_aborted
from .errors import (
    BoxwrightError,
    EpochFencedError,
    RunClaimLostError,
    RunClaimNotAcquiredError,
    RunDriverPipeOutsideClaimError,
    RunLogNotQuiescentError,
)
from .events import CustomEvent, Event, RunErrorEvent, chunk_fingerprint
from .runs import (
    RUN_CANCEL_REASON,
    START_OFFSET,
    EventLog,
    RunPatch,
    RunRecord,
    RunStore,
    is_run_status,
    is_terminal_status,
    pipe_to_run_log,
)
from .stores.base import DEFAULT_LEASE_TTL_MS, LeaseSignal, LockStore, hold_lock

DEFAULT_MAX_OUT_OF_BAND_SKIP = 64


class JournalReplayDivergedError(BoxwrightError):
    """The replayed run differs from what the event log stores: it is not safe to go on appending."""

    def __init__(self, index: int, stored: Event | None, replayed: Event | None, detail: str = "") -> None:
        self.index = index
        self.stored = stored
        self.replayed = replayed
        stored_fp = chunk_fingerprint(stored) if stored is not None else None
        replayed_fp = chunk_fingerprint(replayed) if replayed is not None else None
        super().__init__(
            f"journal replay diverged from the stored log at event {index}"
            + (f": {detail}" if detail else "")
            + f" (stored {stored.type if stored else 'nothing'} {stored_fp}, "
            f"replayed {replayed.type if replayed else 'nothing'} {replayed_fp})"
        )


class JournalReplayThreadIdMismatchError(JournalReplayDivergedError):
    """Only the thread id differs: the successor drives the run under another thread."""

    def __init__(self, index: int, stored: Event, replayed: Event, stored_thread_id: str, replayed_thread_id: str):
        self.stored_thread_id = stored_thread_id
        self.replayed_thread_id = replayed_thread_id
        super().__init__(
            index, stored, replayed, f"thread id {replayed_thread_id!r} where the log has {stored_thread_id!r}"
        )


def is_out_of_band(event: Event) -> bool:
    """Events not derived from the journal (file and tool-bridge events) may be missing from a replay."""
    return isinstance(event, CustomEvent)


def chunk_thread_id(event: Event) -> str | None:
    thread = getattr(event, "thread_id", None)
    if isinstance(thread, str):
        return thread
    metadata = event.metadata or {}
    value = metadata.get("threadId")
    return value if isinstance(value, str) else None


def _fingerprint_ignoring_thread(event: Event) -> str:
    if getattr(event, "thread_id", None) is None:
        return chunk_fingerprint(event)
    return chunk_fingerprint(msgspec.structs.replace(event, thread_id=""))


async def align_to_stored_log(
    replay: AsyncIterator[Event],
    snapshot: Callable[[], Awaitable[Sequence[Event]]],
    *,
    out_of_band: Callable[[Event], bool] | None = None,
    max_out_of_band_skip: int = DEFAULT_MAX_OUT_OF_BAND_SKIP,
) -> AsyncIterator[Event]:
    """Forward what ``replay`` yields beyond the stored log (R31-R33).

    ``snapshot`` is called once, before the first pull. Stored entries are
    matched in order; a stored out-of-band entry with no counterpart is skipped
    (at most ``max_out_of_band_skip`` in a row); a replayed RUN_ERROR the log does
    not hold is forwarded and ends the replay (the successor's drive failed, and
    says why); any other mismatch raises ``JournalReplayDivergedError`` and forwards
    nothing for it. A replay that ends before the stored log does raises too.
    """
    stored = list(await snapshot())
    skippable = out_of_band or (lambda _event: False)
    position = 0
    skipped_in_a_row = 0
    async for event in replay:
        if position >= len(stored):
            yield event
            continue
        fingerprint = chunk_fingerprint(event)
        while position < len(stored):
            expected = stored[position]
            if chunk_fingerprint(expected) == fingerprint:
                position += 1
                skipped_in_a_row = 0
                break
            if skippable(expected) and skipped_in_a_row < max_out_of_band_skip:
                position += 1
                skipped_in_a_row += 1
                continue
            if skippable(event):
                break  # a replayed out-of-band event the log does not hold here: dropped, not forwarded
            if isinstance(event, RunErrorEvent):
                # The replay itself failed (no journal to read, a runner that cannot re-attach): its error is
                # the run's end and says why; a "divergence" at this index would hide the reason.
                yield event
                return
            stored_thread, replayed_thread = chunk_thread_id(expected), chunk_thread_id(event)
            if (
                stored_thread != replayed_thread
                and stored_thread is not None
                and replayed_thread is not None
                and _fingerprint_ignoring_thread(expected) == _fingerprint_ignoring_thread(event)
            ):
                raise JournalReplayThreadIdMismatchError(position, expected, event, stored_thread, replayed_thread)
            raise JournalReplayDivergedError(position, expected, event)
        else:
            # Every remaining stored entry was out of band and skipped: this one is new.
            yield event
    while position < len(stored) and skippable(stored[position]):
        position += 1
    if position < len(stored):
        raise JournalReplayDivergedError(position, stored[position], None, "replay shorter than stored log")


# -- claim, fences, quiescence (R51-R55) -----------------------------------------------------------
#
# Three layers keep a run single-writer. The lease: the whole drive runs inside
# ``async with hold_lock(locks, "run-driver:<run id>")``, whose lease reports its loss. The
# epoch: each claim bumps the record's ``driver_epoch``, and every append and terminal
# status write is a compare-and-set on it IN THE STORE (decision 3: one transaction in
# SQLite), which replaces the reference's re-read of the epoch every 32 appends (R53): a
# superseded driver cannot land one more batch, not even one racing the bump.
# Quiescence: a successor waits for the log to stop growing before its first append.

_logger = logging.getLogger("boxwright.takeover")

DEFAULT_FENCE_QUIET_MS = 5_000
DEFAULT_QUIESCENCE_PROBES = 6
LEASE_LOST: Final = "lease-lost"

T = TypeVar("T")

# (run_id, thread_id, signal) -> the run's events; the signal fires when the claim is lost.
Drive = Callable[[str, str, AbortSignal], AsyncIterable[Event]]


def _log(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    # Callers promise never to raise; a raising logger must not break that.
    with contextlib.suppress(Exception):
        logger.log(level, message, *args)


def run_driver_lock_key(run_id: str) -> str:
    return f"run-driver:{run_id}"


class RunClaim:
    """One successful claim of a run: the epoch it bumped to, and a signal that aborts when the lease is lost.

    Identity-hashed on purpose: it owns the one-way latch both fences share. The first
    refused write (the store's epoch moved on, or the lease was lost) latches it, and
    every later write through either fence re-raises that error without touching a store.
    """

    __slots__ = ("_lost", "_suppression_logged", "cancel_signal", "epoch", "run_id", "run_signal", "signal")

    def __init__(self, run_id: str, epoch: int, signal: AbortSignal, cancel_signal: AbortSignal | None = None) -> None:
        self.run_id = run_id
        self.epoch = epoch
        # Aborts when this claim no longer owns the run (lease lost, or the epoch moved on).
        self.signal = signal
        # Aborts with RUN_CANCEL_REASON once a cancel is recorded for the run, by any process: the
        # claim's watcher reads the record as often as the lease is renewed.
        self.cancel_signal = cancel_signal if cancel_signal is not None else AbortController().signal
        # What a drive under this claim stops on: either of the two.
        self.run_signal = AbortSignal.any([signal, self.cancel_signal])
        self._lost: RunClaimLostError | None = None
        self._suppression_logged = False

    @property
    def lost(self) -> bool:
        """Whether this claim no longer owns the run: a write was refused, or the lease is gone."""
        return self._lost is not None or self.signal.aborted

    @property
    def error(self) -> RunClaimLostError | None:
        """The error the latch holds, once a write of this claim was refused."""
        return self._lost

    @property
    def superseded(self) -> bool:
        """Whether a write of this claim was refused (the latch is set); a lost lease alone does not set it."""
        return self._lost is not None

    def check(self) -> None:
        """Raise the latched ``RunClaimLostError``; a lost lease latches first."""
        if self._lost is None and self.signal.aborted:
            self._lost = RunClaimLostError(self.run_id, self.epoch, LEASE_LOST)
        if self._lost is not None:
            raise self._lost

    def latch(self, error: RunClaimLostError) -> RunClaimLostError:
        """Set the latch (once) and return the error it holds."""
        if self._lost is None:
            self._lost = error
        return self._lost

    def __repr__(self) -> str:
        return f"RunClaim(run_id={self.run_id!r}, epoch={self.epoch}, lost={self.lost})"


async def _mirror_lease(lease: LeaseSignal, lost: AbortController, run_id: str, epoch: int) -> None:
    await lease.wait()
    lost.abort(RunClaimLostError(run_id, epoch, LEASE_LOST))


async def _watch_record(
    runs: RunStore, claim: RunClaim, lost: AbortController, cancel: AbortController, interval_s: float
) -> None:
    """Every ``interval_s`` (with the lease renewal) read the claim's record: an epoch that moved on
    latches the claim and aborts ``claim.signal``; a recorded cancel aborts ``claim.cancel_signal``.

    A store that cannot be read says nothing (the claim counts as held, R53); the next round asks again.
    """
    while not lost.signal.aborted:
        try:
            record = await runs.get(claim.run_id)
        except Exception as exc:
            _log(_logger, logging.DEBUG, "run %r: claim watch could not read the record: %s", claim.run_id, exc)
            record = None
        if record is not None:
            if record.driver_epoch != claim.epoch:
                lost.abort(claim.latch(RunClaimLostError(claim.run_id, claim.epoch, record.driver_epoch)))
                return
            if record.cancel_requested is True and not cancel.signal.aborted:
                cancel.abort(RUN_CANCEL_REASON)
        await asyncio.sleep(max(interval_s, 0.001))


@contextlib.asynccontextmanager
async def run_claim(
    runs: RunStore,
    locks: LockStore,
    run_id: str,
    *,
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    admit: Callable[[RunRecord], None] | None = None,
    watch_interval_s: float | None = None,
) -> AsyncIterator[RunClaim]:
    """``async with run_claim(runs, locks, run_id) as claim:`` claims ``run_id`` for the block (R51).

    The block runs holding ``hold_lock(locks, "run-driver:<run id>")``, released however it
    ends. An unknown run raises ``RunClaimNotAcquiredError(run_id, "unknown")``, a terminal
    one ``"terminal"``; ``admit(record)`` may refuse too (raising), still before anything is
    written. Otherwise ``driver_epoch`` becomes (old or 0) + 1, itself a compare-and-set on
    the old value (``"superseded"`` if it moved), and the block gets a ``RunClaim`` at that
    epoch. A watcher task the block owns (cancelled and awaited on exit) aborts
    ``claim.signal`` the moment the lease is lost or the stored epoch moves on, and
    ``claim.cancel_signal`` once a cancel is recorded, checked every ``watch_interval_s``
    (default: the lease renewal interval, a third of ``lease_ttl_ms``).
    """
    async with hold_lock(locks, run_driver_lock_key(run_id), ttl_ms=lease_ttl_ms) as lease:
        record = await runs.get(run_id)
        if record is None:
            raise RunClaimNotAcquiredError(run_id, "unknown")
        if is_terminal_status(record.status):
            raise RunClaimNotAcquiredError(run_id, "terminal")
        if admit is not None:
            admit(record)
        epoch = (record.driver_epoch or 0) + 1
        try:
            bumped = await runs.update(run_id, RunPatch(driver_epoch=epoch), expected_epoch=record.driver_epoch)
        except EpochFencedError:
            # Someone bumped it without the lock (or through an expired lease): theirs is the newer claim.
            raise RunClaimNotAcquiredError(run_id, "superseded") from None
        if bumped is None:
            raise RunClaimNotAcquiredError(run_id, "unknown")
        lost, cancel = AbortController(), AbortController()
        claim = RunClaim(run_id, epoch, lost.signal, cancel.signal)
        if lease.lost:
            lost.abort(RunClaimLostError(run_id, epoch, LEASE_LOST))
        interval = lease_ttl_ms / 3 / 1000 if watch_interval_s is None else watch_interval_s
        loop = asyncio.get_running_loop()
        # Owned by this block: cancelled and awaited on its exit, however it ends.
        watchers = [
            loop.create_task(_mirror_lease(lease, lost, run_id, epoch), name=f"boxwright claim lease {run_id}"),
            loop.create_task(
                _watch_record(runs, claim, lost, cancel, interval), name=f"boxwright claim watch {run_id}"
            ),
        ]
        try:
            yield claim
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.wait(watchers)


async def with_run_claim(
    runs: RunStore,
    locks: LockStore,
    run_id: str,
    fn: Callable[[RunClaim], Awaitable[T]],
    *,
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    admit: Callable[[RunRecord], None] | None = None,
) -> T:
    """``fn(claim)`` inside ``async with run_claim(...)`` (R51); returns what ``fn`` returns."""
    async with run_claim(runs, locks, run_id, lease_ttl_ms=lease_ttl_ms, admit=admit) as claim:
        return await fn(claim)


QuietSince = tuple[str, float]
"""(a tail offset of the log, the ``time.monotonic()`` just before it was read): a quiet window's start."""


async def log_quiet_since(log: EventLog, run_id: str) -> QuietSince | None:
    """Where a quiet window may start now: the log's tail and the time; ``None`` if the log cannot say."""
    started = time.monotonic()
    try:
        return await log.tail(run_id), started
    except Exception as exc:
        _log(_logger, logging.DEBUG, "run %r: no tail to start a quiet window from: %s", run_id, exc)
        return None


async def await_log_quiescence(
    log: EventLog,
    run_id: str,
    quiet_ms: float,
    *,
    probes: int = DEFAULT_QUIESCENCE_PROBES,
    since: QuietSince | None = None,
    signal: AbortSignal | None = None,
) -> str:
    """Wait until ``run_id``'s log stops growing: the same tail twice, ``quiet_ms`` apart (R52).

    Returns that tail offset (an empty log's is ``format_offset(run_id, 0)``). Compares
    ``tail()`` rather than ``snapshot()`` lengths: the same question, without reading the
    whole log up to ``probes + 1`` times. Never ``read()``s. After ``probes`` sleeps with
    the log still growing, raises ``RunLogNotQuiescentError``: a predecessor is still live.

    ``since`` (``log_quiet_since``, taken earlier): the first window started then, so it only
    waits for what is left of it. Sound because a log only grows: the same tail at both ends
    means not one append in between, however long ago the first was read. A successor takes it
    before it waits for the dead driver's lease, so the lease wait and the window overlap
    instead of adding up; a log that moved meanwhile gets a whole window from its new tail.

    ``signal`` (the run stopped: a cancel, a failure, the claim lost) ends the wait at once with
    the tail as it is: a stopped run appends only its closing error, and that append is fenced at
    the successor's epoch like every other, so a predecessor still writing cannot interleave with it.
    """
    quiet_s = max(quiet_ms, 0) / 1000
    if since is None:
        previous, started = await log.tail(run_id), time.monotonic()
    else:
        previous, started = since
    for _ in range(probes):
        fault_point("takeover.quiet-window")
        await sleep_unless_aborted(max(started + quiet_s - time.monotonic(), 0), signal)
        if signal is not None and signal.aborted:
            return await log.tail(run_id)
        started = time.monotonic()
        current = await log.tail(run_id)
        if current == previous:
            return current
        previous = current
    raise RunLogNotQuiescentError(run_id, quiet_ms, probes)


class _FencedEventLog:
    """``log`` with the claim's appends fenced: latch or lost lease -> refused before any I/O; otherwise the
    store's compare-and-set at the claim's epoch, whose refusal latches. Other runs pass through."""

    def __init__(self, log: EventLog, claim: RunClaim) -> None:
        self._log = log
        self._claim = claim

    async def append(self, run_id: str, events: Sequence[Event], *, epoch: int | None = None) -> list[str]:
        claim = self._claim
        if run_id != claim.run_id:
            return await self._log.append(run_id, events, epoch=epoch)
        claim.check()
        try:
            return await self._log.append(run_id, events, epoch=claim.epoch)
        except RunClaimLostError as exc:
            raise claim.latch(exc) from None
        except EpochFencedError as exc:
            raise claim.latch(RunClaimLostError(run_id, claim.epoch, exc.stored_epoch)) from exc

    def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        return self._log.read(run_id, after, signal=signal, live=live)

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[Event]:
        return await self._log.snapshot(run_id, limit)

    async def tail(self, run_id: str) -> str:
        return await self._log.tail(run_id)

    async def close(self, run_id: str) -> None:
        # Our logs refuse appends once closed, so a superseded claim closing the log would end its
        # successor's run; pipe_to_run_log skips close when an append is refused, this covers a
        # suppressed status write. A lost lease alone does not skip it: a status that landed is closed.
        if run_id == self._claim.run_id and self._claim.superseded:
            return
        await self._log.close(run_id)

    async def is_closed(self, run_id: str) -> bool:
        return await self._log.is_closed(run_id)


class _FencedRunStore:
    """``runs`` with the claim's terminal status writes fenced (R55); everything else passes through."""

    def __init__(self, runs: RunStore, claim: RunClaim, logger: logging.Logger) -> None:
        self._runs = runs
        self._claim = claim
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        # Optional store features (list_by_thread, list_reclaimable) exist here only if they exist there.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._runs, name)

    async def get(self, run_id: str) -> RunRecord | None:
        return await self._runs.get(run_id)

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        return await self._runs.create_or_resume(run_id, thread_id, started_at=started_at)

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        return await self._runs.find_active_run(thread_id)

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        claim = self._claim
        if run_id != claim.run_id or not is_terminal_status(patch.status):
            return await self._runs.update(run_id, patch, expected_epoch=expected_epoch)
        try:
            claim.check()
            return await self._runs.update(run_id, patch, expected_epoch=claim.epoch)
        except EpochFencedError as exc:
            lost = claim.latch(
                exc if isinstance(exc, RunClaimLostError) else RunClaimLostError(run_id, claim.epoch, exc.stored_epoch)
            )
        # Suppressed, not failed: a lost claim must never mark its successor's live run finished.
        level = logging.DEBUG if claim._suppression_logged else logging.WARNING
        claim._suppression_logged = True
        _log(self._logger, level, "suppressed a terminal status %r for run %r: %s", patch.status, run_id, lost)
        try:
            return await self._runs.get(run_id)
        except Exception as exc:
            _log(self._logger, logging.ERROR, "run %r: could not re-read its record: %s", run_id, exc)
            return None


def fence_event_log(log: EventLog, claim: RunClaim) -> EventLog:
    """``log`` whose appends for ``claim.run_id`` land only while the claim holds (R53-R54).

    Lease lost or latch set: ``RunClaimLostError`` before any I/O. Otherwise the append runs
    at ``claim.epoch`` (whatever epoch the caller passed), a compare-and-set in the store;
    a refusal latches the claim and raises ``RunClaimLostError`` (an ``EpochFencedError``,
    so ``pipe_to_run_log`` stops without another write). ``read``/``snapshot``/``tail`` pass
    through; ``close`` too, except that a superseded claim's close is skipped.
    """
    return _FencedEventLog(log, claim)


def fence_run_store(runs: RunStore, claim: RunClaim, *, logger: logging.Logger | None = None) -> RunStore:
    """``runs`` whose terminal status writes for ``claim.run_id`` land only while the claim holds (R55).

    Such a write checks the latch, then the lease, then runs as ``update(...,
    expected_epoch=claim.epoch)``. A lost claim's write is SUPPRESSED: nothing is written,
    the claim latches, one WARNING says so (later ones are DEBUG), and the stored record
    is returned (``None`` if it cannot be read). Any other store error propagates (it does
    not suppress). Non-terminal patches, other runs and reads pass through unchanged;
    optional methods exist only where ``runs`` has them.
    """
    return _FencedRunStore(runs, claim, logger or _logger)


async def pipe_claimed(
    stream: AsyncIterable[Event],
    runs: RunStore,
    log: EventLog,
    claim: RunClaim,
    thread_id: str,
    *,
    signal: AbortSignal | None = None,
    logger: logging.Logger | None = None,
    detached: Callable[[], bool] | None = None,
    after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
) -> RunRecord:
    """``pipe_to_run_log`` under ``claim``: both fences at the ACQUIRED epoch; ``signal`` defaults to the
    claim's ``run_signal`` (a lost claim, or a cancel recorded by any process).

    ``detached`` is ``pipe_to_run_log``'s detach verdict (R39), passed on. ``after_terminal(record)``
    runs once the terminal status landed at the claim's epoch (never for a superseded claim): the
    place for side effects that must follow the durable end, such as removing the journal.
    """

    async def landed(record: RunRecord) -> None:
        # The write was a compare-and-set at our epoch and the run is terminal now, so no successor
        # can claim it any more; still, a latch set meanwhile means someone else owns what follows.
        if after_terminal is not None and not claim.superseded and record.driver_epoch == claim.epoch:
            await after_terminal(record)

    return await pipe_to_run_log(
        stream,
        fence_run_store(runs, claim, logger=logger),
        fence_event_log(log, claim),
        claim.run_id,
        thread_id,
        claim.run_signal if signal is None else signal,
        claim.epoch,
        logger=logger,
        detached=detached,
        after_terminal=landed,
    )


# -- the run driver and the resume driver (R56-R58) ------------------------------------------------


async def _close_quietly(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def _raising(exc: Exception) -> AsyncIterator[Event]:
    raise exc
    yield  # pragma: no cover - makes this an async generator


def start_drive(drive: Drive, run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterable[Event]:
    """``drive(...)``, a synchronous raise turned into a stream that raises (the run then fails like any other)."""
    try:
        return drive(run_id, thread_id, signal)
    except Exception as exc:
        return _raising(exc)


class SandboxRunDriver:
    """The supported way to drive a run another host started (R56): ``claim`` then ``pipe`` inside it.

    ``async with driver.claim(run_id) as claim:`` holds ``run_claim`` on ``run_id`` for the
    block (``await driver.claim(run_id, fn)`` is the same with a callback). Inside it,
    ``await driver.pipe(stream, run_id, thread_id)`` waits for the log to go quiet, then
    drives ``stream`` with both fences at the acquired epoch; outside a claim on ``run_id``
    it raises ``RunDriverPipeOutsideClaimError``. ``resume(run_id)`` is the whole resume
    driver (R58).
    """

    def __init__(
        self,
        runs: RunStore,
        locks: LockStore,
        log: EventLog,
        drive: Drive,
        *,
        fence_quiet_ms: float = DEFAULT_FENCE_QUIET_MS,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        logger: logging.Logger | None = None,
        after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
    ) -> None:
        self.runs = runs
        self.locks = locks
        self.log = log
        self.drive = drive
        self.fence_quiet_ms = fence_quiet_ms
        self.lease_ttl_ms = lease_ttl_ms
        self.logger = logger or _logger
        # Called once a resumed run's terminal record landed at this driver's epoch (its journal cleanup).
        self.after_terminal = after_terminal
        # The claims held through this driver, by run id: the lock makes one claim per run at a time.
        self._held: dict[str, list[RunClaim]] = {}
        # The latest claim taken through this driver, by run id, kept after its block ended: whoever
        # started the drive reads whether it ended by losing the claim (``last_claim``).
        self._last: dict[str, RunClaim] = {}

    def held_claim(self, run_id: str) -> RunClaim | None:
        """The claim on ``run_id`` held through this driver, if any (the innermost, if nested)."""
        held = self._held.get(run_id)
        return held[-1] if held else None

    def last_claim(self, run_id: str) -> RunClaim | None:
        """The latest claim on ``run_id`` taken through this driver, held or not (``None``: never claimed)."""
        return self._last.get(run_id)

    @overload
    def claim(self, run_id: str) -> AbstractAsyncContextManager[RunClaim]: ...

    @overload
    def claim(self, run_id: str, fn: Callable[[RunClaim], Awaitable[T]]) -> Awaitable[T]: ...

    def claim(
        self, run_id: str, fn: Callable[[RunClaim], Awaitable[T]] | None = None
    ) -> AbstractAsyncContextManager[RunClaim] | Awaitable[T]:
        if fn is None:
            return self._claimed(run_id)
        return self._call_claimed(run_id, fn)

    async def _call_claimed(self, run_id: str, fn: Callable[[RunClaim], Awaitable[T]]) -> T:
        async with self._claimed(run_id) as claim:
            return await fn(claim)

    @contextlib.asynccontextmanager
    async def _claimed(self, run_id: str) -> AsyncIterator[RunClaim]:
        async with run_claim(self.runs, self.locks, run_id, lease_ttl_ms=self.lease_ttl_ms) as claim:
            held = self._held.setdefault(run_id, [])
            held.append(claim)
            self._last[run_id] = claim
            try:
                yield claim
            finally:
                held.remove(claim)
                if not held and self._held.get(run_id) is held:
                    del self._held[run_id]

    async def pipe(
        self,
        stream: AsyncIterable[Event],
        run_id: str,
        thread_id: str,
        *,
        detached: Callable[[], bool] | None = None,
        claim: RunClaim | None = None,
        after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
        quiet_since: QuietSince | None = None,
        stop: AbortSignal | None = None,
    ) -> RunRecord:
        """Drive ``stream`` under ``claim`` (default: the one held on ``run_id``); see ``pipe_claimed``.

        First the log must have been quiet for ``fence_quiet_ms``, counted from ``quiet_since``
        (``log_quiet_since``, taken before the claim) when given (see ``await_log_quiescence``); the
        claim's signal, or ``stop`` (the caller's own stop of the run), ends that wait early."""
        claim = claim if claim is not None else self.held_claim(run_id)
        if claim is None or claim.run_id != run_id:
            await _close_quietly(stream)
            raise RunDriverPipeOutsideClaimError(run_id)
        try:
            stopped = claim.run_signal if stop is None else AbortSignal.any([claim.run_signal, stop])
            await await_log_quiescence(self.log, run_id, self.fence_quiet_ms, since=quiet_since, signal=stopped)
        except BaseException:
            await _close_quietly(stream)
            raise
        return await pipe_claimed(
            stream,
            self.runs,
            self.log,
            claim,
            thread_id,
            logger=self.logger,
            detached=detached,
            after_terminal=after_terminal,
        )

    async def resume(self, run_id: str, *, stop: AbortSignal | None = None) -> bool:
        """The resume driver (R58): claim ``run_id`` and drive it on; ``True`` iff it was driven. Never raises.

        ``stop``: the caller's own stop of the run (its drive sees it too), which ends the quiet window early.

        No run id, an unreadable store or status, no record, a terminal record, or a
        recorded cancel drive nothing. Inside the claim ``detached_since`` is cleared
        (a failure is logged, not fatal), then ``drive(run_id, record.thread_id,
        claim.signal)`` is piped. Claim refusals and losses are logged at DEBUG.
        """
        logger = self.logger
        if not isinstance(run_id, str) or not run_id:
            _log(logger, logging.WARNING, "resume: no run id given; driving nothing")
            return False
        try:
            record = await self.runs.get(run_id)
        except Exception as exc:
            _log(logger, logging.ERROR, "resume of run %r: could not read its record: %s", run_id, exc)
            return False
        if record is None:
            _log(logger, logging.DEBUG, "resume of run %r: no such run; driving nothing", run_id)
            return False
        if not is_run_status(record.status):
            _log(logger, logging.ERROR, "resume of run %r: invalid status %r", run_id, record.status)
            return False
        if is_terminal_status(record.status):
            _log(logger, logging.DEBUG, "resume of run %r: already %s", run_id, record.status)
            return False
        if record.cancel_requested is True:
            # Its status is still running, but a cancel was asked for: driving it would resurrect it.
            _log(logger, logging.DEBUG, "resume of run %r: a cancel is recorded; driving nothing", run_id)
            return False
        thread_id = record.thread_id
        # Before the claim, which waits out a dead driver's lease: the quiet window runs meanwhile.
        quiet_since = await log_quiet_since(self.log, run_id)

        try:
            async with self.claim(run_id) as claim:
                try:
                    # At the claim's epoch: a successor that already bumped it keeps its own stamp.
                    await self.runs.update(run_id, RunPatch(detached_since=None), expected_epoch=claim.epoch)
                except EpochFencedError as exc:
                    raise claim.latch(RunClaimLostError(run_id, claim.epoch, exc.stored_epoch)) from None
                except Exception as exc:
                    _log(logger, logging.WARNING, "resume of run %r: could not clear detached_since: %s", run_id, exc)
                stream = start_drive(self.drive, run_id, thread_id, claim.run_signal)
                await self.pipe(
                    stream,
                    run_id,
                    thread_id,
                    claim=claim,
                    after_terminal=self.after_terminal,
                    quiet_since=quiet_since,
                    stop=stop,
                )
        except (RunClaimNotAcquiredError, RunClaimLostError) as exc:
            _log(logger, logging.DEBUG, "resume of run %r: not driven: %s", run_id, exc)
            return False
        except Exception as exc:
            _log(logger, logging.ERROR, "resume of run %r failed: %s", run_id, exc)
            return False
        return True


def sandbox_run_driver(
    runs: RunStore,
    locks: LockStore,
    log: EventLog,
    drive: Drive,
    *,
    fence_quiet_ms: float = DEFAULT_FENCE_QUIET_MS,
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    logger: logging.Logger | None = None,
    after_terminal: Callable[[RunRecord], Awaitable[object]] | None = None,
) -> SandboxRunDriver:
    """A ``SandboxRunDriver`` over one run store, lock store and event log (R56)."""
    return SandboxRunDriver(
        runs,
        locks,
        log,
        drive,
        fence_quiet_ms=fence_quiet_ms,
        lease_ttl_ms=lease_ttl_ms,
        logger=logger,
        after_terminal=after_terminal,
    )


async def resume_run(
    runs: RunStore,
    locks: LockStore,
    log: EventLog,
    drive: Drive,
    run_id: str,
    *,
    fence_quiet_ms: float = DEFAULT_FENCE_QUIET_MS,
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    logger: logging.Logger | None = None,
) -> bool:
    """The resume driver (R58): ``sandbox_run_driver(...).resume(run_id)``. Never raises; ``True`` iff driven."""
    driver = sandbox_run_driver(
        runs, locks, log, drive, fence_quiet_ms=fence_quiet_ms, lease_ttl_ms=lease_ttl_ms, logger=logger
    )
    return await driver.resume(run_id)
