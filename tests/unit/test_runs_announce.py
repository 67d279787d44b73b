"""run.accepted announces a fresh run once; a successor piping into the same log does not repeat it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
)
from boxwright.runs import RUN_ACCEPTED_EVENT, RunPatch, RunRecord, pipe_to_run_log
from boxwright.stores.memory import memory_run_backend


async def _events(*events: Event) -> AsyncIterator[Event]:
    for event in events:
        yield event


def test_a_successor_does_not_announce_the_run_again() -> None:
    async def main() -> list[Event]:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        await runs.update("r", RunPatch(driver_epoch=1))
        first = asyncio.ensure_future(
            pipe_to_run_log(_events(TextMessageContentEvent(message_id="m", delta="a")), runs, log, "r", "t", epoch=1)
        )
        # The first driver "dies" after its events landed: the successor continues the same log.
        await first
        return await log.snapshot("r")

    stored = asyncio.run(main())
    announcements = [e for e in stored if isinstance(e, CustomEvent) and e.name == RUN_ACCEPTED_EVENT]
    assert len(announcements) == 1


def test_pipe_appends_after_existing_entries_without_a_second_announcement() -> None:
    async def main() -> list[Event]:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        await log.append(
            "r", [CustomEvent(name=RUN_ACCEPTED_EVENT, value={}), TextMessageContentEvent(message_id="m", delta="a")]
        )
        await pipe_to_run_log(_events(RunFinishedEvent(thread_id="t", run_id="r")), runs, log, "r", "t")
        return await log.snapshot("r")

    stored = asyncio.run(main())
    assert [e.type for e in stored] == ["CUSTOM", "TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]


async def _raising_after(*events: Event) -> AsyncIterator[Event]:
    for event in events:
        yield event
    raise RuntimeError("the replay diverged")


def _pipe_after_end(last: Event, stream: AsyncIterator[Event]) -> tuple[list[Event], RunRecord]:
    """A successor pipes ``stream`` into a log whose dead driver had stored ``last``, but not the record."""

    async def main() -> tuple[list[Event], RunRecord]:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        await runs.update("r", RunPatch(driver_epoch=2))
        stored = [RunStartedEvent(thread_id="t", run_id="r"), TextMessageContentEvent(message_id="m", delta="a"), last]
        await log.append("r", stored)
        record = await pipe_to_run_log(stream, runs, log, "r", "t", epoch=2)
        return await log.snapshot("r"), record

    return asyncio.run(main())


def test_a_successor_of_a_log_that_ended_in_run_error_records_that_failure() -> None:
    error = RunErrorEvent(message="agent exited with code 3", code="agent_exit")
    for stream in (_events(), _events(TextMessageContentEvent(message_id="m", delta="late")), _raising_after()):
        stored, record = _pipe_after_end(error, stream)
        assert [e.type for e in stored] == ["RUN_STARTED", "TEXT_MESSAGE_CONTENT", "RUN_ERROR"], "nothing appended"
        assert record.status == "failed", record
        assert record.error is not None and (record.error.message, record.error.code) == (error.message, error.code)


def test_a_successor_of_a_log_that_ended_cancelled_or_finished_keeps_that_end() -> None:
    cancelled = RunErrorEvent(message="the run was cancelled", code="cancelled")
    stored, record = _pipe_after_end(cancelled, _raising_after())
    assert record.status == "aborted" and stored[-1] == cancelled, record
    finished = RunFinishedEvent(thread_id="t", run_id="r")
    stored, record = _pipe_after_end(finished, _raising_after())
    assert record.status == "completed" and record.error is None and stored[-1] == finished, record
    assert [e.type for e in stored].count("RUN_ERROR") == 0, "no closing error after a stored end"
