"""Replaying a CLI's recorded output through a harness translator, and checking what comes out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ag_ui.core as agui
from pydantic import TypeAdapter

from boxwright.events import (
    Event,
    RunFinishedEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    create_run_scoped_id_gen,
    encode_event,
)
from boxwright.harnesses.base import HarnessContext
from boxwright.sandbox import Capabilities

OFFICIAL_EVENT: TypeAdapter[Any] = TypeAdapter(agui.Event)
TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
TOOL_QUAD = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
TEXT3 = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
REASONING5 = [
    "REASONING_START",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END",
    "REASONING_END",
]


def caps(writable_stdin: bool = True) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=writable_stdin,
        killable_processes=True,
        snapshots=False,
        network_policy=False,
        durable_filesystem=True,
        fork=False,
    )


def make_ctx(**overrides: Any) -> HarnessContext:
    fields: dict[str, Any] = {
        "run_id": "r7",
        "thread_id": "t1",
        "prompt": "hello",
        "system_prompt": None,
        "capabilities": caps(),
        "provider": "local-process",
        "file_suffix": "r7",
    }
    fields.update(overrides)
    fields.setdefault("gen_id", create_run_scoped_id_gen(fields["run_id"]))
    return HarnessContext(**fields)


def recording(folder: Path, name: str) -> list[str]:
    return (folder / f"{name}.ndjson").read_text().splitlines()


def replay(harness: Any, lines: list[str], exit_code: int = 0, stderr: str = "", **ctx: Any) -> list[Event]:
    """Feed ``lines`` to ``harness``'s translator, then finish it with ``exit_code``."""
    translator = harness.translator(make_ctx(**ctx))
    events: list[Event] = []
    for line in lines:
        events += translator.feed(line)
    events += translator.finish(exit_code, stderr)
    return events


def check_well_formed(events: list[Event]) -> None:
    """Every event is valid AG-UI; one RUN_STARTED first, one terminal last; every call answered once."""
    for event in events:
        OFFICIAL_EVENT.validate_json(encode_event(event))
    kinds = [e.type for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds.count("RUN_STARTED") == 1, kinds
    assert kinds[-1] in TERMINAL and sum(kinds.count(t) for t in TERMINAL) == 1, kinds
    started = [e.tool_call_id for e in events if isinstance(e, ToolCallStartEvent)]
    answered = [e.tool_call_id for e in events if isinstance(e, ToolCallResultEvent)]
    assert sorted(started) == sorted(answered)
    assert kinds.count("TEXT_MESSAGE_START") == kinds.count("TEXT_MESSAGE_END")
    assert kinds.count("REASONING_START") == kinds.count("REASONING_END")
    for event in events:
        if isinstance(event, RunFinishedEvent):
            assert b"tool_calls" not in encode_event(event)  # R7: never a tool_calls finish


def kinds(events: list[Event]) -> list[str]:
    return [e.type for e in events]
