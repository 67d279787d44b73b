"""The quiet window counted from a tail read earlier (``log_quiet_since``): only what is left of it is waited.

A successor reads the tail before it waits out a dead driver's lease, so the lease wait and the
quiet window overlap (bench/takeover.py measures the end to end figure). Still one whole window
of no appends, or no go: a log that moved since gets a full window from its new tail.
"""

from __future__ import annotations

import asyncio
import time

from boxwright import events as ev
from boxwright.abort import AbortController
from boxwright.runs import format_offset
from boxwright.stores.memory import memory_run_backend
from boxwright.takeover import await_log_quiescence, log_quiet_since

WINDOW_MS = 400.0


def _text(i: int) -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id="m", delta=str(i))


def test_a_log_quiet_since_the_read_waits_only_for_the_rest_of_the_window() -> None:
    async def main() -> None:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        await log.append("r", [_text(1)])
        since = await log_quiet_since(log, "r")
        assert since is not None and since[0] == format_offset("r", 1)
        await asyncio.sleep(WINDOW_MS / 1000)  # the lease wait, say: the window ran meanwhile
        started = time.monotonic()
        assert await await_log_quiescence(log, "r", WINDOW_MS, since=since) == format_offset("r", 1)
        assert time.monotonic() - started < WINDOW_MS / 1000 / 2
        started = time.monotonic()
        await await_log_quiescence(log, "r", WINDOW_MS)  # without it: the whole window
        assert time.monotonic() - started >= WINDOW_MS / 1000

    asyncio.run(main())


def test_an_append_after_the_read_costs_a_whole_window_from_the_new_tail() -> None:
    async def main() -> None:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        since = await log_quiet_since(log, "r")
        await asyncio.sleep(WINDOW_MS / 1000)
        await log.append("r", [_text(1)])  # a driver still alive when the read was taken
        started = time.monotonic()
        assert await await_log_quiescence(log, "r", WINDOW_MS, since=since) == format_offset("r", 1)
        assert time.monotonic() - started >= WINDOW_MS / 1000

    asyncio.run(main())


def test_a_stop_ends_the_quiet_window_with_the_tail_as_it_is() -> None:
    """A run stopped while its successor waits (a cancel, a watchdog failure) ends the window at once: a
    10-minute window returns within the bound below, and one aborted before it began does not wait at all."""

    async def main() -> None:
        runs, log = memory_run_backend()
        await runs.create_or_resume("r", "t")
        await log.append("r", [_text(1)])
        stop = AbortController()
        asyncio.get_running_loop().call_later(0.05, stop.abort, "cancelled")
        waited = await_log_quiescence(log, "r", 600_000, signal=stop.signal)
        assert await asyncio.wait_for(waited, 30) == format_offset("r", 1)
        await log.append("r", [_text(2)])
        waited = await_log_quiescence(log, "r", 600_000, signal=stop.signal)
        assert await asyncio.wait_for(waited, 30) == format_offset("r", 2)

    asyncio.run(main())
