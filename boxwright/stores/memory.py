"""In-memory instance store and lock: one process, nothing survives it.

The lock serialises holders of one key in arrival order and runs different keys
concurrently. It cannot lose a lease, so its signal never fires, and it cannot stop
another process: ``durable`` is False.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

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
            return await fn(Lease(key))
        finally:
            if not handed_over:
                _resolve(mine)
            queue.users -= 1
            if queue.users == 0 and self._keys.get(key) is queue:
                del self._keys[key]
