"""In-memory instance store and lock: one process, nothing survives it.

The lock serialises holders of one key in arrival order and runs different keys
concurrently. It cannot lose a lease, so its signal never fires, and it cannot stop
another process: ``durable`` is False.

``MemoryRunStore`` and ``MemoryEventLog`` (``memory_run_backend()``) keep run records and
run event logs the same way (see ``boxwright.runs``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import msgspec

from boxwright.abort import AbortSignal
from boxwright.errors import EventLogClosedError, RunExistsError
from boxwright.events import Event, decode_event, encode_event, now_ms
from boxwright.runs import (
    START_OFFSET,
    RunPatch,
    RunRecord,
    apply_patch,
    check_epoch,
    check_run_id,
    check_thread_id,
    format_offset,
    offset_never_issued,
    parse_offset,
    wait_event_or_abort,
)
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, InstanceRecord, Lease, LeaseSignal

T = TypeVar("T")


class MemoryInstanceStore:
    """A dict of frozen records; sharing a frozen record is as safe as copying it.

    No ``__len__``: an empty store must stay truthy for ``store or default`` seams.
    """

    def __init__(self) -> None:
        self._records: dict[str, InstanceRecord] = {}

    async def get(self, key: str) -> InstanceRecord | None:
        return self._records.get(key)

    async def upsert(self, record: InstanceRecord) -> None:
        self._records[record.key] = record

    async def delete(self, key: str) -> None:
        self._records.pop(key, None)


class _KeyQueue:
    __slots__ = ("tail", "users")

    def __init__(self) -> None:
        # Resolved when the last arrival so far has finished; the next arrival waits on it.
        self.tail: asyncio.Future[None] | None = None
        self.users = 0


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryLockStore:
    durable = False

    def __init__(self) -> None:
        self._keys: dict[str, _KeyQueue] = {}

    async def with_lock(
        self, key: str, fn: Callable[[LeaseSignal], Awaitable[T]], *, ttl_ms: int = DEFAULT_LEASE_TTL_MS
    ) -> T:
        async with self.lock(key, ttl_ms=ttl_ms) as lease:
            return await fn(lease)

    @contextlib.asynccontextmanager
    async def lock(self, key: str, *, ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> AsyncIterator[LeaseSignal]:
        """Hold ``key`` for the block; the lease is never lost (nothing here can take it over)."""
        # A chain of futures rather than asyncio.Lock: the order is arrival order by construction.
        queue = self._keys.get(key)
        if queue is None:
            queue = self._keys[key] = _KeyQueue()
        previous = queue.tail
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.tail = mine
        queue.users += 1
        handed_over = False
        try:
            if previous is not None:
                try:
                    # Shielded: our cancellation must not cancel the future the holder ahead of us resolves.
                    await asyncio.shield(previous)
                except asyncio.CancelledError:
                    # Leaving the queue early must not let our successor in before the holder ahead finishes.
                    previous.add_done_callback(lambda _: _resolve(mine))
                    handed_over = True
                    raise
            yield Lease(key)
        finally:
            if not handed_over:
                _resolve(mine)
            queue.users -= 1
            if queue.users == 0 and self._keys.get(key) is queue:
                del self._keys[key]


# -- runs and event logs --------------------------------------------------------------------------


def _detached(record: RunRecord) -> RunRecord:
    # The record is frozen but its usage is not: hand out a copy so a caller cannot edit stored state.
    if record.usage is None:
        return record
    return msgspec.structs.replace(record, usage=msgspec.structs.replace(record.usage))


class MemoryRunStore:
    """Run records in a dict; pair it with ``MemoryEventLog(store)`` (or use ``memory_run_backend()``)
    so fenced appends see its epochs. Nothing survives the process.
    """

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}

    def _driver_epoch(self, run_id: str) -> int | None:
        record = self._records.get(run_id)
        return None if record is None else record.driver_epoch

    async def get(self, run_id: str) -> RunRecord | None:
        record = self._records.get(check_run_id(run_id))
        return None if record is None else _detached(record)

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        existing = self._records.get(check_run_id(run_id))
        check_thread_id(thread_id)
        if existing is not None:
            return _detached(existing)
        now = now_ms()
        record = RunRecord(
            run_id=run_id,
            thread_id=thread_id,
            status="running",
            started_at=now if started_at is None else started_at,
            updated_at=now,
        )
        self._records[run_id] = record
        return record

    async def create(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        """A new ``running`` record; ``RunExistsError`` (naming the owner's thread) if the id has one."""
        existing = self._records.get(check_run_id(run_id))
        check_thread_id(thread_id)
        if existing is not None:
            raise RunExistsError(run_id, existing.thread_id)
        # No await between the lookup and the insert: two creates of one id cannot both pass.
        return await self.create_or_resume(run_id, thread_id, started_at=started_at)

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        record = self._records.get(check_run_id(run_id))
        if record is None:
            return None
        if expected_epoch is not None:
            check_epoch(run_id, expected_epoch, record.driver_epoch, "update")
        updated = apply_patch(record, patch, now_ms())
        self._records[run_id] = _detached(updated)
        return _detached(updated)

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        best: RunRecord | None = None
        for record in self._records.values():
            # >=: among equal start times the later-created run wins, as in the SQLite store.
            if record.thread_id == thread_id and record.status == "running":
                if best is None or record.started_at >= best.started_at:
                    best = record
        return None if best is None else _detached(best)

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        # sorted() is stable: equal start times stay in creation order.
        matching = [r for r in self._records.values() if r.thread_id == thread_id]
        return [_detached(r) for r in sorted(matching, key=lambda r: r.started_at)]

    async def list_reclaimable(self, now_ms: int, ttl_ms: int) -> list[RunRecord]:
        cutoff = now_ms - ttl_ms
        matching = [
            r
            for r in self._records.values()
            if r.status == "running" and r.detached_since is not None and r.detached_since <= cutoff
        ]
        return [_detached(r) for r in sorted(matching, key=lambda r: r.detached_since or 0)]

    async def list_running(self, limit: int) -> list[RunRecord]:
        matching = [r for r in self._records.values() if r.status == "running"]
        return [_detached(r) for r in sorted(matching, key=lambda r: r.started_at)[: max(limit, 0)]]


class _MemoryLog:
    __slots__ = ("changed", "closed", "entries")

    def __init__(self) -> None:
        # Encoded, as a real store keeps them: readers get their own copies and a bad event fails on append.
        self.entries: list[bytes] = []
        self.closed = False
        self.changed: asyncio.Event | None = None

    def wake(self) -> None:
        if self.changed is not None:
            self.changed.set()
            self.changed = None


class MemoryEventLog:
    """Event logs in memory, one per run, for one process; readers wake the moment an append lands.

    Fenced appends check the epochs of ``runs`` (a run unknown to it has no epoch, so any fenced
    append to it is refused). Logs are never evicted: use it for tests and single-process apps
    whose runs are few or short-lived.
    """

    def __init__(self, runs: MemoryRunStore | None = None) -> None:
        self._runs = runs
        self._logs: dict[str, _MemoryLog] = {}

    async def append(self, run_id: str, events: Sequence[Event], *, epoch: int | None = None) -> list[str]:
        check_run_id(run_id)
        if not events:
            return []
        if epoch is not None:
            stored = None if self._runs is None else self._runs._driver_epoch(run_id)
            check_epoch(run_id, epoch, stored, "append")
        entries = [encode_event(event) for event in events]
        log = self._logs.get(run_id)
        if log is None:
            log = self._logs[run_id] = _MemoryLog()
        if log.closed:
            raise EventLogClosedError(run_id)
        first = len(log.entries) + 1
        log.entries.extend(entries)
        log.wake()
        return [format_offset(run_id, seq) for seq in range(first, first + len(entries))]

    async def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        position = parse_offset(check_run_id(run_id), after)
        log = self._logs.get(run_id)
        stored = 0 if log is None else len(log.entries)
        if position is None:
            position = stored
        elif position > stored:
            raise offset_never_issued(run_id, after, stored)
        while signal is None or not signal.aborted:
            log = self._logs.get(run_id)
            if log is None:
                # A reader may come before the first append; it waits on a log that holds nothing yet.
                log = self._logs[run_id] = _MemoryLog()
            while position < len(log.entries):
                position += 1
                yield format_offset(run_id, position), decode_event(log.entries[position - 1])
                if signal is not None and signal.aborted:
                    return
            if log.closed or not live:
                return
            if log.changed is None:
                log.changed = asyncio.Event()
            if not await wait_event_or_abort(log.changed, signal):
                return

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[Event]:
        log = self._logs.get(check_run_id(run_id))
        if log is None:
            return []
        entries = log.entries if limit is None else log.entries[: max(limit, 0)]
        return [decode_event(entry) for entry in entries]

    async def tail(self, run_id: str) -> str:
        log = self._logs.get(check_run_id(run_id))
        return format_offset(run_id, 0 if log is None else len(log.entries))

    async def close(self, run_id: str) -> None:
        log = self._logs.get(check_run_id(run_id))
        if log is None:
            log = self._logs[run_id] = _MemoryLog()
        log.closed = True
        log.wake()

    async def is_closed(self, run_id: str) -> bool:
        log = self._logs.get(check_run_id(run_id))
        return log is not None and log.closed


def memory_run_backend() -> tuple[MemoryRunStore, MemoryEventLog]:
    """A run store and an event log sharing their state, so appends are fenced on the store's epochs."""
    runs = MemoryRunStore()
    return runs, MemoryEventLog(runs)
