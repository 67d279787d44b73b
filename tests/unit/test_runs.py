"""Run records, event logs, pipe_to_run_log and RunController on the memory backend (spec §F-H: R35-R50)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest

from boxwright import events as ev
from boxwright.abort import AbortController, AbortSignal
from boxwright.errors import (
    EpochFencedError,
    EventLogClosedError,
    InvalidOffsetError,
    InvalidRunIdError,
    RunAlreadyDrivenError,
    RunIdError,
    StaleDriverError,
)
from boxwright.runs import (
    DURABILITY_BATCH,
    RUN_ACCEPTED_EVENT,
    RUN_CANCEL_REASON,
    EventLog,
    RunController,
    RunError,
    RunListing,
    RunPatch,
    RunRecord,
    RunStore,
    format_offset,
    parse_offset,
    pipe_to_run_log,
    run_offset_tag,
    total_usage,
)
from boxwright.stores.memory import MemoryEventLog, MemoryRunStore, memory_run_backend
from boxwright.testkit.runs import event_log_suite, run_store_suite

# A34-A36, R41-R46, decisions 3 and 7
TestMemoryRunStore = run_store_suite("memory", MemoryRunStore)
# A32, R35-R36, decisions 3 and 7, concurrency
TestMemoryEventLog = event_log_suite("memory", memory_run_backend)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def text(i: int, message_id: str = "m") -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id=message_id, delta=str(i))


STARTED = ev.RunStartedEvent(thread_id="t-1", run_id="r-1")
FINISHED = ev.RunFinishedEvent(thread_id="t-1", run_id="r-1")


async def stream_of(items: Sequence[ev.Event]) -> AsyncIterator[ev.Event]:
    for item in items:
        yield item


class RecordingLog:
    """A MemoryEventLog that records every call, and can be told to fail some of them."""

    def __init__(self, inner: MemoryEventLog) -> None:
        self.inner = inner
        self.batches: list[list[str]] = []  # event types per append call that landed
        self.closes = 0
        self.fail_appends_from: int | None = None  # 0-based append call index from which appends raise
        self.fail_close = False
        self.calls = 0

    async def append(self, run_id, events, *, epoch=None):
        index = self.calls
        self.calls += 1
        if self.fail_appends_from is not None and index >= self.fail_appends_from:
            raise OSError(f"disk full (append #{index})")
        offsets = await self.inner.append(run_id, events, epoch=epoch)
        self.batches.append([e.type for e in events])
        return offsets

    def read(self, run_id, after="-1", *, signal=None, live=True):
        return self.inner.read(run_id, after, signal=signal, live=live)

    async def snapshot(self, run_id, limit=None):
        return await self.inner.snapshot(run_id, limit)

    async def tail(self, run_id):
        return await self.inner.tail(run_id)

    async def close(self, run_id):
        self.closes += 1
        if self.fail_close:
            raise OSError("close failed")
        await self.inner.close(run_id)

    async def is_closed(self, run_id):
        return await self.inner.is_closed(run_id)


class FlakyRuns:
    """A MemoryRunStore whose chosen methods raise."""

    def __init__(self, inner: MemoryRunStore, *failing: str) -> None:
        self.inner = inner
        self.failing = set(failing)

    def _maybe_fail(self, name: str) -> None:
        if name in self.failing:
            raise OSError(f"store {name} failed")

    async def get(self, run_id):
        self._maybe_fail("get")
        return await self.inner.get(run_id)

    async def create_or_resume(self, run_id, thread_id, *, started_at=None):
        self._maybe_fail("create_or_resume")
        return await self.inner.create_or_resume(run_id, thread_id, started_at=started_at)

    async def update(self, run_id, patch, *, expected_epoch=None):
        self._maybe_fail("update")
        return await self.inner.update(run_id, patch, expected_epoch=expected_epoch)

    async def find_active_run(self, thread_id):
        return await self.inner.find_active_run(thread_id)


async def until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll an async or sync condition instead of sleeping a guessed time (robust on a loaded machine)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def has_events(log, run_id: str, count: int) -> bool:
    return len(await log.snapshot(run_id)) >= count


def backend() -> tuple[MemoryRunStore, RecordingLog]:
    runs, log = memory_run_backend()
    return runs, RecordingLog(log)


def types(events: Sequence[ev.Event]) -> list[str]:
    return [e.type for e in events]


# -- record shapes, offsets, errors ---------------------------------------------------------------


def test_record_wire_is_camel_case_and_omits_unset():
    record = RunRecord(
        run_id="r",
        thread_id="t",
        status="failed",
        started_at=1,
        updated_at=2,
        error=RunError(message="m", code="c"),
        cancel_requested=False,
        driver_epoch=3,
    )
    wire = msgspec.json.decode(msgspec.json.encode(record))
    assert wire == {
        "runId": "r",
        "threadId": "t",
        "status": "failed",
        "startedAt": 1,
        "updatedAt": 2,
        "error": {"message": "m", "code": "c"},
        "cancelRequested": False,
        "driverEpoch": 3,
    }
    assert msgspec.json.decode(msgspec.json.encode(record), type=RunRecord) == record
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"runId":"r","threadId":"t","status":"done","startedAt":1,"updatedAt":1}', type=RunRecord)
    # UNSET fields are left out of a patch on the wire; None is sent as null (clear).
    assert msgspec.json.decode(msgspec.json.encode(RunPatch(sandbox_key=None, driver_epoch=2))) == {
        "sandboxKey": None,
        "driverEpoch": 2,
    }


def test_memory_backends_satisfy_the_protocols():
    runs, log = memory_run_backend()
    assert isinstance(runs, RunStore) and isinstance(runs, RunListing) and isinstance(log, EventLog)


def test_offset_format_is_documented_shape_and_sorts_by_position():
    tag = run_offset_tag("run-1")
    assert len(tag) == 16 and int(tag, 16) >= 0
    assert format_offset("run-1", 42) == f"{tag}_{42:020d}"
    assert format_offset("run-1", 9) < format_offset("run-1", 10) < format_offset("run-1", 10**15)
    assert parse_offset("run-1", format_offset("run-1", 42)) == 42
    assert parse_offset("run-1", "-1") == 0 and parse_offset("run-1", "now") is None
    assert run_offset_tag("run-1") != run_offset_tag("run-2")


def test_parse_offset_names_what_is_wrong():
    with pytest.raises(InvalidOffsetError, match="another run") as foreign:
        parse_offset("run-1", format_offset("run-2", 1))
    assert foreign.value.run_id == "run-1" and foreign.value.offset == format_offset("run-2", 1)
    assert isinstance(foreign.value, ValueError)  # an HTTP layer maps it to 400
    with pytest.raises(InvalidOffsetError, match="malformed"):
        parse_offset("run-1", "12")
    with pytest.raises(InvalidOffsetError, match="string"):
        parse_offset("run-1", 12)
    with pytest.raises(InvalidRunIdError, match="lone surrogate"):
        parse_offset("\udcff", "-1")


def test_error_aliases_and_fields():
    assert RunIdError is InvalidRunIdError and StaleDriverError is EpochFencedError
    exc = EpochFencedError("r", 1, None, "append")
    assert "no run record" in str(exc) and exc.held_epoch == 1 and exc.stored_epoch is None
    assert "closed" in str(EventLogClosedError("r"))


def test_total_usage_sums_counts_and_keeps_shared_names():
    assert total_usage(None) is None and total_usage([]) is None
    one = ev.TokenUsage(model="a", input_tokens=1)
    assert total_usage([one]) == one and total_usage([one]) is not one
    summed = total_usage(
        [
            ev.TokenUsage(provider="p", model="a", input_tokens=1, output_tokens=2),
            ev.TokenUsage(provider="p", model="b", input_tokens=3),
        ]
    )
    assert summed == ev.TokenUsage(provider="p", model=None, input_tokens=4, output_tokens=2)


# -- pipe_to_run_log (A33, A37-A40) ---------------------------------------------------------------


def test_a37_completed_run_appends_everything_and_closes_once():
    async def scenario():
        runs, log = backend()
        items = [STARTED, *(text(i) for i in range(3)), FINISHED]
        record = await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1")
        stored = await log.snapshot("r-1")
        return record, stored, log

    record, stored, log = run(scenario())
    assert record.status == "completed" and record.error is None and record.finished_at is not None
    assert record.run_id == "r-1" and record.thread_id == "t-1"
    # A33/R38, in AG-UI order (issue 18): the run's RUN_STARTED, then run.accepted, appended together.
    assert stored[0] == STARTED
    assert isinstance(stored[1], ev.CustomEvent) and stored[1].name == RUN_ACCEPTED_EVENT
    assert stored[1].value == {"runId": "r-1", "threadId": "t-1"}
    assert log.batches[0] == ["RUN_STARTED", "CUSTOM"]
    assert stored[2:] == [*(text(i) for i in range(3)), FINISHED]
    assert log.closes == 1


def test_r38_batches_of_32_cut_early_at_boundary_events():
    async def scenario():
        runs, log = backend()
        call_id = "c-1"
        items = [
            STARTED,
            *(text(i) for i in range(70)),
            ev.ToolCallStartEvent(tool_call_id=call_id, tool_call_name="Read"),
            ev.ToolCallEndEvent(tool_call_id=call_id),
            *(text(i) for i in range(3)),
            FINISHED,
        ]
        await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1")
        return log.batches, await log.snapshot("r-1"), items

    batches, stored, items = run(scenario())
    sizes = [len(b) for b in batches]
    # RUN_STARTED + accepted | 32 | 32 | 6 text + TOOL_CALL_START + TOOL_CALL_END | 3 text + RUN_FINISHED
    assert sizes == [2, DURABILITY_BATCH, DURABILITY_BATCH, 8, 4]
    assert batches[0] == ["RUN_STARTED", "CUSTOM"] and batches[3][-1] == "TOOL_CALL_END"
    assert batches[4][-1] == "RUN_FINISHED"
    assert [stored[0], *stored[2:]] == items


def test_r38_a_pausing_producer_never_holds_events_back():
    async def scenario():
        runs, log = backend()
        release = asyncio.Event()

        async def producer():
            for i in range(3):
                yield text(i)
            await release.wait()  # e.g. the agent runs a long tool
            yield FINISHED

        task = asyncio.create_task(pipe_to_run_log(producer(), runs, log, "r-1", "t-1"))
        seen = []
        async for _, event in log.read("r-1", "-1"):
            seen.append(event)
            if len(seen) == 5:
                break
        delivered_while_paused = list(seen)
        release.set()
        record = await task
        return delivered_while_paused, record

    delivered, record = run(scenario())
    # A stream that does not start with RUN_STARTED gets one: AG-UI clients verify the first event.
    assert types(delivered) == ["RUN_STARTED", "CUSTOM", *["TEXT_MESSAGE_CONTENT"] * 3]
    assert record.status == "completed"


def test_a38_raising_stream_appends_a_run_error_and_fails():
    async def scenario():
        runs, log = backend()

        async def producer():
            yield STARTED
            yield text(0)
            raise RuntimeError("model API returned 500")

        record = await pipe_to_run_log(producer(), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1"), await runs.get("r-1"), log

    record, stored, stored_record, log = run(scenario())
    assert record.status == "failed" and record.error == RunError(message="model API returned 500")
    assert stored_record == record
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
    assert stored[-1].message == "model API returned 500" and stored[-1].run_id == "r-1"
    assert log.closes == 1


def test_a38_run_error_event_keeps_its_code_and_is_not_doubled():
    async def scenario():
        runs, log = backend()
        items = [
            STARTED,
            text(0),
            ev.RunErrorEvent(message="rate limited", code="429", usage=[ev.TokenUsage(input_tokens=9)]),
        ]
        record = await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1")

    record, stored = run(scenario())
    assert record.status == "failed" and record.error == RunError(message="rate limited", code="429")
    assert record.usage == ev.TokenUsage(input_tokens=9)
    assert types(stored).count("RUN_ERROR") == 1 and stored[-1].code == "429"


def test_nothing_follows_the_terminal_event_and_a_raise_after_it_changes_nothing():
    """AG-UI (issue 18): a run's RUN_FINISHED is its end; a client's verifier refuses any event after it."""

    async def scenario():
        runs, log = backend()

        async def producer():
            yield STARTED
            yield FINISHED
            yield text(0)  # not the run's any more: dropped
            yield ev.RunStartedEvent(thread_id="t-1", run_id="r-1")
            raise ConnectionError("agent died in its teardown")

        return await pipe_to_run_log(producer(), runs, log, "r-1", "t-1"), await log.snapshot("r-1")

    record, stored = run(scenario())
    assert record.status == "completed" and types(stored) == ["RUN_STARTED", "CUSTOM", "RUN_FINISHED"]


def test_a_second_run_started_from_the_stream_is_dropped():
    async def scenario():
        runs, log = backend()
        items = [text(0), STARTED, text(1), FINISHED]
        return await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1"), await log.snapshot("r-1")

    record, stored = run(scenario())
    assert record.status == "completed"
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]


def test_usage_from_run_finished_is_recorded():
    async def scenario():
        runs, log = backend()
        done = ev.RunFinishedEvent(thread_id="t-1", run_id="r-1", usage=[ev.TokenUsage(model="x", output_tokens=5)])
        return await pipe_to_run_log(stream_of([STARTED, done]), runs, log, "r-1", "t-1")

    assert run(scenario()).usage == ev.TokenUsage(model="x", output_tokens=5)


def test_a39_aborted_at_entry_never_pulls_the_stream():
    async def scenario():
        runs, log = backend()
        pulled = []

        async def producer():
            pulled.append(1)
            yield STARTED

        controller = AbortController()
        controller.abort("client gone")
        record = await pipe_to_run_log(producer(), runs, log, "r-1", "t-1", controller.signal)
        return record, pulled, await log.snapshot("r-1"), await log.is_closed("r-1")

    record, pulled, stored, closed = run(scenario())
    assert pulled == [] and record.status == "aborted" and record.error.code == "aborted"
    assert "client gone" in record.error.message
    assert types(stored) == ["RUN_ERROR"] and closed


def test_a39_abort_mid_stream_keeps_earlier_events_and_stops_a_waiting_producer():
    async def scenario():
        runs, log = backend()
        controller = AbortController()
        closed_by_pump = asyncio.Event()

        async def producer():
            try:
                yield STARTED
                yield text(0)
                await asyncio.Event().wait()  # a producer that ignores the signal and blocks
                yield text(1)
            finally:
                closed_by_pump.set()

        task = asyncio.create_task(pipe_to_run_log(producer(), runs, log, "r-1", "t-1", controller.signal))
        await until(lambda: has_events(log, "r-1", 3), "the events before the producer blocks")
        controller.abort("deadline")
        record = await task
        return record, await log.snapshot("r-1"), closed_by_pump.is_set()

    record, stored, producer_closed = run(scenario())
    assert record.status == "aborted"
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
    assert producer_closed


def test_a39_signal_aware_producer_ending_on_abort_is_aborted_not_completed():
    async def scenario():
        runs, log = backend()
        controller = AbortController()

        async def producer(signal: AbortSignal):
            yield STARTED
            controller.abort("stop")
            if signal.aborted:
                return  # ends "normally" right after the abort
            yield text(0)

        return await pipe_to_run_log(producer(controller.signal), runs, log, "r-1", "t-1", controller.signal)

    assert run(scenario()).status == "aborted"


def test_r39_cancel_reason_is_recorded_as_cancelled():
    async def scenario():
        runs, log = backend()
        controller = AbortController()

        async def producer():
            yield STARTED
            controller.abort(RUN_CANCEL_REASON)
            yield text(0)

        record = await pipe_to_run_log(producer(), runs, log, "r-1", "t-1", controller.signal)
        return record, await log.snapshot("r-1"), await log.is_closed("r-1")

    record, stored, closed = run(scenario())
    assert record.status == "aborted" and record.error == RunError(message="the run was cancelled", code="cancelled")
    assert stored[-1].type == "RUN_ERROR" and stored[-1].code == "cancelled" and closed


def test_a40_failing_update_returns_a_local_record_and_still_closes():
    async def scenario():
        inner, log = backend()
        runs = FlakyRuns(inner, "update")
        await inner.create_or_resume("r-1", "t-1")
        await inner.update("r-1", RunPatch(sandbox_key="sk"))
        record = await pipe_to_run_log(stream_of([STARTED, FINISHED]), runs, log, "r-1", "t-1")
        return record, log.closes, await inner.get("r-1")

    record, closes, stored = run(scenario())
    assert record.status == "completed" and record.sandbox_key is None  # rebuilt locally (R49)
    assert closes == 1 and stored.status == "running"


def test_a40_failing_create_close_and_get_never_raise():
    async def scenario():
        inner, log = backend()
        log.fail_close = True
        runs = FlakyRuns(inner, "create_or_resume", "get")
        record = await pipe_to_run_log(stream_of([STARTED, FINISHED]), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1"), log.closes

    record, stored, closes = run(scenario())
    # No record could be created, so the update finds none: the local record is returned.
    assert record.status == "completed" and record.run_id == "r-1"
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "RUN_FINISHED"] and closes == 1


def test_a40_failing_append_fails_the_run_without_duplicates():
    async def scenario():
        runs, log = backend()
        log.fail_appends_from = 1  # RUN_STARTED and accepted land, then every append fails
        pulled = []

        async def producer():
            yield STARTED
            for i in range(100):
                pulled.append(i)
                yield text(i)

        record = await pipe_to_run_log(producer(), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1"), log, pulled, await runs.get("r-1")

    record, stored, log, pulled, stored_record = run(scenario())
    assert record.status == "failed" and stored_record.status == "failed"
    assert record.error.code == "log-error" and "disk full (append #1)" in record.error.message
    # R48: the recovery RUN_ERROR failed too; its error is added to the message, the original stays first.
    assert record.error.message.index("append #1") < record.error.message.index("; append: disk full (append #2)")
    assert types(stored) == ["RUN_STARTED", "CUSTOM"]  # nothing duplicated, nothing after the failure
    assert log.calls == 3 and log.closes == 1
    assert len(pulled) <= DURABILITY_BATCH + 1  # the stream stopped being pulled


def test_a40_failing_append_then_recovery_append_lands():
    async def scenario():
        runs, log = backend()
        fail_once = {"left": 1}
        original = log.inner.append

        async def flaky(run_id, events, *, epoch=None):
            if len(events) > 2 and fail_once["left"]:  # the announcement (2 events) lands
                fail_once["left"] -= 1
                raise OSError("transient")
            return await original(run_id, events, epoch=epoch)

        log.inner.append = flaky
        items = [STARTED, *(text(i) for i in range(40))]
        record = await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1")

    record, stored = run(scenario())
    assert record.status == "failed" and record.error.message == "could not append to the event log: transient"
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]
    assert stored[-1].code == "log-error"


def test_append_to_a_closed_log_fails_the_run_without_recovery_append():
    async def scenario():
        runs, log = backend()
        await log.close("r-1")
        record = await pipe_to_run_log(stream_of([STARTED, FINISHED]), runs, log, "r-1", "t-1")
        return record, await log.snapshot("r-1"), log.calls

    record, stored, calls = run(scenario())
    assert record.status == "failed" and "closed" in record.error.message
    assert stored == [] and calls == 1


def test_a40_raising_logger_is_swallowed():
    class Exploding(logging.Logger):
        def log(self, *args, **kwargs):
            raise RuntimeError("logger broke")

    async def scenario():
        inner, log = backend()
        runs = FlakyRuns(inner, "update", "create_or_resume")

        async def producer():
            yield STARTED
            raise ValueError("boom")

        return await pipe_to_run_log(producer(), runs, log, "r-1", "t-1", logger=Exploding("x"))

    record = run(scenario())
    assert record.status == "failed" and record.error.message == "boom"


def test_d3_superseded_driver_stops_at_once_and_leaves_the_run_to_its_successor():
    async def scenario():
        runs, log = backend()
        await runs.create_or_resume("r-1", "t-1")
        await runs.update("r-1", RunPatch(driver_epoch=1))
        step = asyncio.Event()

        async def producer():
            yield STARTED
            await step.wait()
            yield text(0)
            yield FINISHED

        task = asyncio.create_task(pipe_to_run_log(producer(), runs, log, "r-1", "t-1", epoch=1))
        await until(lambda: has_events(log, "r-1", 2), "RUN_STARTED to land")
        await runs.update("r-1", RunPatch(driver_epoch=2))  # a takeover claimed the run
        step.set()
        record = await task
        return record, await log.snapshot("r-1"), await log.is_closed("r-1"), log.closes, await runs.get("r-1")

    record, stored, closed, closes, stored_record = run(scenario())
    assert types(stored) == ["RUN_STARTED", "CUSTOM"]  # no text, no RUN_FINISHED, no RUN_ERROR
    assert not closed and closes == 0  # the successor owns the log and will close it
    assert stored_record.status == "running" and stored_record.driver_epoch == 2
    assert record == stored_record


def test_d3_fenced_terminal_status_is_suppressed():
    async def scenario():
        runs, log = backend()
        await runs.create_or_resume("r-1", "t-1")
        await runs.update("r-1", RunPatch(driver_epoch=1))
        original = log.inner.append

        async def bump_after(run_id, events, *, epoch=None):
            offsets = await original(run_id, events, epoch=epoch)
            if events[-1].type == "RUN_FINISHED":
                await runs.update("r-1", RunPatch(driver_epoch=2))  # superseded right after the last batch
            return offsets

        log.inner.append = bump_after
        record = await pipe_to_run_log(stream_of([STARTED, FINISHED]), runs, log, "r-1", "t-1", epoch=1)
        return record, await runs.get("r-1"), log.closes

    record, stored_record, closes = run(scenario())
    assert stored_record.status == "running" and stored_record.finished_at is None
    assert record == stored_record and closes == 0


def test_cancelling_the_pipe_task_finishes_the_run_aborted_then_reraises():
    async def scenario():
        runs, log = backend()

        async def producer():
            yield STARTED
            await asyncio.Event().wait()
            yield FINISHED

        task = asyncio.create_task(pipe_to_run_log(producer(), runs, log, "r-1", "t-1"))
        await until(lambda: has_events(log, "r-1", 2), "RUN_STARTED to land")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        return await runs.get("r-1"), await log.snapshot("r-1"), await log.is_closed("r-1")

    record, stored, closed = run(scenario())
    assert record.status == "aborted" and "cancelled" in record.error.message
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"] and closed


def test_a_stream_yielding_a_non_event_fails_the_run_clearly():
    async def scenario():
        runs, log = memory_run_backend()
        items = [STARTED, {"type": "TEXT_MESSAGE_CONTENT", "delta": "x"}, FINISHED]
        return await pipe_to_run_log(stream_of(items), runs, log, "r-1", "t-1"), await log.snapshot("r-1")

    record, stored = run(scenario())
    assert record.status == "failed" and record.error.code == "invalid-event" and "dict" in record.error.message
    assert types(stored) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]


def test_bad_run_id_is_recorded_not_raised():
    async def scenario():
        runs, log = memory_run_backend()
        return await pipe_to_run_log(stream_of([STARTED]), runs, log, "bad-\ud800", "t-1")

    record = run(scenario())
    assert record.status == "failed" and "lone surrogate" in record.error.message


# -- RunController (A41) --------------------------------------------------------------------------


def test_a41_factory_called_once_runs_isolated_and_each_closed():
    async def scenario():
        runs, log = backend()
        controller = RunController(runs, log)
        calls: list[str] = []

        def factory(run_id: str):
            calls.append(run_id)
            return stream_of([ev.RunStartedEvent(thread_id="t", run_id=run_id), text(0, run_id), FINISHED])

        handles = [controller.start(factory, f"run-{i}", "t") for i in range(8)]
        assert all(h.run_id == f"run-{i}" for i, h in enumerate(handles))
        await controller.drain()
        records = [h.done.result() for h in handles]
        logs = [await log.snapshot(f"run-{i}") for i in range(8)]
        closed = [await log.is_closed(f"run-{i}") for i in range(8)]
        return calls, records, logs, closed, log.closes, controller.active_runs

    calls, records, logs, closed, closes, active = run(scenario())
    assert sorted(calls) == [f"run-{i}" for i in range(8)]
    assert all(r.status == "completed" for r in records)
    for i, stored in enumerate(logs):
        assert stored[0] == ev.RunStartedEvent(thread_id="t", run_id=f"run-{i}")
        assert stored[2] == text(0, f"run-{i}")  # no run's events in another run's log
    assert all(closed) and closes == 8 and active == []


def test_a41_attach_status_cancel_and_duplicate_start():
    async def scenario():
        runs, log = memory_run_backend()
        controller = RunController(runs, log)
        gate = asyncio.Event()

        async def producer():
            yield STARTED
            await gate.wait()
            yield FINISHED

        handle = controller.start(producer(), "r-1", "t-1")
        with pytest.raises(RunAlreadyDrivenError):
            controller.start(producer(), "r-1", "t-1")
        attached = []
        async for _, event in controller.attach("r-1", "-1"):
            attached.append(event)
            if event.type == "RUN_STARTED":
                break
        running = await controller.status("r-1")
        assert controller.cancel("r-1") and not controller.cancel("nope")
        record = await handle.done
        await controller.drain()
        return attached, running, record, controller.active_runs

    attached, running, record, active = run(scenario())
    assert types(attached) == ["RUN_STARTED"]
    assert running.status == "running"
    assert record.status == "aborted" and record.error.code == "cancelled"
    assert active == []


def test_a41_raising_factory_fails_its_run_only_and_drain_never_raises():
    async def scenario():
        runs, log = memory_run_backend()
        controller = RunController(runs, log)

        def bad(run_id: str):
            raise LookupError(f"no agent for {run_id}")

        bad_handle = controller.start(bad, "bad", "t")
        good = controller.start(stream_of([STARTED, FINISHED]), "good", "t")
        await controller.drain()
        await controller.drain()  # nothing left: returns at once
        return bad_handle.done.result(), good.done.result()

    bad, good = run(scenario())
    assert bad.status == "failed" and bad.error.message == "no agent for bad"
    assert good.status == "completed"


def test_a41_many_concurrent_runs_on_one_controller():
    async def scenario():
        runs, log = memory_run_backend()
        controller = RunController(runs, log)

        async def producer(run_id: str):
            yield ev.RunStartedEvent(thread_id="t", run_id=run_id)
            for i in range(50):
                if i % 10 == 0:
                    await asyncio.sleep(0)
                yield text(i, run_id)
            yield ev.RunFinishedEvent(thread_id="t", run_id=run_id)

        for i in range(32):
            controller.start(producer(f"run-{i}"), f"run-{i}", "t")
        await controller.drain()
        return [await log.snapshot(f"run-{i}") for i in range(32)]

    for i, stored in enumerate(run(scenario())):
        assert len(stored) == 53
        assert [e.delta for e in stored if e.type == "TEXT_MESSAGE_CONTENT"] == [str(n) for n in range(50)]
        assert {e.message_id for e in stored if e.type == "TEXT_MESSAGE_CONTENT"} == {f"run-{i}"}
