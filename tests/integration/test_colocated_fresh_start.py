"""A co-located takeover with nothing to attach to starts the run from its stored input, once (issue 14).

A successor host (``run_agent(mode="colocated")`` with a journal attach, as ``take_over_if_orphaned``
drives it) meets the real runner app (tests/support/chaos_runner.py: a command harness in place of
claude, no Docker) in the states a predecessor SIGKILLed at the start leaves: a runner that does not
know the run (killed between its first recorded event and its ``/run``), or no runner at all (killed
right after the trigger). With nothing the runner produced in the log it starts the run through
``/run`` from the stored input; with a runner event recorded it fails the run, naming what is lost;
a runner that has the run is attached to, never started again. The last case goes through
``SandboxService.take_over_if_orphaned`` itself, from the record a replica killed at its trigger leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
)
from boxwright.harnesses.base import Message
from boxwright.harnesses.claude_code import claude_code
from boxwright.middleware.service import RunSpec, StartRunRequest
from boxwright.run_input import encode_run_input
from boxwright.runs import RUN_ACCEPTED_EVENT, RunPatch, RunRecord, create_run
from boxwright.stores.memory import MemoryInstanceStore
from tests.support.chaos_runner import RunnerBox, RunnerBoxes
from tests.support.sqlite_service import sqlite_service

SECRET = "fresh-start-runner-secret-" + "s" * 16
RUN, THREAD = "r-fresh", "t-fresh"
STORED_INPUT = [Message(role="user", content="the stored question")]
# What a predecessor that died before the runner's first line recorded: the host's own two events.
HOSTS_OWN: list[Event] = [
    RunStartedEvent(thread_id=THREAD, run_id=RUN),
    CustomEvent(name=RUN_ACCEPTED_EVENT, value={"runId": RUN, "threadId": THREAD}),
]


def _agent(tmp: Path) -> str:
    """A command agent that says what prompt it got and counts its starts in ``tmp/starts``."""
    return f'read -r line; echo "agent got: $line"; echo started >> {tmp / "starts"}'


def _starts(tmp: Path) -> int:
    path = tmp / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def _take_over(boxes: RunnerBoxes, logged: Sequence[Event], tmp: Path) -> list[Event]:
    async def stored() -> Sequence[Event]:
        return logged

    sandbox = define_sandbox("runner-box", boxes)
    workspace = tmp / "ws"
    workspace.mkdir(exist_ok=True)
    try:
        return [
            event
            async for event in run_agent(
                sandbox,
                claude_code("m"),
                "(resumed)",  # what a successor passes: the stored input is ``fresh``
                thread_id=THREAD,
                run_id=RUN,
                store=MemoryInstanceStore(),
                mode="colocated",
                journal=JournalOptions(attach=True, fresh=STORED_INPUT, logged=stored),
                runner_secret=SECRET,
                host_env={},
                cwd=str(workspace),
            )
        ]
    finally:
        await boxes.close()


def _text(events: list[Event]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))


def _errors(events: list[Event]) -> list[str]:
    return [e.message for e in events if isinstance(e, RunErrorEvent)]


def test_a_runner_that_does_not_know_the_run_gets_it_from_the_stored_input(tmp_path: Path) -> None:
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=True)
    events = asyncio.run(_take_over(boxes, HOSTS_OWN, tmp_path))
    assert _errors(events) == [], events
    assert "agent got: the stored question" in _text(events), events
    assert events[-1].type == "RUN_FINISHED" and _starts(tmp_path) == 1
    # The runner already answered: none was launched beside it.
    (box,) = boxes.boxes
    assert box.launches == []


def test_a_box_without_a_runner_gets_one_and_the_run_from_the_stored_input(tmp_path: Path) -> None:
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=False)
    events = asyncio.run(_take_over(boxes, HOSTS_OWN[:1], tmp_path))
    assert _errors(events) == [], events
    assert "agent got: the stored question" in _text(events), events
    assert events[-1].type == "RUN_FINISHED" and _starts(tmp_path) == 1
    (box,) = boxes.boxes
    assert len(box.launches) == 1, box.launches


def test_a_run_whose_runner_events_are_recorded_is_not_started_again(tmp_path: Path) -> None:
    logged = [*HOSTS_OWN, TextMessageContentEvent(message_id="m", delta="the runner said this")]
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=True)
    events = asyncio.run(_take_over(boxes, logged, tmp_path))
    (error,) = _errors(events)
    assert "driver lost; runner cannot re-attach: the runner does not know the run" in error, error
    assert "TEXT_MESSAGE_CONTENT" in error and "cannot be resumed" in error, error
    assert _starts(tmp_path) == 0 and "agent got" not in _text(events)


def test_a_runner_that_has_the_run_is_attached_to_and_starts_nothing(tmp_path: Path) -> None:
    """The predecessor's ``/run`` landed (and its agent ran): the successor reads that run, it starts no second."""
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=True)

    async def scenario() -> list[Event]:
        original = boxes.create

        async def create_and_post(input: object = None) -> object:
            box: RunnerBox = await original(input)  # type: ignore[arg-type,assignment]
            body = {
                "runId": RUN,
                "threadId": THREAD,
                "messages": [{"role": "user", "content": "the predecessor's question"}],
                "harness": "claude-code",
                "model": "m",
                "workspace": {"path": str(tmp_path / "ws"), "secrets": []},
                "toolDescriptors": [],
                "toolExecUrl": "http://127.0.0.1:9/tool-exec/r-fresh",
                "toolExecToken": "predecessor",
            }
            (tmp_path / "ws").mkdir(exist_ok=True)
            async with httpx.AsyncClient(timeout=30) as http:
                headers = {"Authorization": f"Bearer {box.token}"}
                async with http.stream("POST", f"{box.url}/run", json=body, headers=headers) as response:
                    assert response.status_code == 200
                    async for _ in response.aiter_lines():
                        pass  # the predecessor read its run to the end before it died
            return box

        boxes.create = create_and_post  # type: ignore[method-assign,assignment]
        return await _take_over(boxes, HOSTS_OWN, tmp_path)

    events = asyncio.run(scenario())
    assert _errors(events) == [], events
    assert "agent got: the predecessor's question" in _text(events), events
    assert _starts(tmp_path) == 1


async def _service_takes_over(
    tmp: Path, boxes: RunnerBoxes, logged: Sequence[Event]
) -> tuple[RunRecord | None, list[Event]]:
    """What a predecessor SIGKILLed after its claim leaves (a record at epoch 1 with its stored input,
    ``logged`` in the log), adopted through ``SandboxService.take_over_if_orphaned``: its final record and log."""
    sandbox = define_sandbox("runner-box", boxes)

    def factory(_start: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=claude_code("m"), mode="colocated")

    service = sqlite_service(tmp / "service.db", factory, lease_ttl_ms=1500, runner_secret=SECRET)
    runs, log = service.runs, service.log
    try:
        await create_run(runs, RUN, THREAD)
        stored_input = encode_run_input(STORED_INPUT, limit=1 << 20)
        await runs.update(RUN, RunPatch(input_messages=stored_input, driver_epoch=1))
        if logged:
            await log.append(RUN, list(logged), epoch=1)
        assert await service.take_over_if_orphaned(RUN)
        record = await asyncio.wait_for(service.wait_run(RUN), 60)
        return record, await log.snapshot(RUN)
    finally:
        await service.aclose()
        await boxes.close()


def test_a_service_taking_over_a_colocated_run_killed_at_its_trigger_starts_it_from_the_stored_input(
    tmp_path: Path,
) -> None:
    """Through ``SandboxService.take_over_if_orphaned``: what a replica SIGKILLed right after its 202 leaves (a
    record at epoch 1 with its stored input, no event, no box) is adopted at epoch 2 and completed, the agent
    started once on the stored input."""
    (tmp_path / "ws").mkdir()
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=False, workspace=tmp_path / "ws")
    record, events = asyncio.run(_service_takes_over(tmp_path, boxes, []))
    assert record is not None and record.status == "completed" and record.driver_epoch == 2, record
    assert "agent got: the stored question" in _text(events), events
    assert [e.type for e in events].count("RUN_STARTED") == 1 and events[-1].type == "RUN_FINISHED", events
    assert _starts(tmp_path) == 1 and len(boxes.boxes[0].launches) == 1


@pytest.mark.parametrize(
    "end",
    [
        RunFinishedEvent(thread_id=THREAD, run_id=RUN),
        RunErrorEvent(message="agent exited with code 3", code="agent_exit"),
    ],
    ids=["finished", "failed"],
)
def test_a_run_whose_end_is_logged_but_whose_runner_is_gone_keeps_that_end(tmp_path: Path, end: Event) -> None:
    """The predecessor read the run's end, stored it and shut the runner down, then died before its record:
    the successor finds no runner, starts none and no agent, appends nothing, and records the logged end."""
    (tmp_path / "ws").mkdir()
    logged = [*HOSTS_OWN, TextMessageContentEvent(message_id="m", delta="the runner said this"), end]
    boxes = RunnerBoxes(tmp_path, SECRET, _agent(tmp_path), runner_up=False, workspace=tmp_path / "ws")
    record, events = asyncio.run(_service_takes_over(tmp_path, boxes, logged))
    assert [e.type for e in events] == [e.type for e in logged], events
    assert record is not None and record.driver_epoch == 2, record
    if isinstance(end, RunErrorEvent):
        assert record.status == "failed" and record.error is not None and record.error.message == end.message
    else:
        assert record.status == "completed" and record.error is None, record
    assert _starts(tmp_path) == 0 and all(box.launches == [] for box in boxes.boxes)
