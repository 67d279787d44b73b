"""The store protocols: where a sandbox instance is recorded, and how work on one key is serialised.

``SandboxInstanceStore`` remembers which provider sandbox backs an instance key, so a
later run (in this process or another) resumes it instead of creating a new one.
``LockStore`` holds a per-key lock for an ``async with locks.lock(key) as lease:`` block
(``with_lock(key, fn)`` is the same as a callback); ``lease`` is a ``LeaseSignal`` that
reports when a lease-backed lock was lost under it (its holder stalled past the lease and
another process took the key over). ``hold_lock`` gives the block form over a store that
only has ``with_lock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from boxwright.errors import LeaseLostError

T = TypeVar("T")

log = logging.getLogger("boxwright.stores")

DEFAULT_LEASE_TTL_MS = 30_000


class InstanceRecord(msgspec.Struct, kw_only=True, rename="camel", frozen=True, omit_defaults=True):
    """What ``ensure`` needs to find a sandbox again. ``updated_at`` is epoch milliseconds.

    Frozen, so a record handed to or returned by a store can never alias its stored state.
    """

    key: str
    provider: str
    provider_sandbox_id: str
    thread_id: str
    updated_at: int
    latest_snapshot_id: str | None = None
    latest_run_id: str | None = None


@runtime_checkable
class SandboxInstanceStore(Protocol):
    async def get(self, key: str) -> InstanceRecord | None:
        """The record stored under ``key``, or ``None`` (a missing key never raises)."""
        ...

    async def upsert(self, record: InstanceRecord) -> None:
        """Store ``record`` under ``record.key``, replacing every field (an omitted optional clears)."""
        ...

    async def delete(self, key: str) -> None:
        """Forget ``key``; a missing key is a no-op."""
        ...


@runtime_checkable
class LeaseSignal(Protocol):
    @property
    def lost(self) -> bool:
        """True once the lock is no longer held by this holder."""
        ...

    async def wait(self) -> None:
        """Return once the lease is lost (never, for a lock that cannot lose it)."""
        ...

    def raise_if_lost(self) -> None:
        """Raise ``LeaseLostError`` naming the key if the lease is lost."""
        ...


@runtime_checkable
class LockStore(Protocol):
    @property
    def durable(self) -> bool:
        """Whether the lock holds across processes; False for a lock that lives in one process's memory."""
        ...

    async def with_lock(
        self, key: str, fn: Callable[[LeaseSignal], Awaitable[T]], *, ttl_ms: int = DEFAULT_LEASE_TTL_MS
    ) -> T:
        """Run ``fn`` while holding the lock on ``key`` and return its result; the lock is freed however it ends."""
        ...


@runtime_checkable
class BlockLockStore(LockStore, Protocol):
    """A ``LockStore`` whose lock is also an async context manager (both built-in stores are)."""

    def lock(self, key: str, *, ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> AbstractAsyncContextManager[LeaseSignal]:
        """``async with locks.lock(key) as lease:`` holds the lock for the block; a lease renewal, if any,
        runs in a task the block owns (cancelled and awaited on exit) or, in the built-in stores, on a
        thread of the store's that stops renewing before the block's exit returns; ``lease`` reports its loss."""
        ...


@contextlib.asynccontextmanager
async def hold_lock(locks: LockStore, key: str, *, ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> AsyncIterator[LeaseSignal]:
    """``async with hold_lock(locks, key) as lease:`` over any ``LockStore``.

    A store with ``lock`` is used as it is. One with only ``with_lock`` is held by a task this
    block owns: its callback hands the lease over and waits for the block to end, and the task
    is awaited on exit, so the lock is freed before the block's exit returns.
    """
    if isinstance(locks, BlockLockStore):
        async with locks.lock(key, ttl_ms=ttl_ms) as lease:
            yield lease
        return
    loop = asyncio.get_running_loop()
    handed: asyncio.Future[LeaseSignal] = loop.create_future()
    released = asyncio.Event()

    async def holding(lease: LeaseSignal) -> None:
        handed.set_result(lease)
        await released.wait()

    holder = loop.create_task(locks.with_lock(key, holding, ttl_ms=ttl_ms), name=f"boxwright lock holder {key}")
    try:
        racers: set[asyncio.Future[Any]] = {holder, handed}
        await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        if not handed.done():
            await holder  # with_lock failed before calling back: its error is ours
            raise RuntimeError(f"lock store {type(locks).__name__} returned without holding {key!r}")
        yield handed.result()
    finally:
        released.set()
        if not handed.done():
            holder.cancel()  # we left while still waiting for the lock: stop waiting for it
        if not holder.done():
            # Shielded wait: a cancelled block must still see the lock freed before it leaves.
            await asyncio.wait({holder})
        if holder.done() and not holder.cancelled():
            holder.exception()  # retrieved: a release error was logged by the store, not ours to raise


class Lease:
    """The ``LeaseSignal`` the built-in lock stores hand out; the store calls ``mark_lost`` when the lease goes."""

    __slots__ = ("_event", "_key", "_reason")

    def __init__(self, key: str) -> None:
        self._key = key
        self._reason: str | None = None
        self._event = asyncio.Event()

    @property
    def key(self) -> str:
        return self._key

    @property
    def lost(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        return self._reason

    async def wait(self) -> None:
        await self._event.wait()

    def raise_if_lost(self) -> None:
        if self._event.is_set():
            raise LeaseLostError(self._key, self._reason)

    def mark_lost(self, reason: str) -> None:
        if self._event.is_set():
            return
        self._reason = reason
        self._event.set()

    def __repr__(self) -> str:
        return f"Lease(key={self._key!r}, lost={self.lost})"


def warn_if_not_durable(locks: LockStore | None, what: str) -> bool:
    """Log a WARNING (logger ``boxwright.stores``) when durable ``what`` runs over an in-memory or absent lock.

    Call it only when the work is durable. Returns whether it warned. An absent lock
    warns too: the fallback is a process-lifetime in-memory lock, which cannot stop a
    second process or host from driving the same work.
    """
    if locks is not None and locks.durable:
        return False
    held_by = "no lock store (an in-process lock is used)" if locks is None else f"{type(locks).__name__}"
    log.warning(
        "%s is durable but is serialised by %s, which does not hold across processes: two hosts can drive "
        "the same work at once; pass a durable LockStore such as SqliteLockStore (one machine) or a Redis lock",
        what,
        held_by,
    )
    return True
