"""Every task has an owner: run_agent, pipe_to_run_log, the journal reader and the tool-exec endpoint.

Warnings are errors here (an unretrieved task exception, a never-awaited coroutine or an
unraisable exception in a finalizer fails the test), and the loops run in asyncio debug mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import define_sandbox
from boxwright.events import (
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    encode_event,
)
from boxwright.harnesses.command import command_harness
from boxwright.providers import local_process_sandbox
from boxwright.runs import pipe_to_run_log
from boxwright.stores.memory import MemoryEventLog, MemoryInstanceStore, MemoryRunStore
from boxwright.tool_bridge import ToolExecRun, serve_asgi, tool, tool_exec_app, tool_exec_path

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(autouse=True)
def _collect_earlier_garbage() -> None:
    """Collects what earlier tests of this worker left before a test here starts.

    An unclosed socket of another file's test, collected by chance during one of these, would raise
    here (warnings are errors) and be blamed on a test that opened no socket at all.
    """
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


Ending = Literal["normal", "break", "cancel", "error"]


def _script(lines: int, gap: float, *, exit_code: int = 0) -> str:
    deltas = [encode_event(TextMessageContentEvent(message_id="m", delta=f"line {i}\n")).decode() for i in range(lines)]
    body = "; ".join(f"printf '%s\\n' '{d}'; sleep {gap}" for d in deltas)
    start = '{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}'
    end = '{"type":"TEXT_MESSAGE_END","messageId":"m"}'
    tail = f"; echo 'it went wrong' >&2; exit {exit_code}" if exit_code else ""
    return f"printf '%s\\n' '{start}'; {body}; printf '%s\\n' '{end}'{tail}"


def _others() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


def _describe(tasks: set[asyncio.Task[Any]]) -> list[str]:
    return sorted(f"{task.get_name()}: {task.get_coro()!r}" for task in tasks)


@contextlib.contextmanager
def counting_tasks() -> Any:
    """Counts the tasks the loop creates inside the block (a task factory that only counts)."""
    loop = asyncio.get_running_loop()
    created: list[str] = []
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", repr(coro)))
        if previous is not None:
            made: asyncio.Task[Any] = previous(loop, coro, **kwargs)  # type: ignore[assignment]
            return made
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(previous)


class KeepSandbox:
    """A run record's durability that always detaches: the sandbox (and its journal) outlive the drive."""

    async def cancel_requested(self) -> bool:
        return False

    async def stamp_detached(self, sandbox_key: str) -> None:
        pass


@pytest.mark.parametrize("mode", ["piped", "journaled", "durable"])
@pytest.mark.parametrize("ending", ["normal", "break", "cancel", "error"])
def test_no_task_outlives_run_agent(ending: Ending, mode: str, tmp_path: Path) -> None:
    sandbox = define_sandbox("owned", local_process_sandbox(base_dir=tmp_path / "sb"))
    harness = command_harness(_script(8, 0.1, exit_code=3 if ending == "error" else 0))

    async def main() -> None:
        before = _others()
        events = run_agent(
            sandbox,
            harness,
            "go",
            thread_id="t-owned",
            run_id=f"owned-{uuid.uuid4().hex[:8]}",
            store=MemoryInstanceStore(),
            journal=JournalOptions() if mode != "piped" else None,
            # Durable: a dropped consumer detaches, so the journal goes on growing after the close.
            durability=KeepSandbox() if mode == "durable" else None,
        )
        seen: list[Event] = []
        first_text = asyncio.Event()

        async def consume() -> None:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    seen.append(event)
                    if isinstance(event, TextMessageContentEvent):
                        first_text.set()
                        if ending == "break":
                            break

        if ending == "cancel":
            consumer = asyncio.get_running_loop().create_task(consume())
            await asyncio.wait_for(first_text.wait(), 30)
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
        else:
            await asyncio.wait_for(consume(), 60)
        if ending == "normal":
            assert isinstance(seen[-1], RunFinishedEvent)
        elif ending == "error":
            assert isinstance(seen[-1], RunErrorEvent)
        else:
            assert first_text.is_set()
        # Nothing run_agent started is left once its close returned: not a pump, not the journal reader.
        leftover = _others() - before
        if mode == "durable" and ending in ("break", "cancel"):
            # Detached: the agent goes on in its kept sandbox, and only its provider still tracks it
            # (its exit and pipes), until it exits by itself.
            assert all(_is_process_tracking(task) for task in leftover), _describe(leftover)
            _done, pending = await asyncio.wait(leftover, timeout=30) if leftover else (set(), set())
            assert not pending, _describe(pending)
        else:
            assert not leftover, _describe(leftover)

    asyncio.run(main(), debug=True)


def _is_process_tracking(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and code.co_filename.endswith("providers/_posix.py")


_step: contextvars.ContextVar[int] = contextvars.ContextVar("step", default=-1)


def test_pipe_to_run_log_runs_every_step_of_the_producer_in_one_task() -> None:
    """A ContextVar set before a yield is there after it, and a scope held across yields stays in its task."""
    steps = 60

    async def main() -> tuple[set[asyncio.Task[Any] | None], list[int], list[str], str]:
        tasks: set[asyncio.Task[Any] | None] = set()
        seen_steps: list[int] = []
        closed_in: list[asyncio.Task[Any] | None] = []

        async def producer() -> AsyncIterator[Event]:
            try:
                # A deadline held across every yield: it must belong to the task that resumes us.
                async with asyncio.timeout(60):
                    yield RunStartedEvent(thread_id="t", run_id="r")
                    for i in range(steps):
                        tasks.add(asyncio.current_task())
                        seen_steps.append(_step.get())
                        _step.set(i)
                        await asyncio.sleep(0.001 if i % 10 else 0.02)
                        yield TextMessageContentEvent(message_id="m", delta=f"{i} ")
                    yield RunFinishedEvent(thread_id="t", run_id="r")
            finally:
                closed_in.append(asyncio.current_task())

        with counting_tasks() as created:
            record = await pipe_to_run_log(producer(), MemoryRunStore(), MemoryEventLog(), "r", "t")
        tasks.update(closed_in)
        return tasks, seen_steps, created, record.status

    tasks, seen_steps, created, status = asyncio.run(main(), debug=True)
    assert status == "completed"
    assert len(tasks) == 1  # every step and the close: one task
    assert seen_steps == [-1, *range(steps - 1)]  # each step sees what the step before it set
    assert len(created) <= 2, created  # the puller (and nothing per event)


def test_no_task_per_event_in_a_journaled_run(tmp_path: Path) -> None:
    """The tasks a journaled run creates do not grow with its events (the follow reader pulled a task per chunk)."""
    sandbox = define_sandbox("counted", local_process_sandbox(base_dir=tmp_path / "sb"))

    async def count(lines: int) -> int:
        harness = command_harness(_script(lines, 0.03))
        with counting_tasks() as created:
            stream = run_agent(
                sandbox,
                harness,
                "go",
                thread_id="t-counted",
                run_id=f"counted-{uuid.uuid4().hex[:8]}",
                store=MemoryInstanceStore(),
                journal=JournalOptions(),
            )
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                events = [e async for e in stream]
        assert isinstance(events[-1], RunFinishedEvent)
        assert sum(isinstance(e, TextMessageContentEvent) for e in events) == lines
        return len(created)

    async def main() -> tuple[int, int]:
        return await count(5), await count(60)

    few, many = asyncio.run(main(), debug=True)
    assert many - few <= 3, (few, many)


def test_a_container_hangup_on_tool_exec_logs_no_error_and_sends_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The caller hangs up mid-call (a real uvicorn, a client that drops the connection): the host tool is
    cancelled, nothing is sent, nothing is logged as an error."""
    caplog.set_level(logging.DEBUG)
    started = asyncio.Event()
    cancelled = asyncio.Event()
    sent: list[str] = []

    @tool
    async def slow() -> str:
        """Takes its time."""
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def main() -> None:
        token = secrets.token_hex(24)
        inner = tool_exec_app({"r1": ToolExecRun(tools=[slow], token=token)})

        async def observed(scope: Any, receive: Callable[[], Awaitable[Any]], send: Any) -> None:
            async def recording_send(message: Any) -> None:
                sent.append(message["type"])
                await send(message)

            await inner(scope, receive, recording_send)

        async with await serve_asgi(observed) as server:
            host, port = server.url.removeprefix("http://").split(":")
            for _ in range(3):  # each time: the same quiet end
                started.clear()
                cancelled.clear()
                body = msgspec.json.encode({"name": "slow", "args": {}})
                request = (
                    f"POST {tool_exec_path('r1')} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode() + body
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(request)
                await writer.drain()
                await asyncio.wait_for(started.wait(), 10)
                writer.close()  # the container gives up on the call
                await writer.wait_closed()
                await asyncio.wait_for(cancelled.wait(), 10)
                await asyncio.sleep(0.2)  # time for an answer or a traceback, were there one
                assert await reader.read() == b""

    asyncio.run(main(), debug=True)
    assert sent == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
