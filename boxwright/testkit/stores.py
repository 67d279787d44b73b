"""Conformance suites for instance stores (A33-A39) and lock stores (A40), for boxwright's stores and yours.

Say how to get a fresh, empty store, then let the suite build a pytest class::

    TestMyInstanceStore = run_instance_store_conformance("mine", MyInstanceStore)
    TestMyLocks = lock_store_suite("mine", MyLockStore)

``make_store`` / ``make_locks`` is called once per case, with no argument, and may
return the store itself, an awaitable of it, or an async context manager yielding
it (use that to open and close a database around the case). It is called inside the
case's event loop. Every case is a plain ``async def case_...(store) -> None``; the
generated class wraps each in a sync ``test_...`` method running ``asyncio.run``, so
no pytest async plugin is needed. Assertions raise ``AssertionError`` with their own
message (pytest's assert rewriting skips installed packages).

The lock cases check what every lock store owes: one holder per key, keys
independent, a raising or cancelled holder never blocks the next, a cancelled
waiter never gets in. Arrival order and the dropping of idle keys are properties
of the in-memory lock only, tested with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn, TypeVar, cast

from ..stores.base import InstanceRecord, LeaseSignal, LockStore, SandboxInstanceStore

CASE_TIMEOUT = 60.0
# How long a case waits for something that should happen promptly (a freed key, a concurrent holder).
_PROMPT = 5.0

S = TypeVar("S")
Factory = Callable[[], S | Awaitable[S] | AbstractAsyncContextManager[S]]
InstanceCase = Callable[[SandboxInstanceStore], Awaitable[None]]
LockCase = Callable[[LockStore], Awaitable[None]]


# -- assertions -----------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        _fail(message)


def _equal(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        _fail(f"{what}: expected {expected!r}, got {actual!r}")


def _record(key: str = "k1", **overrides: Any) -> InstanceRecord:
    fields: dict[str, Any] = {
        "key": key,
        "provider": "local-process",
        "provider_sandbox_id": f"sbx-{key}",
        "thread_id": "thread-1",
        "updated_at": 1_700_000_000_123,
    }
    fields.update(overrides)
    return InstanceRecord(**fields)


# -- instance store cases (spec R39) -------------------------------------------------------------


async def case_a33_missing_is_none(store: SandboxInstanceStore) -> None:
    """A33: a key never written reads as None, without raising."""
    _expect(isinstance(store, SandboxInstanceStore), f"{store!r} lacks get/upsert/delete")
    _equal(await store.get("never-written"), None, "get of a missing key")
    await store.upsert(_record("present"))
    _equal(await store.get("absent"), None, "get of a missing key beside a present one")


async def case_a34_full_round_trip(store: SandboxInstanceStore) -> None:
    """A34: every field comes back as written, including an epoch-ms time past 2**31 and non-ASCII text."""
    record = _record(
        "k-full",
        provider="bubblewrap",
        provider_sandbox_id="sbx-é-😀",
        thread_id="thread:run-ü",
        updated_at=1_723_456_789_012,
        latest_snapshot_id="snap-1",
        latest_run_id="run-1",
    )
    await store.upsert(record)
    _equal(await store.get("k-full"), record, "round-tripped record")


async def case_a35_absent_optionals_stay_absent(store: SandboxInstanceStore) -> None:
    """A35: optionals never set read back as None, not as an empty string or a default."""
    await store.upsert(_record("k-bare"))
    got = await store.get("k-bare")
    _expect(got is not None, "record written without optionals was not found")
    assert got is not None
    _equal(got.latest_snapshot_id, None, "latest_snapshot_id never set")
    _equal(got.latest_run_id, None, "latest_run_id never set")
    _equal(got, _record("k-bare"), "record without optionals")


async def case_a36_reupsert_replaces_everything(store: SandboxInstanceStore) -> None:
    """A36: an upsert is a full replace; omitting latest_snapshot_id clears a stored one."""
    await store.upsert(_record("k", latest_snapshot_id="snap-old", latest_run_id="run-1"))
    replacement = _record("k", provider_sandbox_id="sbx-new", thread_id="thread-2", updated_at=1_700_000_999_000)
    await store.upsert(replacement)
    got = await store.get("k")
    _equal(got, replacement, "record after a re-upsert without optionals (a merge would keep snap-old)")
    await store.upsert(_record("k", latest_run_id="run-2"))
    got = await store.get("k")
    _equal(got, _record("k", latest_run_id="run-2"), "record after a re-upsert setting only latest_run_id")


async def case_a37_keys_isolated(store: SandboxInstanceStore) -> None:
    """A37: writing or deleting one key never changes another."""
    one, two = _record("k1", latest_run_id="r1"), _record("k2", provider_sandbox_id="other")
    await store.upsert(one)
    await store.upsert(two)
    await store.upsert(_record("k1", latest_run_id="r1b"))
    _equal(await store.get("k2"), two, "k2 after k1 was rewritten")
    await store.delete("k1")
    _equal(await store.get("k2"), two, "k2 after k1 was deleted")
    _equal(await store.get("k1"), None, "k1 after its delete")


async def case_a38_delete_removes(store: SandboxInstanceStore) -> None:
    """A38: delete removes the record; the key can be written again afterwards."""
    await store.upsert(_record("k", latest_snapshot_id="s"))
    await store.delete("k")
    _equal(await store.get("k"), None, "record after delete")
    again = _record("k", provider_sandbox_id="sbx-again")
    await store.upsert(again)
    _equal(await store.get("k"), again, "record written after a delete")


async def case_a39_delete_missing_is_noop(store: SandboxInstanceStore) -> None:
    """A39: deleting a key that is not there neither raises nor touches other keys."""
    kept = _record("kept")
    await store.upsert(kept)
    await store.delete("missing")
    await store.delete("missing")
    _equal(await store.get("kept"), kept, "other record after deleting a missing key")


INSTANCE_CASES: tuple[tuple[str, InstanceCase], ...] = (
    ("test_a33_missing_is_none", case_a33_missing_is_none),
    ("test_a34_full_round_trip", case_a34_full_round_trip),
    ("test_a35_absent_optionals_stay_absent", case_a35_absent_optionals_stay_absent),
    ("test_a36_reupsert_replaces_everything", case_a36_reupsert_replaces_everything),
    ("test_a37_keys_isolated", case_a37_keys_isolated),
    ("test_a38_delete_removes", case_a38_delete_removes),
    ("test_a39_delete_missing_is_noop", case_a39_delete_missing_is_noop),
)


# -- lock store cases (spec R41, A40) ------------------------------------------------------------


async def case_a40_serial_per_key(locks: LockStore) -> None:
    """A40: holders of one key never overlap, and each gets its own result back."""
    inside = 0
    most = 0
    entered: list[int] = []

    async def holder(i: int) -> int:
        async def body(signal: LeaseSignal) -> int:
            nonlocal inside, most
            inside += 1
            most = max(most, inside)
            entered.append(i)
            await asyncio.sleep(0.02)
            inside -= 1
            return i * 10

        return await locks.with_lock("serial", body)

    results = await asyncio.gather(*(holder(i) for i in range(4)))
    _equal(list(results), [0, 10, 20, 30], "results of the holders")
    _equal(most, 1, "most holders of one key inside at once")
    _equal(sorted(entered), [0, 1, 2, 3], "holders that got in")


async def case_a40_keys_concurrent(locks: LockStore) -> None:
    """A40: holders of different keys run at the same time (each waits for the other to be inside)."""
    a_in, b_in = asyncio.Event(), asyncio.Event()

    async def holder(mine: asyncio.Event, other: asyncio.Event, key: str) -> str:
        async def body(signal: LeaseSignal) -> str:
            mine.set()
            try:
                await asyncio.wait_for(other.wait(), _PROMPT)
            except TimeoutError:
                _fail(f"lock on {key!r} blocked a holder of another key")
            return key

        return await locks.with_lock(key, body)

    got = await asyncio.gather(holder(a_in, b_in, "key-a"), holder(b_in, a_in, "key-b"))
    _equal(list(got), ["key-a", "key-b"], "results")


class _Boom(Exception):
    pass


async def case_a40_no_poisoning(locks: LockStore) -> None:
    """A40: a holder that raises propagates its own exception and the next holder gets in promptly."""
    boom = _Boom("holder failed")

    async def failing(signal: LeaseSignal) -> None:
        raise boom

    try:
        await locks.with_lock("poison", failing)
    except _Boom as exc:
        _expect(exc is boom, f"with_lock raised a different exception: {exc!r}")
    else:
        _fail("with_lock swallowed the holder's exception")

    async def ok(signal: LeaseSignal) -> str:
        return "next"

    try:
        got = await asyncio.wait_for(locks.with_lock("poison", ok), _PROMPT)
    except TimeoutError:
        _fail("a raising holder left its key locked")
    _equal(got, "next", "result of the holder after a raising one")


async def case_a40_cancelled_holder_frees_key(locks: LockStore) -> None:
    """A40: cancelling a task that holds a key frees it for the next holder."""
    inside = asyncio.Event()

    async def forever(signal: LeaseSignal) -> None:
        inside.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(locks.with_lock("cancel-holder", forever))
    await asyncio.wait_for(inside.wait(), _PROMPT)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    async def ok(signal: LeaseSignal) -> str:
        return "after"

    try:
        got = await asyncio.wait_for(locks.with_lock("cancel-holder", ok), _PROMPT)
    except TimeoutError:
        _fail("a cancelled holder left its key locked")
    _equal(got, "after", "result after a cancelled holder")


async def case_a40_cancelled_waiter_never_enters(locks: LockStore) -> None:
    """A40: a waiter cancelled before its turn never runs, and the waiters behind it still wait their turn."""
    release = asyncio.Event()
    a_inside = asyncio.Event()
    log: list[str] = []

    async def a_body(signal: LeaseSignal) -> None:
        a_inside.set()
        log.append("a-in")
        await release.wait()
        log.append("a-out")

    async def b_body(signal: LeaseSignal) -> None:
        log.append("b-in")

    async def c_body(signal: LeaseSignal) -> None:
        log.append("c-in")

    a = asyncio.create_task(locks.with_lock("waiters", a_body))
    await asyncio.wait_for(a_inside.wait(), _PROMPT)
    b = asyncio.create_task(locks.with_lock("waiters", b_body))
    await asyncio.sleep(0.05)
    c = asyncio.create_task(locks.with_lock("waiters", c_body))
    await asyncio.sleep(0.05)
    b.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await b
    await asyncio.sleep(0.05)
    _equal(log, ["a-in"], "what ran while the first holder was inside")
    release.set()
    await asyncio.wait_for(asyncio.gather(a, c), _PROMPT)
    _equal(log, ["a-in", "a-out", "c-in"], "order of entries (the cancelled waiter must not run)")


async def case_a40_signal_held_while_holding(locks: LockStore) -> None:
    """A40: the holder's signal is a LeaseSignal that reports the lease as held."""

    async def body(signal: LeaseSignal) -> bool:
        _expect(isinstance(signal, LeaseSignal), f"{signal!r} is not a LeaseSignal")
        signal.raise_if_lost()
        await asyncio.sleep(0.01)
        signal.raise_if_lost()
        return signal.lost

    _equal(await locks.with_lock("signal", body), False, "signal.lost while holding")
    _expect(isinstance(locks.durable, bool), f"durable must be a bool, got {locks.durable!r}")


def _lock_block(locks: LockStore, key: str) -> AbstractAsyncContextManager[LeaseSignal]:
    lock = getattr(locks, "lock", None)
    if lock is None:
        _fail(f"{type(locks).__name__} has no lock(key) block (BlockLockStore); use hold_lock over with_lock")
    return cast(AbstractAsyncContextManager[LeaseSignal], lock(key))


async def case_a40_block_holds_then_frees_and_owns_its_tasks(locks: LockStore) -> None:
    """``async with locks.lock(key) as lease:`` holds the key for the block only, and every task the
    block started (a lease renewal) is gone once it left: cancelled and awaited, never left running."""
    before = asyncio.all_tasks()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> bool:
        async with _lock_block(locks, "block") as lease:
            _expect(isinstance(lease, LeaseSignal), f"{lease!r} is not a LeaseSignal")
            entered.set()
            await release.wait()
            return lease.lost

    held = asyncio.create_task(holder())
    await asyncio.wait_for(entered.wait(), _PROMPT)
    waiter = asyncio.create_task(locks.with_lock("block", lambda _s: asyncio.sleep(0, "second")))
    await asyncio.sleep(0.05)
    _expect(not waiter.done(), "a second holder got in while the block held the key")
    release.set()
    _equal(await asyncio.wait_for(held, _PROMPT), False, "lease.lost inside the block")
    _equal(await asyncio.wait_for(waiter, _PROMPT), "second", "the next holder once the block left")
    left = {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()}
    _expect(not left, f"tasks outlived the lock block: {sorted(t.get_name() for t in left)}")


async def case_a40_block_frees_on_error(locks: LockStore) -> None:
    """A block that raises leaves with its own error and frees the key."""
    with contextlib.suppress(LookupError):
        async with _lock_block(locks, "block-error"):
            raise LookupError("the body failed")
    async with asyncio.timeout(_PROMPT):
        async with _lock_block(locks, "block-error") as lease:
            _expect(not lease.lost, "the next block's lease is held")


LOCK_CASES: tuple[tuple[str, LockCase], ...] = (
    ("test_a40_serial_per_key", case_a40_serial_per_key),
    ("test_a40_keys_concurrent", case_a40_keys_concurrent),
    ("test_a40_no_poisoning", case_a40_no_poisoning),
    ("test_a40_cancelled_holder_frees_key", case_a40_cancelled_holder_frees_key),
    ("test_a40_cancelled_waiter_never_enters", case_a40_cancelled_waiter_never_enters),
    ("test_a40_signal_held_while_holding", case_a40_signal_held_while_holding),
    ("test_a40_block_holds_then_frees_and_owns_its_tasks", case_a40_block_holds_then_frees_and_owns_its_tasks),
    ("test_a40_block_frees_on_error", case_a40_block_frees_on_error),
)


# -- pytest glue ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _opened(make: Callable[[], Any]) -> AsyncIterator[Any]:
    made = make()
    if isinstance(made, AbstractAsyncContextManager):
        async with made as store:
            yield store
    elif inspect.isawaitable(made):
        yield await made
    else:
        yield made


def run_store_case(name: str, make: Callable[[], Any], case: Callable[[Any], Awaitable[None]]) -> None:
    """Run one case on a fresh store and a fresh event loop; the timeout only catches hangs."""

    async def bounded() -> None:
        async with _opened(make) as store:
            try:
                await asyncio.wait_for(case(store), CASE_TIMEOUT)
            except TimeoutError:
                _fail(f"{name}: {case.__name__} hung for {CASE_TIMEOUT:g} s")

    asyncio.run(bounded())


def _slug(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower() or "unknown"


def _test_method(
    name: str, make: Callable[[], Any], test_name: str, case: Callable[[Any], Awaitable[None]]
) -> Callable[[object], None]:
    def test(self: object) -> None:
        run_store_case(name, make, case)

    test.__name__ = test.__qualname__ = test_name
    test.__doc__ = case.__doc__
    return test


def _suite(prefix: str, name: str, make: Any, cases: tuple[tuple[str, Any], ...]) -> type:
    """The collectable class ``<prefix>_<name>``, attributed to the module of the public builder's caller."""
    namespace: dict[str, Any] = {"__doc__": f"Store conformance suite for {name!r}."}
    for test_name, case in cases:
        namespace[test_name] = _test_method(name, cast(Callable[[], Any], make), test_name, case)
    caller = sys._getframe(2).f_globals.get("__name__")
    if isinstance(caller, str):
        namespace["__module__"] = caller
    return type(f"{prefix}_{_slug(name)}", (), namespace)


def run_instance_store_conformance(name: str, make_store: Factory[SandboxInstanceStore]) -> type:
    """A pytest-collectable class running A33-A39 against fresh stores from ``make_store``.

    Bind it to a module-level ``Test...`` name.
    """
    return _suite("TestInstanceStore", name, make_store, INSTANCE_CASES)


def lock_store_suite(name: str, make_locks: Factory[LockStore]) -> type:
    """A pytest-collectable class running the A40 lock cases against fresh lock stores from ``make_locks``.

    Bind it to a module-level ``Test...`` name.
    """
    return _suite("TestLockStore", name, make_locks, LOCK_CASES)


__all__ = [
    "CASE_TIMEOUT",
    "INSTANCE_CASES",
    "LOCK_CASES",
    "case_a33_missing_is_none",
    "case_a34_full_round_trip",
    "case_a35_absent_optionals_stay_absent",
    "case_a36_reupsert_replaces_everything",
    "case_a37_keys_isolated",
    "case_a38_delete_removes",
    "case_a39_delete_missing_is_noop",
    "case_a40_block_frees_on_error",
    "case_a40_block_holds_then_frees_and_owns_its_tasks",
    "case_a40_cancelled_holder_frees_key",
    "case_a40_cancelled_waiter_never_enters",
    "case_a40_keys_concurrent",
    "case_a40_no_poisoning",
    "case_a40_serial_per_key",
    "case_a40_signal_held_while_holding",
    "lock_store_suite",
    "run_instance_store_conformance",
    "run_store_case",
]
