"""Conformance suites for run stores (spec A34-A36, R41-R46) and run event logs (A32, R35, decision 3).

Say how to get a fresh, empty backend, then let the suite build a pytest class::

    TestMyRunStore = run_store_suite("mine", MyRunStore)
    TestMyEventLog = event_log_suite("mine", lambda: my_backend())   # -> (RunStore, EventLog)

``make`` is called once per case with no argument and may return the backend, an
awaitable of it, or an async context manager yielding it (to open and close a database
around the case). For the event log suite it yields a ``(RunStore, EventLog)`` pair that
share state, because fenced appends read the run's ``driver_epoch`` in the same
transaction. Cases are plain ``async def case_...(backend) -> None`` run by a sync test
method through ``asyncio.run`` (no pytest async plugin needed); assertions raise
``AssertionError`` with their own message.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar, cast

import msgspec

from ..abort import AbortController
from ..errors import (
    EpochFencedError,
    EventLogClosedError,
    InvalidOffsetError,
    InvalidRunIdError,
    InvalidRunStatusError,
    InvalidThreadIdError,
)
from ..events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TokenUsage,
    ToolCallArgsEvent,
)
from ..runs import (
    NOW_OFFSET,
    START_OFFSET,
    EventLog,
    RunError,
    RunListing,
    RunningListing,
    RunPatch,
    RunStatus,
    RunStore,
    format_offset,
    is_terminal_status,
    request_run_cancel,
    was_cancel_requested,
)
from .stores import _equal, _expect, _fail, _suite

# How long a case waits for something that should happen promptly (a reader woken by an append).
_PROMPT = 5.0
# How long a case waits to be sure something did NOT happen (a reader that must keep tailing).
_QUIET = 0.1

S = TypeVar("S")
Factory = Callable[[], S | Awaitable[S] | AbstractAsyncContextManager[S]]
Backend = tuple[RunStore, EventLog]
RunStoreCase = Callable[[RunStore], Awaitable[None]]
EventLogCase = Callable[[Backend], Awaitable[None]]

LONE_SURROGATE_ID = "run-\ud800-x"
# Ids boxwright.ids accepts however odd: each must be a run of its own.
HOSTILE_IDS = (
    "run with spaces 'and' \"quotes\"",
    "run;$(touch x);`y`",
    "run-\U0001f600-é",
    "r" * 200,
    "...",
    "_40",
    "@",
)
# Ids every store and log call refuses (InvalidRunIdError): the validator's whole list.
REFUSED_IDS = (
    "",
    ".",
    "..",
    "run/with/slashes",
    "run\\back",
    "run\x00nul",
    "run\nnewline",
    "run\x7fdel",
    LONE_SURROGATE_ID,
    "r" * 201,
)
_OFFSET_SAFE = re.compile(r"[0-9A-Za-z_.~-]{1,255}")


def _text(run_id: str, i: int) -> TextMessageContentEvent:
    return TextMessageContentEvent(message_id=f"{run_id}-m", delta=f"{i}")


def _texts(run_id: str, start: int, count: int) -> list[Event]:
    return [_text(run_id, i) for i in range(start, start + count)]


async def _drain(log: EventLog, run_id: str, after: str = START_OFFSET) -> list[tuple[str, Event]]:
    return [entry async for entry in log.read(run_id, after, live=False)]


async def _expect_raises(
    exc_type: type[BaseException], awaitable: Awaitable[Any], what: str, contains: str | None = None
) -> BaseException:
    try:
        await awaitable
    except exc_type as exc:
        if contains is not None and contains not in str(exc):
            _fail(f"{what}: {exc_type.__name__} message {str(exc)!r} does not mention {contains!r}")
        return exc
    except Exception as exc:
        _fail(f"{what}: expected {exc_type.__name__}, got {type(exc).__name__}: {exc}")
    _fail(f"{what}: expected {exc_type.__name__}, nothing was raised")


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + _PROMPT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            _fail(f"timed out after {_PROMPT:g} s waiting for {what}")
        await asyncio.sleep(0.005)


async def _first_step(log: EventLog, run_id: str, after: object) -> None:
    # A read checks its offset on the first step; live=False keeps a valid offset from waiting.
    iterator = log.read(run_id, cast(str, after), live=False)
    try:
        async for _ in iterator:
            break
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


# -- RunStore cases -------------------------------------------------------------------------------


async def case_a34_create_is_idempotent(runs: RunStore) -> None:
    """A34/R42: create makes a running record; a second create returns it unchanged, even with another thread."""
    _expect(isinstance(runs, RunStore), f"{runs!r} lacks get/create_or_resume/update/find_active_run")
    created = await runs.create_or_resume("run-1", "thread-1", started_at=1_700_000_000_000)
    _equal((created.run_id, created.thread_id, created.status), ("run-1", "thread-1", "running"), "new record")
    _equal(created.started_at, 1_700_000_000_000, "started_at")
    _expect(created.updated_at > 0, f"updated_at not stamped: {created.updated_at!r}")
    _equal(await runs.get("run-1"), created, "get after create")
    again = await runs.create_or_resume("run-1", "thread-other", started_at=1_800_000_000_000)
    _equal(again, created, "create_or_resume of an existing run (spec R6: a reused id gets the existing record)")
    _equal(await runs.get("never-created"), None, "get of an unknown run")


async def case_a34_no_resurrection(runs: RunStore) -> None:
    """A34/R42: create_or_resume never turns a finished (or interrupted) run back into a running one."""
    for status in ("completed", "failed", "aborted", "interrupted"):
        run_id = f"run-{status}"
        await runs.create_or_resume(run_id, "thread-1")
        written = await runs.update(run_id, RunPatch(status=status, finished_at=1_700_000_000_500))
        _expect(written is not None, f"update of {run_id} returned None")
        resumed = await runs.create_or_resume(run_id, "thread-1")
        _equal(resumed.status, status, f"status of a {status} run after create_or_resume")
        _equal(resumed, written, f"{status} record after create_or_resume")


async def case_a34_unknown_update_is_noop(runs: RunStore) -> None:
    """A34/R43: updating an unknown run writes nothing and returns None, fenced or not."""
    _equal(await runs.update("ghost", RunPatch(status="failed")), None, "update of an unknown run")
    _equal(await runs.update("ghost", RunPatch(driver_epoch=3), expected_epoch=2), None, "fenced update of unknown")
    _equal(await runs.get("ghost"), None, "unknown run after updates")


async def case_a34_structured_error(runs: RunStore) -> None:
    """A34/R43: error {message, code} round-trips; code stays absent when not given; None clears it."""
    await runs.create_or_resume("run-e", "thread-1")
    written = await runs.update("run-e", RunPatch(status="failed", error=RunError(message="boom: ü", code="E42")))
    _equal(written and written.error, RunError(message="boom: ü", code="E42"), "error written")
    _equal((await runs.get("run-e") or _fail("run-e vanished")).error, RunError(message="boom: ü", code="E42"), "error")
    await runs.update("run-e", RunPatch(error=RunError(message="no code")))
    got = await runs.get("run-e")
    _equal(got and got.error, RunError(message="no code"), "error without a code")
    _equal(got and got.error and got.error.code, None, "code of an error written without one")
    await runs.update("run-e", RunPatch(error=None))
    _equal((await runs.get("run-e") or _fail("run-e vanished")).error, None, "error after clearing")


async def case_a34_find_active_run(runs: RunStore) -> None:
    """A34/R44: the running run of a thread with the latest started_at; other statuses and threads never count."""
    _equal(await runs.find_active_run("thread-a"), None, "active run of an empty thread")
    await runs.create_or_resume("a-old", "thread-a", started_at=1_000)
    await runs.create_or_resume("a-new", "thread-a", started_at=3_000)
    await runs.create_or_resume("a-mid", "thread-a", started_at=2_000)
    await runs.create_or_resume("b-newest", "thread-b", started_at=9_000)
    active = await runs.find_active_run("thread-a")
    _equal(active and active.run_id, "a-new", "active run (latest started_at)")
    await runs.update("a-new", RunPatch(status="completed"))
    active = await runs.find_active_run("thread-a")
    _equal(active and active.run_id, "a-mid", "active run once the latest completed")
    await runs.update("a-mid", RunPatch(status="interrupted"))
    active = await runs.find_active_run("thread-a")
    _equal(active and active.run_id, "a-old", "active run once the next is interrupted (not running)")
    for status in ("failed", "aborted"):
        await runs.update("a-old", RunPatch(status=status))
        _equal(await runs.find_active_run("thread-a"), None, f"active run when the last running one is {status}")


async def case_a35_fresh_durable_fields_absent(runs: RunStore) -> None:
    """A35/R43: a fresh record has no finished_at, error, usage, sandbox_key, detached_since, cancel, epoch."""
    record = await runs.create_or_resume("run-fresh", "thread-1")
    for field in (
        "finished_at",
        "error",
        "usage",
        "sandbox_key",
        "detached_since",
        "cancel_requested",
        "driver_epoch",
    ):
        _equal(getattr(record, field), None, f"{field} of a fresh record")
    _equal(await runs.get("run-fresh"), record, "fresh record read back")


async def case_a35_every_field_round_trips(runs: RunStore) -> None:
    """A35/R43: every patchable field is written and read back exactly; update returns what get returns."""
    await runs.create_or_resume("run-all", "thread-1", started_at=1_723_456_789_012)
    usage = TokenUsage(provider="anthropic", model="m-1", input_tokens=12, output_tokens=7, total_tokens=19)
    patch = RunPatch(
        status="completed",
        finished_at=1_723_456_799_999,
        error=RunError(message="partial", code="warn"),
        usage=usage,
        sandbox_key="local-process:abc/def",
        detached_since=1_723_456_790_000,
        cancel_requested=True,
        driver_epoch=7,
    )
    written = await runs.update("run-all", patch)
    got = await runs.get("run-all")
    _equal(got, written, "record from get vs the one update returned")
    _expect(got is not None, "run-all vanished")
    assert got is not None
    for field in ("status", "finished_at", "error", "usage", "sandbox_key", "detached_since", "cancel_requested"):
        _equal(getattr(got, field), getattr(patch, field), field)
    _equal(got.driver_epoch, 7, "driver_epoch")
    _equal((got.run_id, got.thread_id, got.started_at), ("run-all", "thread-1", 1_723_456_789_012), "identity")


async def case_a35_epoch_overwrite_keeps_siblings(runs: RunStore) -> None:
    """A35/R43: writing only driver_epoch (UNSET elsewhere) keeps every other field."""
    await runs.create_or_resume("run-s", "thread-1")
    before = await runs.update(
        "run-s", RunPatch(sandbox_key="k", detached_since=5, cancel_requested=False, driver_epoch=1)
    )
    after = await runs.update("run-s", RunPatch(driver_epoch=2))
    _expect(before is not None and after is not None, "update returned None for a known run")
    assert before is not None and after is not None
    _equal(after.driver_epoch, 2, "driver_epoch")
    _equal(
        msgspec.structs.replace(after, driver_epoch=1, updated_at=before.updated_at), before, "siblings of the epoch"
    )


async def case_a35_none_clears_each(runs: RunStore) -> None:
    """A35/R43: None clears each clearable field; the others stay."""
    fields: dict[str, Any] = {
        "finished_at": 10,
        "error": RunError(message="x", code="c"),
        "usage": TokenUsage(input_tokens=1),
        "sandbox_key": "sk",
        "detached_since": 20,
        "cancel_requested": True,
        "driver_epoch": 3,
    }
    for name in fields:
        run_id = f"run-clear-{name}"
        await runs.create_or_resume(run_id, "thread-1")
        await runs.update(run_id, RunPatch(**fields))
        cleared = await runs.update(run_id, msgspec.structs.replace(RunPatch(), **{name: None}))
        _expect(cleared is not None, f"{run_id} vanished")
        assert cleared is not None
        _equal(getattr(cleared, name), None, f"{name} after clearing it")
        for other, value in fields.items():
            if other != name:
                _equal(getattr(cleared, other), value, f"{other} after clearing {name}")


async def case_a35_false_survives(runs: RunStore) -> None:
    """A35/R43: cancel_requested=False reads back as False, distinct from never set (None)."""
    await runs.create_or_resume("run-f", "thread-1")
    await runs.update("run-f", RunPatch(cancel_requested=False))
    got = await runs.get("run-f")
    _expect(got is not None and got.cancel_requested is False, f"cancel_requested: expected False, got {got!r}")


async def case_a36_list_reclaimable(runs: RunStore) -> None:
    """A36/R44: running and detached at or before now-ttl (inclusive); never terminal, interrupted or re-attached."""
    _expect(isinstance(runs, RunListing), f"{runs!r} lacks list_by_thread/list_reclaimable")
    listing = cast(RunListing, runs)
    now, ttl = 1_000_000, 1_000
    cases: dict[str, tuple[RunStatus, int | None]] = {
        "past": ("running", now - ttl - 500),
        "at-cutoff": ("running", now - ttl),
        "cutoff-plus-1": ("running", now - ttl + 1),
        "terminal": ("completed", now - ttl - 500),
        "failed": ("failed", now - ttl - 500),
        "interrupted": ("interrupted", now - ttl - 500),
        "never-detached": ("running", None),
        "re-attached": ("running", now - ttl - 900),
    }
    for run_id, (status, detached) in cases.items():
        await runs.create_or_resume(run_id, "thread-1")
        await runs.update(run_id, RunPatch(status=status, detached_since=detached))
    await runs.update("re-attached", RunPatch(detached_since=None))
    found = [r.run_id for r in await listing.list_reclaimable(now, ttl)]
    _equal(found, ["past", "at-cutoff"], "reclaimable runs, longest-detached first")
    await runs.create_or_resume("detached-now", "thread-1")
    await runs.update("detached-now", RunPatch(detached_since=now))
    found = [r.run_id for r in await listing.list_reclaimable(now, 0)]
    _equal(sorted(found), sorted(["past", "at-cutoff", "cutoff-plus-1", "detached-now"]), "reclaimable with ttl_ms=0")


async def case_profile_names_round_trip(runs: RunStore) -> None:
    """The profile names a run was started with are kept alongside the other fields, and cleared by None."""
    record = await runs.create_or_resume("run-p", "thread-1")
    _equal((record.sandbox_profile, record.harness_profile), (None, None), "profiles of a fresh record")
    written = await runs.update("run-p", RunPatch(sandbox_profile="docker", harness_profile="claude-box"))
    _equal(await runs.get("run-p"), written, "record from get vs the one update returned")
    later = await runs.update("run-p", RunPatch(driver_epoch=1, detached_since=5))
    _equal((later and later.sandbox_profile, later and later.harness_profile), ("docker", "claude-box"), "kept")
    cleared = await runs.update("run-p", RunPatch(harness_profile=None))
    _equal((cleared and cleared.sandbox_profile, cleared and cleared.harness_profile), ("docker", None), "cleared")


async def case_input_messages_round_trip(runs: RunStore) -> None:
    """A run's stored input (JSON text, quotes, newlines and all) is kept verbatim, and cleared by None."""
    record = await runs.create_or_resume("run-i", "thread-1")
    _equal(record.input_messages, None, "input of a fresh record")
    text = '[{"role":"user","content":"a \\"quoted\\" line\\nand = another"}]'
    written = await runs.update("run-i", RunPatch(input_messages=text))
    _equal(written and written.input_messages, text, "input as written")
    later = await runs.update("run-i", RunPatch(driver_epoch=1))
    _equal(later and later.input_messages, text, "input kept by another update")
    _equal(await runs.get("run-i"), later, "record from get vs the one update returned")
    cleared = await runs.update("run-i", RunPatch(input_messages=None))
    _equal(cleared and cleared.input_messages, None, "input cleared")


async def case_list_running(runs: RunStore) -> None:
    """``list_running``: running runs only (any detach), oldest started_at first, at most ``limit``."""
    _expect(isinstance(runs, RunningListing), f"{runs!r} lacks list_running")
    listing = cast(RunningListing, runs)
    _equal(await listing.list_running(10), [], "running runs of an empty store")
    for run_id, started in (("run-3", 3_000), ("run-1", 1_000), ("run-2", 2_000), ("run-0", 500)):
        await runs.create_or_resume(run_id, "thread-1", started_at=started)
    await runs.update("run-2", RunPatch(detached_since=2_500))
    await runs.update("run-0", RunPatch(status="completed"))
    await runs.create_or_resume("run-i", "thread-1", started_at=100)
    await runs.update("run-i", RunPatch(status="interrupted"))
    _equal([r.run_id for r in await listing.list_running(10)], ["run-1", "run-2", "run-3"], "running runs")
    _equal([r.run_id for r in await listing.list_running(2)], ["run-1", "run-2"], "at most limit")
    await runs.update("run-1", RunPatch(status="failed"))
    _equal([r.run_id for r in await listing.list_running(10)], ["run-2", "run-3"], "after one ended")


async def case_r41_list_by_thread(runs: RunStore) -> None:
    """R41: list_by_thread gives every run of the thread, oldest started_at first, any status."""
    listing = cast(RunListing, runs)
    _equal(await listing.list_by_thread("thread-x"), [], "runs of an empty thread")
    for run_id, started in (("x-3", 3_000), ("x-1", 1_000), ("x-2", 2_000)):
        await runs.create_or_resume(run_id, "thread-x", started_at=started)
    await runs.create_or_resume("y-0", "thread-y", started_at=0)
    await runs.update("x-1", RunPatch(status="failed"))
    _equal([r.run_id for r in await listing.list_by_thread("thread-x")], ["x-1", "x-2", "x-3"], "order")
    _equal([r.status for r in await listing.list_by_thread("thread-x")], ["failed", "running", "running"], "status")


async def case_r45_statuses(runs: RunStore) -> None:
    """R45: terminal is exactly completed|failed|aborted; an unknown status is refused and writes nothing."""
    _equal(
        [s for s in ("running", "interrupted", "completed", "failed", "aborted") if is_terminal_status(s)],
        ["completed", "failed", "aborted"],
        "terminal statuses",
    )
    _expect(not is_terminal_status("COMPLETED") and not is_terminal_status(None), "terminal test is not exact")
    before = await runs.create_or_resume("run-st", "thread-1")
    for bad in ("done", "COMPLETED", "", None):
        await _expect_raises(
            InvalidRunStatusError,
            runs.update("run-st", RunPatch(status=cast(Any, bad))),
            f"update with status {bad!r}",
            contains="not a run status",
        )
    _equal(await runs.get("run-st"), before, "record after refused status updates")


async def case_r46_cancel_request(runs: RunStore) -> None:
    """R46: request_run_cancel writes cancel_requested=True only; was_cancel_requested reads it."""
    await runs.create_or_resume("run-c", "thread-1")
    before = await runs.update("run-c", RunPatch(sandbox_key="sk", driver_epoch=4))
    _equal(await was_cancel_requested(runs, "run-c"), False, "cancel requested before any request")
    after = await request_run_cancel(runs, "run-c")
    _expect(before is not None and after is not None, "run-c vanished")
    assert before is not None and after is not None
    _equal(after.cancel_requested, True, "cancel_requested after the request")
    _equal(
        msgspec.structs.replace(after, cancel_requested=None, updated_at=before.updated_at),
        before,
        "fields other than cancel_requested after the request",
    )
    _equal(await was_cancel_requested(runs, "run-c"), True, "was_cancel_requested")
    _equal(await request_run_cancel(runs, "ghost"), None, "cancel of an unknown run")
    _equal(await was_cancel_requested(runs, "ghost"), False, "was_cancel_requested of an unknown run")


async def case_d3_fenced_update(runs: RunStore) -> None:
    """Decision 3: update(expected_epoch=e) lands only while driver_epoch is e; otherwise nothing changes."""
    await runs.create_or_resume("run-x", "thread-1")
    await _expect_raises(
        EpochFencedError,
        runs.update("run-x", RunPatch(status="completed"), expected_epoch=1),
        "fenced update of a run with no epoch",
    )
    await runs.update("run-x", RunPatch(driver_epoch=1))
    ok = await runs.update("run-x", RunPatch(sandbox_key="k1"), expected_epoch=1)
    _equal(ok and ok.sandbox_key, "k1", "update at the held epoch")
    await runs.update("run-x", RunPatch(driver_epoch=2))
    before = await runs.get("run-x")
    exc = await _expect_raises(
        EpochFencedError,
        runs.update("run-x", RunPatch(status="failed", error=RunError(message="late")), expected_epoch=1),
        "terminal update by a superseded driver",
        contains="epoch",
    )
    _equal((getattr(exc, "held_epoch", None), getattr(exc, "stored_epoch", None)), (1, 2), "epochs in the error")
    _equal(await runs.get("run-x"), before, "record after a fenced update")
    done = await runs.update("run-x", RunPatch(status="completed"), expected_epoch=2)
    _equal(done and done.status, "completed", "terminal update by the current driver")


async def case_d7_run_ids(runs: RunStore) -> None:
    """Decision 7 and boxwright.ids: every refused run id (or thread id) raises naming it; odd but valid ids
    are distinct runs."""
    for bad in REFUSED_IDS:
        calls: list[tuple[Awaitable[Any], str]] = [
            (runs.create_or_resume(bad, "t"), "create_or_resume"),
            (runs.get(bad), "get"),
            (runs.update(bad, RunPatch(status="failed")), "update"),
        ]
        for call, what in calls:
            await _expect_raises(InvalidRunIdError, call, f"{what} of the run id {bad[:40]!r}", contains="run id")
        await _expect_raises(
            InvalidThreadIdError, runs.create_or_resume("run-ok", bad), f"thread id {bad[:40]!r}", "thread id"
        )
    _equal(await runs.get("run-ok"), None, "record of a run whose thread id was refused")
    for i, run_id in enumerate(HOSTILE_IDS):
        await runs.create_or_resume(run_id, f"thread-{i}")
    for i, run_id in enumerate(HOSTILE_IDS):
        got = await runs.get(run_id)
        _equal(got and (got.run_id, got.thread_id), (run_id, f"thread-{i}"), f"record of {run_id[:40]!r}")


async def case_r43_updated_at_and_copies(runs: RunStore) -> None:
    """R43: every write stamps updated_at; a record handed out cannot change what is stored."""
    created = await runs.create_or_resume("run-u", "thread-1")
    await asyncio.sleep(0.003)
    written = await runs.update("run-u", RunPatch(usage=TokenUsage(input_tokens=5)))
    _expect(written is not None and written.updated_at >= created.updated_at, "updated_at went backwards")
    assert written is not None and written.usage is not None
    _expect(written.updated_at > created.updated_at, "updated_at not stamped by an update 3 ms later")
    written.usage.input_tokens = 999  # a mutable nested struct: the store's copy must not follow
    got = await runs.get("run-u")
    _equal(got and got.usage, TokenUsage(input_tokens=5), "stored usage after mutating a returned record")


async def case_concurrent_creates(runs: RunStore) -> None:
    """R42 under concurrency: 16 concurrent creates of one id make one record; 16 distinct ids make 16."""
    same = await asyncio.gather(*(runs.create_or_resume("run-same", f"thread-{i}") for i in range(16)))
    _equal(len({(r.run_id, r.thread_id, r.started_at) for r in same}), 1, "distinct records from concurrent creates")
    await asyncio.gather(*(runs.create_or_resume(f"run-{i}", "thread-many", started_at=i) for i in range(16)))
    listed = await cast(RunListing, runs).list_by_thread("thread-many")
    _equal([r.run_id for r in listed], [f"run-{i}" for i in range(16)], "runs of thread-many")


RUN_STORE_CASES: tuple[tuple[str, RunStoreCase], ...] = (
    ("test_a34_create_is_idempotent", case_a34_create_is_idempotent),
    ("test_a34_no_resurrection", case_a34_no_resurrection),
    ("test_a34_unknown_update_is_noop", case_a34_unknown_update_is_noop),
    ("test_a34_structured_error", case_a34_structured_error),
    ("test_a34_find_active_run", case_a34_find_active_run),
    ("test_a35_fresh_durable_fields_absent", case_a35_fresh_durable_fields_absent),
    ("test_a35_every_field_round_trips", case_a35_every_field_round_trips),
    ("test_a35_epoch_overwrite_keeps_siblings", case_a35_epoch_overwrite_keeps_siblings),
    ("test_a35_none_clears_each", case_a35_none_clears_each),
    ("test_a35_false_survives", case_a35_false_survives),
    ("test_a36_list_reclaimable", case_a36_list_reclaimable),
    ("test_r41_list_by_thread", case_r41_list_by_thread),
    ("test_profile_names_round_trip", case_profile_names_round_trip),
    ("test_input_messages_round_trip", case_input_messages_round_trip),
    ("test_list_running", case_list_running),
    ("test_r45_statuses", case_r45_statuses),
    ("test_r46_cancel_request", case_r46_cancel_request),
    ("test_d3_fenced_update", case_d3_fenced_update),
    ("test_d7_run_ids", case_d7_run_ids),
    ("test_r43_updated_at_and_copies", case_r43_updated_at_and_copies),
    ("test_concurrent_creates", case_concurrent_creates),
)


# -- EventLog cases -------------------------------------------------------------------------------


async def case_a32_offsets_unique_increasing(backend: Backend) -> None:
    """A32/R35: one offset per event, unique, strictly increasing as strings across batches, URL/SSE-safe."""
    _runs, log = backend
    _expect(isinstance(log, EventLog), f"{log!r} lacks append/read/snapshot/tail/close/is_closed")
    empty_tail = await log.tail("run-o")
    _equal(empty_tail, format_offset("run-o", 0), "tail of an unknown log")
    offsets: list[str] = []
    for size in (1, 32, 5, 17):
        got = await log.append("run-o", _texts("run-o", len(offsets), size))
        _equal(len(got), size, f"offsets returned for a batch of {size}")
        offsets += got
    _equal(len(set(offsets)), len(offsets), "distinct offsets")
    _expect(all(a < b for a, b in itertools.pairwise(offsets)), "offsets not strictly increasing")
    _expect(empty_tail < offsets[0], "empty-log tail does not sort before the first offset")
    for offset in offsets:
        _expect(bool(_OFFSET_SAFE.fullmatch(offset)), f"offset {offset!r} has characters a URL or SSE id cannot hold")
        _expect(offset not in (START_OFFSET, NOW_OFFSET), f"offset {offset!r} is a reserved token")
    _equal(await log.tail("run-o"), offsets[-1], "tail after appends")
    _equal(await log.append("run-o", []), [], "offsets of an empty batch")
    entries = await _drain(log, "run-o", empty_tail)
    _equal([o for o, _ in entries], offsets, "offsets read back from the empty-log tail")


async def case_a32_unknown_snapshot_empty(backend: Backend) -> None:
    """A32/R35: snapshot of an unknown run is [] and creates nothing; every snapshot is a fresh list."""
    _, log = backend
    _equal(await log.snapshot("ghost"), [], "snapshot of an unknown run")
    _equal(await log.is_closed("ghost"), False, "is_closed of an unknown run")
    _equal(await log.tail("ghost"), format_offset("ghost", 0), "tail of an unknown run")
    await log.append("run-s", _texts("run-s", 0, 3))
    first = await log.snapshot("run-s")
    first.clear()
    _equal(len(await log.snapshot("run-s")), 3, "snapshot after clearing an earlier snapshot's list")


async def case_r35_snapshot_bound(backend: Backend) -> None:
    """R35: snapshot(limit) returns at most the first `limit` events and never waits."""
    _, log = backend
    events = _texts("run-b", 0, 40)
    await log.append("run-b", events[:32])
    await log.append("run-b", events[32:])
    _equal(await log.snapshot("run-b", 0), [], "snapshot(limit=0)")
    _equal(await log.snapshot("run-b", 3), events[:3], "snapshot(limit=3)")
    _equal(await log.snapshot("run-b", 35), events[:35], "snapshot(limit=35) across batches")
    _equal(await log.snapshot("run-b", 1000), events, "snapshot(limit past the end)")
    _equal(await log.snapshot("run-b"), events, "snapshot()")
    # An open log: snapshot must return, not wait for more.
    _equal(len(await asyncio.wait_for(log.snapshot("run-b"), _PROMPT)), 40, "snapshot of an open log")


async def case_a32_events_round_trip(backend: Backend) -> None:
    """R35: what is read equals what was appended, every event type and nested value intact."""
    _, log = backend
    events: list[Event] = [
        RunStartedEvent(thread_id="t", run_id="run-e", input={"messages": [{"role": "user", "content": "hé"}]}),
        TextMessageContentEvent(message_id="m", delta="line\nbreak \U0001f600", timestamp=1_700_000_000_000),
        ToolCallArgsEvent(tool_call_id="c", delta='{"a":1}'),
        CustomEvent(name="sandbox.file", value={"path": "a/b", "n": [1, 2.5, None, True]}),
        RunErrorEvent(message="bad", code="E1"),
        RunFinishedEvent(thread_id="t", run_id="run-e", usage=[TokenUsage(input_tokens=3)]),
    ]
    await log.append("run-e", events)
    _equal([e for _, e in await _drain(log, "run-e")], events, "events read back")
    _equal(await log.snapshot("run-e"), events, "events in a snapshot")


async def case_a32_read_strictly_after(backend: Backend) -> None:
    """R35: read yields entries strictly after the offset; -1 from the start; the tail yields nothing."""
    _, log = backend
    offsets = await log.append("run-r", _texts("run-r", 0, 10))
    everything = await _drain(log, "run-r", START_OFFSET)
    _equal([o for o, _ in everything], offsets, "offsets from -1")
    after_third = await _drain(log, "run-r", offsets[2])
    _equal([o for o, _ in after_third], offsets[3:], "offsets after the third")
    _equal([e for _, e in after_third], _texts("run-r", 3, 7), "events after the third")
    _equal(await _drain(log, "run-r", offsets[-1]), [], "read from the last offset")


async def case_a32_read_tails_until_close(backend: Backend) -> None:
    """A32/R35: a live read keeps tailing past RUN_FINISHED and RUN_ERROR; close ends it and wakes it."""
    _, log = backend
    await log.append("run-t", [_text("run-t", 0)])
    seen: list[Event] = []
    got_two = asyncio.Event()

    async def tail() -> None:
        async for _, event in log.read("run-t", START_OFFSET):
            seen.append(event)
            if len(seen) == 2:
                got_two.set()

    reader = asyncio.create_task(tail())
    finished = RunFinishedEvent(thread_id="t", run_id="run-t")
    await log.append("run-t", [finished])
    await asyncio.wait_for(got_two.wait(), _PROMPT)
    await asyncio.sleep(_QUIET)
    _expect(not reader.done(), "the read ended at RUN_FINISHED though the log is open")
    error = RunErrorEvent(message="late")
    await log.append("run-t", [error, _text("run-t", 1)])
    await asyncio.sleep(_QUIET)
    _expect(not reader.done(), "the read ended at RUN_ERROR though the log is open")
    await log.close("run-t")
    await asyncio.wait_for(reader, _PROMPT)
    _equal(seen, [_text("run-t", 0), finished, error, _text("run-t", 1)], "events seen by the tailing reader")
    _equal([e for _, e in await _drain(log, "run-t")], seen, "a read of the closed log ends by itself")


async def case_r35_read_now_is_tail_only(backend: Backend) -> None:
    """R36: `now` starts at the tail as it is when the read begins."""
    _, log = backend
    await log.append("run-n", _texts("run-n", 0, 3))
    iterator = log.read("run-n", NOW_OFFSET)
    first = asyncio.ensure_future(iterator.__anext__())
    await asyncio.sleep(_QUIET)
    _expect(not first.done(), "a read from `now` yielded an event appended before it began")
    offsets = await log.append("run-n", _texts("run-n", 3, 2))
    offset, event = await asyncio.wait_for(first, _PROMPT)
    _equal((offset, event), (offsets[0], _text("run-n", 3)), "first entry read from `now`")
    await log.close("run-n")
    rest = [entry async for entry in iterator]
    _equal([o for o, _ in rest], offsets[1:], "the rest of a read from `now`")
    _equal(await _drain(log, "run-n", NOW_OFFSET), [], "`now` on a closed log")


async def case_r35_read_before_first_append(backend: Backend) -> None:
    """R35: a read of a run nobody appended to yet waits, then receives the first append."""
    _, log = backend
    reader = asyncio.create_task(_collect_until_closed(log, "run-late"))
    await asyncio.sleep(_QUIET)
    _expect(not reader.done(), "a read of an unknown run ended instead of waiting")
    offsets = await log.append("run-late", _texts("run-late", 0, 2))
    await log.close("run-late")
    got = await asyncio.wait_for(reader, _PROMPT)
    _equal([o for o, _ in got], offsets, "entries seen by an early reader")


async def _collect_until_closed(log: EventLog, run_id: str, after: str = START_OFFSET) -> list[tuple[str, Event]]:
    return [entry async for entry in log.read(run_id, after)]


async def case_a32_bad_offsets_refused(backend: Backend) -> None:
    """A32/R36: malformed, foreign and never-issued offsets raise InvalidOffsetError saying which."""
    _, log = backend
    mine = await log.append("run-a", _texts("run-a", 0, 3))
    theirs = await log.append("run-b", _texts("run-b", 0, 3))
    await _expect_raises(InvalidOffsetError, _first_step(log, "run-a", theirs[0]), "foreign offset", "another run")
    malformed: list[object] = [
        "",
        "abc",
        "0",
        "-2",
        " -1",
        "NOW",
        mine[0].upper(),
        mine[0][:-1],
        mine[0] + "0",
        mine[0].replace("_", "-"),
        mine[0] + "\n",
        "../" + mine[0],
        None,
        7,
    ]
    for bad in malformed:
        await _expect_raises(InvalidOffsetError, _first_step(log, "run-a", bad), f"offset {bad!r}", "offset")
    beyond = format_offset("run-a", 4)
    await _expect_raises(InvalidOffsetError, _first_step(log, "run-a", beyond), "unissued offset", "never issued")
    await _expect_raises(
        InvalidOffsetError, _first_step(log, "ghost", format_offset("ghost", 1)), "offset of an unknown run"
    )
    _equal(len(await _drain(log, "run-a", mine[0])), 2, "a valid offset still reads after the refusals")


async def case_r35_close_semantics(backend: Backend) -> None:
    """R35: close is idempotent and final: is_closed, no append lands after it, other runs untouched."""
    _, log = backend
    await log.append("run-c", _texts("run-c", 0, 2))
    await log.append("run-other", _texts("run-other", 0, 1))
    _equal(await log.is_closed("run-c"), False, "is_closed before close")
    await log.close("run-c")
    await log.close("run-c")
    _equal(await log.is_closed("run-c"), True, "is_closed after close")
    await _expect_raises(EventLogClosedError, log.append("run-c", [_text("run-c", 9)]), "append after close")
    _equal(len(await log.snapshot("run-c")), 2, "events after a refused append")
    _equal(await log.is_closed("run-other"), False, "another run after closing run-c")
    await log.append("run-other", [_text("run-other", 1)])
    await log.close("never-appended")
    _equal(await log.is_closed("never-appended"), True, "is_closed of a run closed before any append")
    _equal(await asyncio.wait_for(_drain(log, "never-appended"), _PROMPT), [], "read of an empty closed log")
    _equal(await asyncio.wait_for(_collect_until_closed(log, "never-appended"), _PROMPT), [], "live read, empty closed")


async def case_d3_epoch_fence(backend: Backend) -> None:
    """Decision 3: a fenced append lands only at the run's current driver_epoch; a superseded one never does."""
    runs, log = backend
    await _expect_raises(
        EpochFencedError, log.append("run-f", [_text("run-f", 0)], epoch=1), "fenced append to an unknown run"
    )
    await runs.create_or_resume("run-f", "thread-1")
    await _expect_raises(
        EpochFencedError, log.append("run-f", [_text("run-f", 0)], epoch=1), "fenced append, run has no epoch"
    )
    await runs.update("run-f", RunPatch(driver_epoch=1))
    first = await log.append("run-f", _texts("run-f", 0, 3), epoch=1)
    await runs.update("run-f", RunPatch(driver_epoch=2))
    exc = await _expect_raises(
        EpochFencedError, log.append("run-f", _texts("run-f", 3, 32), epoch=1), "append by a superseded driver"
    )
    _equal((getattr(exc, "held_epoch", None), getattr(exc, "stored_epoch", None)), (1, 2), "epochs in the error")
    _equal(await log.snapshot("run-f"), _texts("run-f", 0, 3), "log after a fenced append")
    second = await log.append("run-f", _texts("run-f", 3, 2), epoch=2)
    _expect(first[-1] < second[0], "offsets did not continue after a fenced append")
    _equal(second[0], format_offset("run-f", 4), "offset after a refused batch (no gap, no reuse)")
    await _expect_raises(
        EpochFencedError,
        runs.update("run-f", RunPatch(status="completed"), expected_epoch=1),
        "terminal status by the superseded driver",
    )
    _equal((await runs.get("run-f") or _fail("run-f vanished")).status, "running", "status after a fenced update")
    await log.append("run-f", [_text("run-f", 5)])  # unfenced appends are the caller's choice
    _equal(len(await log.snapshot("run-f")), 6, "events after an unfenced append")


async def case_r35_abort_ends_read(backend: Backend) -> None:
    """R35: an aborted signal ends a waiting read quietly; a pre-aborted one yields nothing."""
    _, log = backend
    await log.append("run-ab", _texts("run-ab", 0, 2))
    controller = AbortController()
    seen: list[str] = []

    async def tail() -> None:
        async for offset, _ in log.read("run-ab", START_OFFSET, signal=controller.signal):
            seen.append(offset)

    reader = asyncio.create_task(tail())
    await _until(lambda: len(seen) == 2, "the reader to see the 2 stored entries")
    await asyncio.sleep(_QUIET)  # now it waits for a third
    _equal(len(seen), 2, "entries before the abort")
    controller.abort("client went away")
    await asyncio.wait_for(reader, _PROMPT)
    _expect(reader.exception() is None, f"an aborted read raised {reader.exception()!r}")
    pre = AbortController()
    pre.abort("before")
    _equal([e async for e in log.read("run-ab", START_OFFSET, signal=pre.signal)], [], "read with an aborted signal")


async def case_r35_live_false(backend: Backend) -> None:
    """read(live=False) yields what is stored after the offset and returns without waiting."""
    _, log = backend
    offsets = await log.append("run-l", _texts("run-l", 0, 5))
    got = await asyncio.wait_for(_drain(log, "run-l", offsets[1]), _PROMPT)
    _equal([o for o, _ in got], offsets[2:], "live=False from the second offset")
    _equal(await asyncio.wait_for(_drain(log, "ghost"), _PROMPT), [], "live=False of an unknown run")


async def case_concurrency_16_runs(backend: Backend) -> None:
    """16 concurrent writers to 16 runs: every log complete, in order, offsets unique."""
    runs, log = backend
    ids = [f"run-{i}" for i in range(16)]
    for run_id in ids:
        await runs.create_or_resume(run_id, "thread-1")
        await runs.update(run_id, RunPatch(driver_epoch=1))

    async def writer(run_id: str) -> list[str]:
        offsets: list[str] = []
        for b in range(6):
            offsets += await log.append(run_id, _texts(run_id, b * 32, 32), epoch=1)
        return offsets

    results = await asyncio.gather(*(writer(run_id) for run_id in ids))
    for run_id, offsets in zip(ids, results, strict=True):
        _equal(await log.snapshot(run_id), _texts(run_id, 0, 192), f"log of {run_id}")
        _equal(offsets, [format_offset(run_id, seq) for seq in range(1, 193)], f"offsets of {run_id}")


async def case_concurrency_one_run(backend: Backend) -> None:
    """16 tasks appending to ONE run at the same epoch: nothing lost or doubled, offsets unique and dense."""
    runs, log = backend
    await runs.create_or_resume("run-1", "thread-1")
    await runs.update("run-1", RunPatch(driver_epoch=5))

    async def writer(w: int) -> list[tuple[str, Event]]:
        landed: list[tuple[str, Event]] = []
        for b in range(4):
            batch = _texts(f"w{w}", b * 32, 32)
            landed += zip(await log.append("run-1", batch, epoch=5), batch, strict=True)
        return landed

    results = await asyncio.gather(*(writer(w) for w in range(16)))
    all_offsets = [o for landed in results for o, _ in landed]
    _equal(len(set(all_offsets)), 16 * 4 * 32, "distinct offsets from 16 writers")
    _equal(sorted(all_offsets), [format_offset("run-1", s) for s in range(1, 2049)], "offsets (dense, from 1)")
    stored = await _drain(log, "run-1")
    _equal(sorted(stored, key=lambda entry: entry[0]), stored, "entries in offset order")
    _equal(dict(stored), {o: e for landed in results for o, e in landed}, "each offset holds the event it was given")
    for w, landed in enumerate(results):
        mine = [e for _, e in stored if isinstance(e, TextMessageContentEvent) and e.message_id == f"w{w}-m"]
        _equal(mine, [e for _, e in landed], f"writer {w}'s events, in its own order")


async def case_many_readers(backend: Backend) -> None:
    """R35: several live readers each receive every event once, in order, and end at close."""
    _, log = backend
    readers = [asyncio.create_task(_collect_until_closed(log, "run-m")) for _ in range(8)]
    offsets: list[str] = []
    for b in range(5):
        offsets += await log.append("run-m", _texts("run-m", b * 10, 10))
        await asyncio.sleep(0.01)
    await log.close("run-m")
    for i, reader in enumerate(readers):
        got = await asyncio.wait_for(reader, _PROMPT)
        _equal([o for o, _ in got], offsets, f"offsets seen by reader {i}")


async def case_d7_run_ids_in_logs(backend: Backend) -> None:
    """Decision 7 and boxwright.ids: refused run ids are refused by every log call; hostile ids get separate logs."""
    _, log = backend
    for bad in REFUSED_IDS:
        calls: list[tuple[Awaitable[Any], str]] = [
            (log.append(bad, [_text("x", 0)]), "append"),
            (log.snapshot(bad), "snapshot"),
            (log.close(bad), "close"),
            (log.tail(bad), "tail"),
            (_first_step(log, bad, START_OFFSET), "read"),
        ]
        for call, what in calls:
            await _expect_raises(InvalidRunIdError, call, f"{what} with the run id {bad[:40]!r}", "run id")
    for i, run_id in enumerate(HOSTILE_IDS):
        await log.append(run_id, _texts(run_id, 0, i + 1))
    for i, run_id in enumerate(HOSTILE_IDS):
        _equal(await log.snapshot(run_id), _texts(run_id, 0, i + 1), f"log of {run_id[:40]!r}")


EVENT_LOG_CASES: tuple[tuple[str, EventLogCase], ...] = (
    ("test_a32_offsets_unique_increasing", case_a32_offsets_unique_increasing),
    ("test_a32_unknown_snapshot_empty", case_a32_unknown_snapshot_empty),
    ("test_r35_snapshot_bound", case_r35_snapshot_bound),
    ("test_a32_events_round_trip", case_a32_events_round_trip),
    ("test_a32_read_strictly_after", case_a32_read_strictly_after),
    ("test_a32_read_tails_until_close", case_a32_read_tails_until_close),
    ("test_r35_read_now_is_tail_only", case_r35_read_now_is_tail_only),
    ("test_r35_read_before_first_append", case_r35_read_before_first_append),
    ("test_a32_bad_offsets_refused", case_a32_bad_offsets_refused),
    ("test_r35_close_semantics", case_r35_close_semantics),
    ("test_d3_epoch_fence", case_d3_epoch_fence),
    ("test_r35_abort_ends_read", case_r35_abort_ends_read),
    ("test_r35_live_false", case_r35_live_false),
    ("test_concurrency_16_runs", case_concurrency_16_runs),
    ("test_concurrency_one_run", case_concurrency_one_run),
    ("test_many_readers", case_many_readers),
    ("test_d7_run_ids_in_logs", case_d7_run_ids_in_logs),
)


# -- pytest glue ----------------------------------------------------------------------------------


def run_store_suite(name: str, make: Factory[RunStore]) -> type:
    """A pytest-collectable class running the RunStore cases against fresh stores from ``make``.

    Bind it to a module-level ``Test...`` name.
    """
    return _suite("TestRunStore", name, make, RUN_STORE_CASES)


def event_log_suite(name: str, make: Factory[Backend]) -> type:
    """A pytest-collectable class running the EventLog cases; ``make`` yields a ``(RunStore, EventLog)`` pair.

    Bind it to a module-level ``Test...`` name.
    """
    return _suite("TestEventLog", name, make, EVENT_LOG_CASES)


__all__ = [
    "EVENT_LOG_CASES",
    "HOSTILE_IDS",
    "LONE_SURROGATE_ID",
    "REFUSED_IDS",
    "RUN_STORE_CASES",
    "Backend",
    "event_log_suite",
    "run_store_suite",
]
