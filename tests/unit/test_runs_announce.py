"""run.accepted announces a fresh run once; a successor piping into the same log does not repeat it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from boxwright.events import CustomEvent, Event, RunFinishedEvent, TextMessageContentEvent
from boxwright.runs import RUN_ACCEPTED_EVENT, RunPatch, pipe_to_run_log
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
