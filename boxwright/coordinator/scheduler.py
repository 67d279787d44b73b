"""The coordinator's periodic work, owned by its lifespan: the inactivity watchdog and the sweep.

Watchdog (decision 4, R34): a run whose log has not grown for ``inactivity_timeout`` seconds is
stopped as a cancel stops it (its sandbox destroyed) and ends ``failed`` with ``WATCHDOG_MESSAGE``
(``SandboxService.fail_run``): its driver writes that one final status, and the cancel is
recorded after. Idle time counts from the log's last event (its stored ``timestamp``), not from
when this replica first looked: a run adopted after being idle for most of the timeout is failed
when the timeout is up, not a whole timeout after its adoption. Two kinds of runs are watched:

- the runs this replica drives (started here or adopted);
- running runs nobody drives any more (their replica died, or shut down, and no sweep or client
  adopted them): idle past the timeout, each is adopted through the service's one takeover path
  (an attach that waits ``ORPHAN_PROBE_S`` for the lease), and so becomes a run driven here,
  failed by a later tick. The lease is the fence: a run a live replica still holds is left to
  that replica's own watchdog, and of two replicas probing one dead replica's run one claims it,
  the other's probe is withdrawn. Without this, a coordinator with the sweep off left a dead
  replica's runs ``running`` for ever.

Sweep: runs nobody drives any more, at most ``max_runs`` a sweep, are adopted through the
service's one takeover path: the detached ones (``list_reclaimable``: their driver stamped a
detach, a graceful shutdown), then those whose replica died without a word (a SIGKILL, a lost
machine: running, claimed once, and no live lease any more). Such a run carries no detach stamp,
so only the lease tells: each candidate gets an attach that waits ``ORPHAN_PROBE_S`` for the
lease, and one a live replica still holds is left to it. ``/admin/sweep`` runs the same sweep on
demand.
Ticks never overlap (each loop awaits its tick), and a tick that raises is logged and the loop
goes on. Both clocks are injectable, so a test moves time instead of waiting it out: ``clock``
(monotonic seconds) measures what this replica saw, ``wall_clock`` (epoch seconds) is what the
events' stored timestamps are compared with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from boxwright.events import now_ms
from boxwright.middleware.service import SandboxService
from boxwright.runs import EventLog, RunError, RunRecord, last_stored_event
from boxwright.secrets import redact

log = logging.getLogger("boxwright.middleware")

WATCHDOG_MESSAGE: Final = "run watchdog: no progress; orchestrator presumed dead"
WATCHDOG_CODE: Final = "watchdog"
# How long the watchdog waits for an aborted driver to end before it writes the failure itself.
WATCHDOG_SETTLE_S: Final = 30.0
# How long the sweep's attach waits for a running run's lease: a dead replica's is free at once.
ORPHAN_PROBE_S: Final = 0.5
# How many running runs one sweep reads to find the orphans among them.
ORPHAN_SCAN: Final = 1000


class SweepResult(msgspec.Struct, rename="camel", kw_only=True):
    considered: int = 0
    adopted: int = 0
    driven_here: int = 0
    not_adopted: int = 0
    failed: int = 0
    run_ids: list[str] = msgspec.field(default_factory=list)
    # Of ``considered``: running runs with no detach stamp, probed for a lease nobody renews.
    orphans_probed: int = 0


@dataclass
class _Seen:
    tail: str
    # ``clock()`` when this replica first saw the log end at ``tail``.
    since: float
    # How long the log had been idle by then (its last event's stamp against ``wall_clock``): for a run
    # adopted after its replica died, the time nobody was watching it.
    idle_before: float = 0.0


async def last_event_ms(log: EventLog, run_id: str, tail: str | None = None) -> int | None:
    """The stored ``timestamp`` of ``run_id``'s last event (``None``: an empty log, or a last event with none)."""
    last = await last_stored_event(log, run_id, tail)
    return None if last is None else last.timestamp


@dataclass(eq=False)
class Scheduler:
    """``async with scheduler:`` runs the watchdog and sweep loops until the block ends."""

    service: SandboxService
    inactivity_timeout: float
    watchdog_interval: float
    sweep_interval: float
    max_runs: int = 25
    clock: Callable[[], float] = time.monotonic
    # Epoch seconds, compared with the events' stored timestamps (epoch ms, stamped by whoever made them).
    wall_clock: Callable[[], float] = time.time
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    watchdog_ticks: int = 0

    async def __aenter__(self) -> Scheduler:
        if self.inactivity_timeout > 0 and self.watchdog_interval > 0:
            self._tasks.append(
                asyncio.create_task(self._loop(self.watchdog_interval, self.watchdog_tick), name="boxwright watchdog")
            )
        if self.sweep_interval > 0:
            self._tasks.append(
                asyncio.create_task(self._loop(self.sweep_interval, self._sweep_tick), name="boxwright sweep")
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _loop(self, interval: float, tick: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await tick()
            except Exception as exc:
                log.error(
                    "%s tick failed: %s", getattr(tick, "__name__", "scheduler"), redact(f"{type(exc).__name__}: {exc}")
                )

    async def _sweep_tick(self) -> None:
        result = await self.sweep()
        if result.adopted:
            log.info("sweep adopted %d run(s): %s", result.adopted, ", ".join(result.run_ids))

    async def watchdog_tick(self) -> list[str]:
        """One watchdog pass (the runs driven here, then the ones nobody drives); returns the ids it failed."""
        self.watchdog_ticks += 1
        now = self.clock()
        # Runs this replica drives: a takeover still waiting for another replica's lease is not one.
        driven = set(self.service.driving_runs)
        for gone in set(self._seen) - driven:
            del self._seen[gone]
        failed: list[str] = []
        for run_id in driven:
            tail = await self.service.log.tail(run_id)
            seen = self._seen.get(run_id)
            if seen is None or seen.tail != tail:
                seen = self._seen[run_id] = _Seen(tail, now, await self._idle_at_sight(run_id, tail))
            idle = now - seen.since + seen.idle_before
            # A takeover still in its quiet window is failed too: its drive ends the sandbox it did not
            # re-enter yet (the service's takeover driver), so the agent stops with the run.
            if idle > self.inactivity_timeout:
                del self._seen[run_id]
                await self._fail_idle(run_id)
                failed.append(run_id)
        adopted = await self._adopt_idle_undriven()
        for run_id in adopted:
            # Seen from its adoption on: failed by a later tick, as any idle run driven here.
            tail = await self.service.log.tail(run_id)
            self._seen[run_id] = _Seen(tail, now, await self._idle_at_sight(run_id, tail))
        if adopted:
            log.warning("watchdog adopted %d idle run(s) nobody drove: %s", len(adopted), ", ".join(adopted))
        return failed

    async def _idle_at_sight(self, run_id: str, tail: str) -> float:
        """How long the log ending at ``tail`` had been idle when this replica saw it (0 when it cannot tell)."""
        try:
            stamp = await last_event_ms(self.service.log, run_id, tail)
        except Exception as exc:
            # Counted from now, as if just seen: a late failure, never a wrong one.
            log.warning("watchdog: run %r: could not read its last event: %s", run_id, redact(str(exc)))
            return 0.0
        if stamp is None:
            return 0.0
        # Clamped: another host's clock ahead of ours must not make the log look younger than just seen.
        return max(0.0, self.wall_clock() - stamp / 1000)

    async def _adopt_idle_undriven(self) -> list[str]:
        """Running runs nobody drives, idle past the timeout: adopted through the takeover path (a later tick fails
        them, as runs driven here); returns the ids adopted.

        Only a run whose lease nobody renews can be adopted (the claim waits ``ORPHAN_PROBE_S`` for
        it), so a live replica's idle run is left to that replica's watchdog, and two replicas
        probing one dead replica's run never both drive it: one claims it, the other's probe is
        withdrawn before it writes anything.
        """
        list_running = getattr(self.service.runs, "list_running", None)
        budget = max(self.max_runs, 0)
        if budget <= 0 or not callable(list_running):
            return []
        try:
            running: list[RunRecord] = list(await list_running(ORPHAN_SCAN))
        except Exception as exc:
            log.error("watchdog: listing running runs failed: %s", redact(str(exc)))
            return []
        here = set(self.service.active_runs)
        idle: list[RunRecord] = []
        for record in running:
            if len(idle) >= budget:
                break
            if (
                record.run_id in here
                or record.cancel_requested is True
                # Never claimed: a driver is still on its way to the claim, or the run is not durable
                # (its live driver holds no lease, so a claim here would drive it twice).
                or record.driver_epoch is None
                # Younger than the timeout: it cannot have been idle that long (no log read needed).
                or self.wall_clock() - record.started_at / 1000 <= self.inactivity_timeout
            ):
                continue
            if await self._idle_for(record) > self.inactivity_timeout:
                idle.append(record)
        if not idle:
            return []
        outcomes = await asyncio.gather(
            *(self.service.attach(r.run_id, wait_s=ORPHAN_PROBE_S) for r in idle), return_exceptions=True
        )
        adopted: list[str] = []
        for record, outcome in zip(idle, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("watchdog: run %r: %s", record.run_id, redact(f"{type(outcome).__name__}: {outcome}"))
            elif outcome.driving:
                adopted.append(record.run_id)
        return adopted

    async def _idle_for(self, record: RunRecord) -> float:
        """Seconds since ``record``'s run last made progress: its log's last event, else its last record write."""
        try:
            stamp = await last_event_ms(self.service.log, record.run_id)
        except Exception as exc:
            log.warning("watchdog: run %r: could not read its last event: %s", record.run_id, redact(str(exc)))
            return 0.0
        return self.wall_clock() - (stamp if stamp is not None else record.updated_at) / 1000

    async def _fail_idle(self, run_id: str) -> None:
        log.warning("run %r: no event for %.0f s; failing it (%s)", run_id, self.inactivity_timeout, WATCHDOG_MESSAGE)
        error = RunError(message=WATCHDOG_MESSAGE, code=WATCHDOG_CODE)
        await self.service.fail_run(run_id, error, settle_s=WATCHDOG_SETTLE_S)

    async def sweep(self) -> SweepResult:
        """Adopt detached runs nobody drives (the service's takeover path); never raises."""
        result = SweepResult()
        list_reclaimable = getattr(self.service.runs, "list_reclaimable", None)
        if not callable(list_reclaimable):
            return result
        try:
            listed = list(await list_reclaimable(now_ms(), 0))
        except Exception as exc:
            log.error("sweep: listing detached runs failed: %s", redact(str(exc)))
            return result
        budget = max(self.max_runs, 0)
        for record in listed[:budget]:
            result.considered += 1
            if record.run_id in self.service.active_runs:
                result.driven_here += 1
                continue
            try:
                started = await self.service.take_over_if_orphaned(record.run_id)
            except Exception as exc:
                log.warning("sweep: run %r: %s", record.run_id, redact(f"{type(exc).__name__}: {exc}"))
                result.failed += 1
                continue
            if started:
                result.adopted += 1
                result.run_ids.append(record.run_id)
            else:
                result.not_adopted += 1
        await self._adopt_orphans(result, budget - result.considered, {r.run_id for r in listed})
        return result

    async def _adopt_orphans(self, result: SweepResult, budget: int, seen: set[str]) -> None:
        """Running runs whose replica died (no detach stamp, no live lease): adopted like the detached ones."""
        list_running = getattr(self.service.runs, "list_running", None)
        if budget <= 0 or not callable(list_running):
            return
        try:
            running: list[RunRecord] = list(await list_running(ORPHAN_SCAN))
        except Exception as exc:
            log.error("sweep: listing running runs failed: %s", redact(str(exc)))
            return
        here = set(self.service.active_runs)
        candidates = [
            r
            for r in running
            if r.run_id not in seen
            and r.run_id not in here
            and r.detached_since is None
            and r.cancel_requested is not True
            # Never claimed: its driver is still on its way to the claim (or it is not durable).
            and r.driver_epoch is not None
        ]
        # Live runs of other replicas are among them: a random pick lets later sweeps reach the rest.
        picked = random.sample(candidates, min(budget, len(candidates)))
        if not picked:
            return
        outcomes = await asyncio.gather(
            *(self.service.attach(r.run_id, wait_s=ORPHAN_PROBE_S) for r in picked), return_exceptions=True
        )
        for record, outcome in zip(picked, outcomes, strict=True):
            result.considered += 1
            result.orphans_probed += 1
            if isinstance(outcome, BaseException):
                log.warning("sweep: run %r: %s", record.run_id, redact(f"{type(outcome).__name__}: {outcome}"))
                result.failed += 1
            elif outcome.driving:
                result.adopted += 1
                result.run_ids.append(record.run_id)
            else:
                result.not_adopted += 1


__all__ = ["WATCHDOG_CODE", "WATCHDOG_MESSAGE", "Scheduler", "SweepResult", "last_event_ms"]
