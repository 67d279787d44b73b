"""The reaper: close out runs whose viewer left, and reclaim their sandboxes.

A detached run (its client disconnected, ``detached_since`` stamped, the agent still
running in its sandbox) is nobody's to finish until a viewer resumes it. The app
schedules ``reap_detached_runs`` (a cron route, a lifespan task); nothing here runs by
itself. It learns whether a run finished OUT OF BAND (``has_finished``, usually the
journal's exit sentinel via ``has_finished_via_journal``) and never drives a run to find
out: driving always ends in a terminal status and a closed log, which on a live run is a
false transcript and a run that leaves ``list_reclaimable`` for good.

Per listed run: a finished one is claimed, replayed into its log (``drive``, the same one
the resume route uses) and so finalized; one detached longer than ``detached_run_ttl_ms``
is cancelled and driven for at most ``run_budget_ms``, whatever its state (``expired``);
anything else is left alone. A run that ended terminal gets its sandbox reclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Final, Literal, TypeAlias

import msgspec

from .abort import AbortController, AbortSignal
from .definition import DESTROY_TIMEOUT_S
from .errors import RunClaimLostError, RunClaimNotAcquiredError, SandboxReclaimFailedError
from .events import Event
from .journal import (
    DEFAULT_EXIT_PROBE_BYTES,
    DEFAULT_ORPHAN_TTL_MS,
    Finished,
    Producing,
    PruneJournalsResult,
    RunExitProbe,
    Unknown,
    journal_dir_of,
    journal_paths,
    probe_run_exit,
    prune_journals,
)
from .runs import EventLog, RunRecord, RunStatus, RunStore, is_terminal_status, request_run_cancel
from .sandbox import DestroyInput, ResumeInput, SandboxHandle, SandboxProvider
from .stores.base import DEFAULT_LEASE_TTL_MS, LockStore, SandboxInstanceStore
from .takeover import (
    DEFAULT_FENCE_QUIET_MS,
    RunClaim,
    await_log_quiescence,
    pipe_claimed,
    start_drive,
    with_run_claim,
)

_logger = logging.getLogger("boxwright.reaper")

DEFAULT_RUN_BUDGET_MS = 30_000
DEFAULT_MAX_RUNS = 25

ReapRunOutcome: TypeAlias = Literal[
    "finalized", "expired", "producing", "unknown", "budget-exceeded", "not-claimed", "reclaim-failed", "failed"
]
REAP_OUTCOMES: Final[tuple[ReapRunOutcome, ...]] = (
    "finalized",
    "expired",
    "producing",
    "unknown",
    "budget-exceeded",
    "not-claimed",
    "reclaim-failed",
    "failed",
)
ReclaimOutcome: TypeAlias = Literal["destroyed", "destroy-failed", "no-sandbox-key", "not-found", "provider-mismatch"]

HasFinished = Callable[[RunRecord], Awaitable[RunExitProbe]]
HandleFor = Callable[[RunRecord], Awaitable[SandboxHandle | None]]
Reclaim = Callable[[RunRecord], Awaitable[object]]
# Removes the journals of a run the sweep just ended (its record is terminal): ``journal_pruner``.
Prune = Callable[[RunRecord], Awaitable[object]]
# The same drive the resume route uses: (run_id, thread_id, signal) -> the run's events.
ReapDrive = Callable[[str, str, AbortSignal], AsyncIterable[Event]]


class ReapRunEntry(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """What the sweep did with one run. ``error`` describes the failure, refusal or unknown probe."""

    run_id: str
    outcome: ReapRunOutcome
    status: RunStatus | None = None
    exit_code: int | None = None
    # Set exactly when the budget ran out on a run the probe called finished: is the record terminal anyway?
    terminalized_anyway: bool | None = None
    error: str | None = None


class LeakEntry(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """A leaked provider object the sweep found (a container, an image): removed, or why not."""

    kind: str
    id: str
    reason: str
    removed: bool = False
    error: str | None = None


# Finds (and removes) what no run record leads to: containers whose host died, images nobody uses
# (``docker_reap.docker_leak_sweeper``), cloud sandboxes whose lease ran out (``cloud_reap.cloud_leak_sweeper``).
# One call per sweep, after the runs.
SweepLeaks = Callable[[], Awaitable[Sequence[LeakEntry]]]


def _empty_outcomes() -> dict[str, int]:
    return dict.fromkeys(REAP_OUTCOMES, 0)


class ReapResult(msgspec.Struct, rename="camel", kw_only=True):
    """``considered`` runs (after the ``max_runs`` cap), ``probed`` by ``has_finished``; a tally of every outcome."""

    considered: int = 0
    probed: int = 0
    outcomes: dict[str, int] = msgspec.field(default_factory=_empty_outcomes)
    runs: list[ReapRunEntry] = msgspec.field(default_factory=list)
    # What ``sweep_leaks`` found, and why it could not look (a daemon that does not answer).
    leaks: list[LeakEntry] = msgspec.field(default_factory=list)
    leak_error: str | None = None


class ReclaimResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    outcome: ReclaimOutcome
    sandbox_key: str | None = None
    error: str | None = None


def _log(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    # The sweep never raises; neither may its logging.
    with contextlib.suppress(Exception):
        logger.log(level, message, *args)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- has_finished ---------------------------------------------------------------------------------


def has_finished_via_journal(
    handle_for: HandleFor, *, journal_dir: str | None = None, max_bytes: int = DEFAULT_EXIT_PROBE_BYTES
) -> HasFinished:
    """A ``has_finished`` that reads the run's journal tail for its exit sentinel (``probe_run_exit``).

    ``handle_for(record)`` maps a run to a live handle on its sandbox (``sandbox_handle_for``
    does it from ``sandbox_key``). Anything it cannot answer (no handle, a raising lookup, a
    failed read) is ``Unknown``, never ``Finished``: "finished" destroys the sandbox.
    ``journal_dir`` None reads where the handle keeps its journals (``journal_dir_of``).
    """

    async def has_finished(record: RunRecord) -> RunExitProbe:
        try:
            handle = await handle_for(record)
            if handle is None:
                return Unknown(f"no sandbox handle for run {record.run_id!r} (sandbox key {record.sandbox_key!r})")
            paths = journal_paths(record.run_id, journal_dir or journal_dir_of(handle))
            return await probe_run_exit(handle, paths, max_bytes=max_bytes)
        except Exception as exc:
            return Unknown(_describe(exc))

    return has_finished


def journal_pruner(
    handle_for: HandleFor,
    runs: RunStore,
    *,
    journal_dir: str | None = None,
    orphan_ttl_ms: int = DEFAULT_ORPHAN_TTL_MS,
) -> Prune:
    """A ``prune`` for ``reap_detached_runs``: ``prune_journals`` on the sandbox of a run the sweep ended.

    It removes the journals of every terminal run of that sandbox (the one just finalized
    among them), and orphans older than ``orphan_ttl_ms``; nothing of a run still going.
    No handle for the record: nothing to prune (``None``).
    """

    async def prune(record: RunRecord) -> PruneJournalsResult | None:
        handle = await handle_for(record)
        if handle is None:
            return None
        return await prune_journals(handle, runs, dir=journal_dir, orphan_ttl_ms=orphan_ttl_ms)

    return prune


def sandbox_handle_for(provider: SandboxProvider, instances: SandboxInstanceStore) -> HandleFor:
    """Maps a run record to a handle on its sandbox: ``sandbox_key`` -> instance record -> ``provider.resume``.

    ``None`` when the run has no key, the key no record, or the record another provider.
    """

    async def handle_for(record: RunRecord) -> SandboxHandle | None:
        if record.sandbox_key is None:
            return None
        instance = await instances.get(record.sandbox_key)
        if instance is None or instance.provider != provider.name:
            return None
        return await provider.resume(ResumeInput(id=instance.provider_sandbox_id))

    return handle_for


# -- reclaim (R70-R71) ----------------------------------------------------------------------------


async def reclaim_sandbox(
    record: RunRecord,
    provider: SandboxProvider,
    instances: SandboxInstanceStore,
    *,
    logger: logging.Logger | None = None,
) -> ReclaimResult:
    """Destroy the sandbox behind ``record.sandbox_key`` and forget it (R70).

    No key: ``no-sandbox-key``. ``instances.get`` errors propagate. No instance record:
    ``not-found``. A record of another provider: ``provider-mismatch``, nothing touched.
    Otherwise ``provider.destroy`` (its error caught, bounded by 60 s) and then ALWAYS
    ``instances.delete`` (its error propagates): ``destroy-failed`` or ``destroyed``.
    """
    logger = logger or _logger
    key = record.sandbox_key
    if key is None:
        return ReclaimResult(outcome="no-sandbox-key")
    instance = await instances.get(key)
    if instance is None:
        return ReclaimResult(outcome="not-found", sandbox_key=key)
    if instance.provider != provider.name:
        return ReclaimResult(
            outcome="provider-mismatch",
            sandbox_key=key,
            error=f"the sandbox is {instance.provider!r}'s, this provider is {provider.name!r}",
        )
    error: str | None = None
    try:
        await asyncio.wait_for(provider.destroy(DestroyInput(id=instance.provider_sandbox_id)), DESTROY_TIMEOUT_S)
    except Exception as exc:
        error = _describe(exc)
        _log(logger, logging.WARNING, "run %r: destroying sandbox %r failed: %s", record.run_id, key, error)
    # Forgotten even after a failed destroy: a record left behind would be resumed by the next run of the thread.
    await instances.delete(key)
    if error is not None:
        return ReclaimResult(outcome="destroy-failed", sandbox_key=key, error=error)
    return ReclaimResult(outcome="destroyed", sandbox_key=key)


def sandbox_reclaimer(
    provider: SandboxProvider, instances: SandboxInstanceStore, *, logger: logging.Logger | None = None
) -> Callable[[RunRecord], Awaitable[ReclaimResult]]:
    """A ``reclaim`` for ``reap_detached_runs`` (R71): ``reclaim_sandbox``, raising on ``destroy-failed``.

    ``destroy-failed`` logs an error and raises ``SandboxReclaimFailedError`` (so the sweep
    reports ``reclaim-failed``); every other outcome is logged at DEBUG and returned.
    """
    log = logger or _logger

    async def reclaim(record: RunRecord) -> ReclaimResult:
        result = await reclaim_sandbox(record, provider, instances, logger=log)
        if result.outcome == "destroy-failed":
            key = result.sandbox_key or ""
            _log(log, logging.ERROR, "run %r: sandbox %r is still up: %s", record.run_id, key, result.error)
            raise SandboxReclaimFailedError(record.run_id, key, result.error or "")
        _log(log, logging.DEBUG, "run %r: reclaim %s (%s)", record.run_id, result.outcome, result.sandbox_key)
        return result

    return reclaim


# -- the sweep (R64-R68) --------------------------------------------------------------------------


class _Sweep:
    def __init__(
        self,
        runs: RunStore,
        locks: LockStore,
        log: EventLog,
        has_finished: HasFinished,
        drive: ReapDrive,
        now_ms: int,
        detached_run_ttl_ms: int,
        run_budget_ms: int,
        fence_quiet_ms: float,
        reclaim: Reclaim | None,
        lease_ttl_ms: int,
        logger: logging.Logger,
        prune: Prune | None = None,
    ) -> None:
        self.runs = runs
        self.locks = locks
        self.log = log
        self.has_finished = has_finished
        self.drive = drive
        self.cutoff = now_ms - detached_run_ttl_ms
        self.run_budget_ms = run_budget_ms
        self.fence_quiet_ms = fence_quiet_ms
        self.reclaim = reclaim
        self.prune = prune
        self.lease_ttl_ms = lease_ttl_ms
        self.logger = logger
        self.result = ReapResult()

    def is_expired(self, detached_since: int | None) -> bool:
        return detached_since is not None and detached_since <= self.cutoff

    async def probe(self, record: RunRecord) -> RunExitProbe:
        self.result.probed += 1
        try:
            probe = await self.has_finished(record)
        except Exception as exc:
            return Unknown(_describe(exc))
        if isinstance(probe, (Finished, Producing, Unknown)):
            return probe
        return Unknown(f"has_finished returned {type(probe).__name__}, not a RunExitProbe")

    async def reap(self, record: RunRecord) -> ReapRunEntry:
        run_id = record.run_id
        expired = self.is_expired(record.detached_since)
        exit_code: int | None = None
        if not expired:
            probe = await self.probe(record)
            if isinstance(probe, Producing):
                return ReapRunEntry(run_id=run_id, outcome="producing")
            if isinstance(probe, Unknown):
                return ReapRunEntry(run_id=run_id, outcome="unknown", error=probe.error)
            exit_code = probe.exit_code

        def admit(current: RunRecord) -> None:
            # Expiry is re-derived under the lock from the record as it is now: a viewer that
            # came back cleared (or renewed) detached_since, and its run must not be cancelled.
            if expired and not self.is_expired(current.detached_since):
                raise RunClaimNotAcquiredError(run_id, "superseded")

        async def claimed(claim: RunClaim) -> tuple[RunRecord, bool]:
            if expired:
                await request_run_cancel(self.runs, run_id)
            await await_log_quiescence(self.log, run_id, self.fence_quiet_ms)
            # Armed only now: a budget running through the lock wait and the quiet window would
            # abort a finished run's replay before its first event.
            budget = AbortController()
            timer = asyncio.get_running_loop().call_later(
                self.run_budget_ms / 1000,
                budget.abort,
                TimeoutError(f"the reaper's run budget of {self.run_budget_ms}ms ran out"),
            )
            try:
                signal = AbortSignal.any([claim.signal, budget.signal])
                stream = start_drive(self.drive, run_id, record.thread_id, signal)
                final = await pipe_claimed(
                    stream, self.runs, self.log, claim, record.thread_id, signal=signal, logger=self.logger
                )
            finally:
                timer.cancel()
            if claim.error is not None:
                # A write was refused: whatever the record says now, it is not this sweep's doing.
                raise claim.error
            return final, budget.signal.aborted

        try:
            final, budget_fired = await with_run_claim(
                self.runs, self.locks, run_id, claimed, lease_ttl_ms=self.lease_ttl_ms, admit=admit
            )
        except (RunClaimNotAcquiredError, RunClaimLostError) as exc:
            return ReapRunEntry(run_id=run_id, outcome="not-claimed", exit_code=exit_code, error=_describe(exc))
        entry = self.classify(record, final, expired, budget_fired, exit_code)
        if self.prune is not None and is_terminal_status(final.status):
            # After the terminal record, never before: a journal is what a successor replays.
            try:
                await self.prune(record)
            except Exception as exc:
                _log(self.logger, logging.WARNING, "reaper: run %r: pruning its journals failed: %s", run_id, exc)
        if self.reclaim is not None and is_terminal_status(final.status):
            try:
                # The LISTED record: it carries the sandbox_key that the record rebuilt after a failed write lacks.
                await self.reclaim(record)
            except Exception as exc:
                entry.outcome = "reclaim-failed"
                entry.error = _describe(exc)
        return entry

    def classify(
        self, record: RunRecord, final: RunRecord, expired: bool, budget_fired: bool, exit_code: int | None
    ) -> ReapRunEntry:
        entry = ReapRunEntry(run_id=record.run_id, outcome="finalized", status=final.status, exit_code=exit_code)
        if budget_fired and not expired:
            # The probe said finished, yet the replay did not end in time: a misbehaving read or log.
            entry.outcome = "budget-exceeded"
            entry.terminalized_anyway = is_terminal_status(final.status)
        elif not is_terminal_status(final.status):
            entry.outcome = "not-claimed"
            entry.error = f"the run is still {final.status!r} after the drive"
        elif expired:
            entry.outcome = "expired"
        return entry


async def reap_detached_runs(
    runs: RunStore,
    locks: LockStore,
    log: EventLog,
    *,
    has_finished: HasFinished,
    drive: ReapDrive,
    now_ms: int,
    detached_run_ttl_ms: int,
    run_budget_ms: int = DEFAULT_RUN_BUDGET_MS,
    max_runs: int = DEFAULT_MAX_RUNS,
    fence_quiet_ms: float = DEFAULT_FENCE_QUIET_MS,
    reclaim: Reclaim | None = None,
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
    logger: logging.Logger | None = None,
    prune: Prune | None = None,
    sweep_leaks: SweepLeaks | None = None,
) -> ReapResult:
    """Sweep detached runs once (R64-R68). Never raises; read the ``outcomes`` tally.

    One ``list_reclaimable(now_ms, 0)`` (a store without it: nothing to do, logged), capped
    at ``max_runs``, handled one after another:

    - detached for ``detached_run_ttl_ms`` or more: claim; re-checked under the lock (a
      viewer came back: ``not-claimed``, nothing written); ``request_run_cancel``; driven
      for at most ``run_budget_ms``: ``expired``;
    - otherwise ``has_finished(record)``: ``producing`` and ``unknown`` leave the run
      untouched (no claim, no write, no epoch move); finished: claim, drive: ``finalized``
      (``budget-exceeded`` if the budget ran out, ``terminalized_anyway`` saying whether it
      still ended terminal);
    - the drive waits for the log to go quiet, then pipes ``drive(run_id, thread_id,
      signal)`` under both fences; the signal fires on a lost lease or the budget;
    - a refused or lost claim, or a run still not terminal after it: ``not-claimed``;
    - a terminal run gets ``prune(listed_record)`` (``journal_pruner``: ``prune_journals`` on its
      sandbox; a raise is logged), then ``reclaim(listed_record)``; its raise: ``reclaim-failed``;
    - anything else raising: ``failed``. The reaper never clears ``detached_since``.

    Then ``sweep_leaks()`` (``docker_leak_sweeper``, ``cloud_leak_sweeper``): what it found lands in ``leaks``, its
    raise in ``leak_error``; it runs also when listing the runs failed or found none.
    """
    logger = logger or _logger
    sweep = _Sweep(
        runs,
        locks,
        log,
        has_finished,
        drive,
        now_ms,
        detached_run_ttl_ms,
        run_budget_ms,
        fence_quiet_ms,
        reclaim,
        lease_ttl_ms,
        logger,
        prune,
    )
    result = sweep.result
    await _sweep_runs(sweep, runs, now_ms, max_runs, logger)
    if sweep_leaks is not None:
        try:
            result.leaks = list(await sweep_leaks())
        except Exception as exc:
            result.leak_error = _describe(exc)
            _log(logger, logging.ERROR, "reaper: sweeping leaked sandboxes failed: %s", exc)
        for leak in result.leaks:
            if leak.error is not None:
                _log(logger, logging.WARNING, "reaper: leaked %s %s: %s", leak.kind, leak.id, leak.error)
    return result


async def _sweep_runs(sweep: _Sweep, runs: RunStore, now_ms: int, max_runs: int, logger: logging.Logger) -> None:
    result = sweep.result
    list_reclaimable = getattr(runs, "list_reclaimable", None)
    if not callable(list_reclaimable):
        _log(logger, logging.WARNING, "reaper: %s has no list_reclaimable; nothing to sweep", type(runs).__name__)
        return
    try:
        # ttl 0: every detached run; which of them expired is decided per run, against this sweep's cutoff.
        listed: list[RunRecord] = list(await list_reclaimable(now_ms, 0))
    except Exception as exc:
        _log(logger, logging.ERROR, "reaper: listing detached runs failed: %s", exc)
        return
    candidates = listed[: max(max_runs, 0)]
    result.considered = len(candidates)
    for record in candidates:
        try:
            entry = await sweep.reap(record)
        except Exception as exc:
            _log(logger, logging.ERROR, "reaper: run %r failed: %s", getattr(record, "run_id", record), exc)
            entry = ReapRunEntry(run_id=str(getattr(record, "run_id", "")), outcome="failed", error=_describe(exc))
        result.outcomes[entry.outcome] += 1
        result.runs.append(entry)


__all__ = [
    "DEFAULT_MAX_RUNS",
    "DEFAULT_RUN_BUDGET_MS",
    "REAP_OUTCOMES",
    "HandleFor",
    "HasFinished",
    "LeakEntry",
    "Prune",
    "ReapDrive",
    "ReapResult",
    "ReapRunEntry",
    "ReapRunOutcome",
    "Reclaim",
    "ReclaimOutcome",
    "ReclaimResult",
    "SweepLeaks",
    "has_finished_via_journal",
    "journal_pruner",
    "reap_detached_runs",
    "reclaim_sandbox",
    "sandbox_handle_for",
    "sandbox_reclaimer",
]
