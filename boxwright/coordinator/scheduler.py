"""The coordinator's periodic work, owned by its lifespan: the inactivity watchdog and the sweep.

Watchdog (decision 4, R34): a run this replica drives whose log has not grown for
``inactivity_timeout`` seconds is failed with ``WATCHDOG_MESSAGE``, its cancel recorded and
its driver aborted with the cancel reason (which destroys its sandbox). Sweep: runs whose
driver went away detached (``list_reclaimable``), at most ``max_runs`` a sweep, are adopted
through the service's one takeover path; ``/admin/sweep`` runs the same sweep on demand.
Ticks never overlap (each loop awaits its tick), and a tick that raises is logged and the loop
goes on. The clock is injectable, so a test moves time instead of waiting it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from boxwright.events import now_ms
from boxwright.middleware.service import SandboxService
from boxwright.runs import RunError, RunPatch, is_terminal_status, request_run_cancel
from boxwright.secrets import redact

log = logging.getLogger("boxwright.middleware")

WATCHDOG_MESSAGE: Final = "run watchdog: no progress; orchestrator presumed dead"
WATCHDOG_CODE: Final = "watchdog"
# How long the watchdog waits for an aborted driver to end before it writes the failure itself.
WATCHDOG_SETTLE_S: Final = 30.0


class SweepResult(msgspec.Struct, rename="camel", kw_only=True):
    considered: int = 0
    adopted: int = 0
    driven_here: int = 0
    not_adopted: int = 0
    failed: int = 0
    run_ids: list[str] = msgspec.field(default_factory=list)


@dataclass
class _Seen:
    tail: str
    since: float


@dataclass(eq=False)
class Scheduler:
    """``async with scheduler:`` runs the watchdog and sweep loops until the block ends."""

    service: SandboxService
    inactivity_timeout: float
    watchdog_interval: float
    sweep_interval: float
    max_runs: int = 25
    clock: Callable[[], float] = time.monotonic
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
        """One watchdog pass over the runs driven here; returns the ids it failed."""
        self.watchdog_ticks += 1
        now = self.clock()
        driven = set(self.service.active_runs)
        for gone in set(self._seen) - driven:
            del self._seen[gone]
        failed: list[str] = []
        for run_id in driven:
            tail = await self.service.log.tail(run_id)
            seen = self._seen.get(run_id)
            if seen is None or seen.tail != tail:
                self._seen[run_id] = _Seen(tail, now)
                continue
            if now - seen.since > self.inactivity_timeout:
                del self._seen[run_id]
                await self._fail_idle(run_id)
                failed.append(run_id)
        return failed

    async def _fail_idle(self, run_id: str) -> None:
        log.warning("run %r: no event for %.0f s; failing it (%s)", run_id, self.inactivity_timeout, WATCHDOG_MESSAGE)
        record = await request_run_cancel(self.service.runs, run_id)
        # The cancel reason: the driver's abort path destroys the sandbox, whatever its lifecycle says.
        await self.service.cancel_run(run_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WATCHDOG_SETTLE_S):
                record = await self.service.wait_run(run_id)
        # The driver ended ``aborted`` (a cancel); the record says why: failed, by the watchdog.
        epoch = record.driver_epoch if record is not None else None
        current = await self.service.runs.get(run_id)
        if current is None or (current.driver_epoch != epoch and epoch is not None):
            return  # another driver owns it now: its record is not ours to write
        patch = RunPatch(status="failed", error=RunError(message=WATCHDOG_MESSAGE, code=WATCHDOG_CODE))
        if not is_terminal_status(current.status):
            patch = msgspec.structs.replace(patch, finished_at=now_ms())
        await self.service.runs.update(run_id, patch, expected_epoch=current.driver_epoch)

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
        for record in listed[: max(self.max_runs, 0)]:
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
        return result


__all__ = ["WATCHDOG_CODE", "WATCHDOG_MESSAGE", "Scheduler", "SweepResult"]
