"""Lease-backed locks, one home for the SQLite and Redis lock stores: acquire, renew, release.

A store says how to take, extend and delete its lease record (``LeasedLockStore``'s three
hooks); this module does the rest the same way for both: the backoff and local wake-up of
waiters, the token-checked release that still runs when the holder is cancelled, and the
renewal.

Renewal runs on a thread of its own (``LeaseRenewer``, one per store, alive while it holds a
lease), never on the event loop: a loop busy with hundreds of connection handshakes and
tail writes lagged a timer by 1.4 s and queued the renewal behind a thousand tailers' commands
for 6 s, and a driver with a 1.5 s lease lost its run because clients connected. The thread
talks to the store over a connection of its own, renews at a third of the lease, retries a
failed renewal and gives up only once the lease it last got has run out (measured from when
that renewal was sent, so the holder never believes in a lease longer than the store does).
A lease the store says another holder took is lost at once.

The thread keeps renewing only while the holder's event loop still runs: it posts a ping with
every renewal and stops (the lease lost, left to expire) once a ping has waited unanswered for
``LOOP_STALL_LEASES`` leases. A blocked loop (a stalled or wedged holder) loses its lease as
before, a few lease periods later; a merely busy one, whose loop still turns but late (1.4 s
timer lag measured under 300 connecting tailers), keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

from boxwright.errors import StoreClosedError
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, Lease, LeaseSignal

T = TypeVar("T")

log = logging.getLogger("boxwright.stores")

POLL_START_S: Final = 0.010
POLL_CAP_S: Final = 0.200
# How many leases a ping to the holder's loop may wait unanswered before its leases are let go.
LOOP_STALL_LEASES: Final = 2
# Between two attempts of a renewal that failed, while the lease has not yet run out.
RETRY_S: Final = 0.05


class _Wakeup:
    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiters = 0


class _Held:
    """One lease the renewer keeps alive. Its times are ``time.monotonic()`` seconds; only the
    renewer thread writes them, except ``ping_waiting``, which the loop's ping clears."""

    __slots__ = ("due", "expires", "failure", "key", "lease", "loop", "ping_posted", "ping_waiting", "token", "ttl_ms")

    def __init__(self, key: str, token: str, ttl_ms: int, lease: Lease, sent: float) -> None:
        self.key = key
        self.token = token
        self.ttl_ms = ttl_ms
        self.lease = lease
        self.loop = asyncio.get_running_loop()
        self.expires = sent + ttl_ms / 1000
        self.due = sent + ttl_ms / 3000
        self.ping_posted = 0.0  # when the oldest ping still unanswered was posted
        self.ping_waiting = False
        self.failure: str | None = None

    def pong(self) -> None:
        self.ping_waiting = False


Extend = Callable[[str, str, int, asyncio.AbstractEventLoop], bool]
"""``extend(key, token, ttl_ms, loop)``: push the lease's expiry to now + ttl if ``token`` still holds
``key``; whether it did. Called on the renewer thread; it blocks, bounded by its connection's timeout.
``StoreClosedError`` loses the lease at once; any other error is retried while the lease runs."""


class LeaseRenewer:
    """A thread that renews every lease its store holds, independent of the holders' event loops."""

    def __init__(self, name: str, extend: Extend) -> None:
        self._name = name
        self._extend = extend
        self._changed = threading.Condition()
        self._held: set[_Held] = set()
        self._thread: threading.Thread | None = None

    def hold(self, held: _Held) -> None:
        with self._changed:
            self._held.add(held)
            if self._thread is None:
                # A daemon: a process that exits holding a lease must not wait for it (the lease expires).
                self._thread = threading.Thread(target=self._run, name=f"boxwright lease renewal {self._name}")
                self._thread.daemon = True
                self._thread.start()
            self._changed.notify()

    def drop(self, held: _Held) -> None:
        with self._changed:
            self._held.discard(held)
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._held:
                    self._thread = None  # the next hold starts another: no thread while nothing is held
                    return
                now = time.monotonic()
                wake = min(held.due for held in self._held)
                if wake > now:
                    self._changed.wait(wake - now)
                    continue
                due = [held for held in self._held if held.due <= now]
            for held in due:
                self._renew(held)

    def _lose(self, held: _Held, reason: str) -> None:
        with self._changed:
            if held not in self._held:
                return  # released meanwhile: nothing to report
            self._held.discard(held)
        # asyncio objects belong to their loop: the holder learns of it there.
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            held.loop.call_soon_threadsafe(held.lease.mark_lost, reason)

    def _renew(self, held: _Held) -> None:
        sent = time.monotonic()
        if sent >= held.expires:
            self._lose(held, f"renewal failed until the lease ran out: {held.failure or 'no answer in time'}")
            return
        if held.ping_waiting:
            if sent - held.ping_posted > LOOP_STALL_LEASES * held.ttl_ms / 1000:
                self._lose(held, f"the holder's event loop ran nothing for {sent - held.ping_posted:.1f} s")
                return
        else:
            held.ping_posted, held.ping_waiting = sent, True
            try:
                held.loop.call_soon_threadsafe(held.pong)
            except RuntimeError:
                self._lose(held, "the holder's event loop is closed")
                return
        try:
            kept = self._extend(held.key, held.token, held.ttl_ms, held.loop)
        except StoreClosedError as exc:
            # Closed for good: no later attempt can renew it.
            self._lose(held, f"renewal failed: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:
            # Not lost yet: the lease we last got still runs, and the next attempt may reach the store.
            held.failure = f"{type(exc).__name__}: {exc}"
            held.due = time.monotonic() + min(RETRY_S, held.ttl_ms / 10_000)
            return
        if not kept:
            self._lose(held, "the lease expired and another holder took the key over")
            return
        held.failure = None
        held.expires = sent + held.ttl_ms / 1000
        held.due = sent + held.ttl_ms / 3000


class LeasedLockStore:
    """A ``BlockLockStore`` over lease records; a store implements ``_take``, ``_delete`` and ``_extend``."""

    durable = True

    def __init__(self, name: str) -> None:
        # Waiters in this process are woken by a local release instead of sleeping out their backoff.
        self._wakeups: dict[str, _Wakeup] = {}
        self._renewer = LeaseRenewer(name, self._extend)

    async def _take(self, key: str, token: str, ttl_ms: int) -> int:
        """Take ``key`` for ``token`` if nobody holds it: a positive fencing token, or 0 if it is held."""
        raise NotImplementedError

    async def _delete(self, key: str, token: str) -> None:
        """Free ``key`` if ``token`` still holds it (a holder whose lease expired must not free its successor's)."""
        raise NotImplementedError

    def _extend(self, key: str, token: str, ttl_ms: int, loop: asyncio.AbstractEventLoop) -> bool:
        """The renewal, on the renewer thread (see ``Extend``)."""
        raise NotImplementedError

    def _new_lease(self, key: str, fencing_token: int) -> Lease:
        return Lease(key)

    async def _prepare(self) -> None:
        """Anything the store needs before its first lock (a schema)."""

    async def with_lock(
        self, key: str, fn: Callable[[LeaseSignal], Awaitable[T]], *, ttl_ms: int = DEFAULT_LEASE_TTL_MS
    ) -> T:
        async with self.lock(key, ttl_ms=ttl_ms) as lease:
            return await fn(lease)

    @contextlib.asynccontextmanager
    async def lock(self, key: str, *, ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> AsyncIterator[LeaseSignal]:
        """Hold ``key`` for the block, renewed every ttl/3 by the store's renewer thread until the block
        exits; the lease reports its loss (``lease.lost``, ``await lease.wait()``)."""
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        await self._prepare()
        token = secrets.token_hex(16)
        sent, fencing = await self._acquire(key, token, ttl_ms)
        lease = self._new_lease(key, fencing)
        held = _Held(key, token, ttl_ms, lease, sent)
        self._renewer.hold(held)
        try:
            yield lease
        finally:
            # Dropped first, so a renewal racing the release reports nothing; it only touches our own token.
            self._renewer.drop(held)
            # Shielded so a cancelled holder still frees the key instead of leaving it to expire.
            await asyncio.shield(self._release(key, token))

    async def _acquire(self, key: str, token: str, ttl_ms: int) -> tuple[float, int]:
        delay = POLL_START_S
        while True:
            # The lease runs from before the take was sent: the store's clock started no earlier.
            sent = time.monotonic()
            fencing = await self._try_take(key, token, ttl_ms)
            if fencing:
                return sent, fencing
            await self._pause(key, delay)
            delay = min(delay * 2, POLL_CAP_S)

    async def _try_take(self, key: str, token: str, ttl_ms: int) -> int:
        attempt = asyncio.ensure_future(self._take(key, token, ttl_ms))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # The take may still land after we stop waiting; a lease nobody holds would block the key for a ttl.
            with contextlib.suppress(Exception):
                if await attempt:
                    await self._delete(key, token)
            raise

    async def _pause(self, key: str, delay: float) -> None:
        wakeup = self._wakeups.get(key)
        if wakeup is None:
            wakeup = self._wakeups[key] = _Wakeup()
        wakeup.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wakeup.event.wait()
        finally:
            wakeup.waiters -= 1
            if wakeup.waiters == 0 and self._wakeups.get(key) is wakeup:
                del self._wakeups[key]

    async def _release(self, key: str, token: str) -> None:
        try:
            await self._delete(key, token)
        except Exception as exc:
            log.warning("could not release lock %r (%s); it frees itself when its lease expires", key, exc)
        wakeup = self._wakeups.pop(key, None)
        if wakeup is not None:
            wakeup.event.set()


__all__ = ["LOOP_STALL_LEASES", "LeaseRenewer", "LeasedLockStore"]
