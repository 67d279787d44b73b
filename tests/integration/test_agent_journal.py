"""run_agent with a journal: the agent outlives its driver, and a second driver re-reads its whole run."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import CANCEL_REASON, Lifecycle, define_sandbox
from boxwright.events import (
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    chunk_fingerprint,
    encode_event,
)
from boxwright.harnesses.command import command_harness
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from tests.support.require import missing


def _script(lines: int, gap: float) -> str:
    # An agent that prints AG-UI text events slowly, so a driver can die in the middle of it.
    events = [encode_event(TextMessageContentEvent(message_id="m", delta=f"line {i}\n")).decode() for i in range(lines)]
    body = "; ".join(f"printf '%s\\n' '{e}'; sleep {gap}" for e in events)
    start = '{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}'
    end = '{"type":"TEXT_MESSAGE_END","messageId":"m"}'
    return f"printf '%s\\n' '{start}'; {body}; printf '%s\\n' '{end}'"


def _provider(kind: str, tmp_path: Path) -> object:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "sb")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    return bubblewrap_sandbox(base_dir=tmp_path / "sb")


class Detach:
    def __init__(self) -> None:
        self.stamped: list[str] = []

    async def cancel_requested(self) -> bool:
        return False

    async def stamp_detached(self, sandbox_key: str) -> None:
        self.stamped.append(sandbox_key)


def _meaningful(events: list[Event]) -> list[str]:
    # Out-of-band events (file events) and timestamps aside, a replay must match the original.
    return [chunk_fingerprint(e) for e in events if e.type != "CUSTOM" or e.name == "file.changed"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_journaled_run_matches_a_plain_run_and_survives_its_driver(kind: str, tmp_path: Path) -> None:
    store = MemoryInstanceStore()
    sandbox = define_sandbox("journal", _provider(kind, tmp_path))  # type: ignore[arg-type]
    harness = command_harness(_script(6, 0.15))

    async def collect(run_id: str, thread_id: str, **kw: object) -> list[Event]:
        stream = run_agent(sandbox, harness, "go", thread_id=thread_id, run_id=run_id, store=store, **kw)  # type: ignore[arg-type]
        return [e async for e in stream]

    # Run ids of this test's own (journals are per sandbox now, but a stale store must not match either).
    tag = uuid.uuid4().hex[:8]

    async def main() -> None:
        plain = await collect(f"plain-{tag}", "t-plain")
        journaled = await collect(f"journaled-{tag}", "t-journaled", journal=JournalOptions())
        assert isinstance(journaled[-1], RunFinishedEvent)
        text = "".join(e.delta for e in journaled if isinstance(e, TextMessageContentEvent))
        assert text == "".join(f"line {i}\n" for i in range(6))
        assert [e.type for e in plain] == [e.type for e in journaled]

        # Driver A drops mid-run (no cancel): the run detaches, the agent keeps writing its journal.
        controller = AbortController()
        detach = Detach()
        seen: list[Event] = []
        async for event in run_agent(
            sandbox,
            harness,
            "go",
            thread_id="t-x",
            run_id=f"r-x-{tag}",
            store=store,
            journal=JournalOptions(),
            durability=detach,
            signal=controller.signal,
        ):
            seen.append(event)
            if isinstance(event, TextMessageContentEvent) and event.delta == "line 1\n":
                controller.abort("client went away")
        assert len(detach.stamped) == 1, "the detach was recorded, the sandbox kept"
        assert not any(isinstance(e, (RunFinishedEvent, RunErrorEvent)) for e in seen)
        # Driver B attaches: the whole run, from the journal, to its real end.
        replay = await collect(f"r-x-{tag}", "t-x", journal=JournalOptions(attach=True))
        replay_text = "".join(e.delta for e in replay if isinstance(e, TextMessageContentEvent))
        assert replay_text == text
        assert isinstance(replay[-1], RunFinishedEvent)
        # What A saw is an exact prefix of what B re-derived (timestamps aside).
        assert _meaningful(replay)[: len(_meaningful(seen))] == _meaningful(seen)

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_cancel_of_a_journaled_run_kills_the_agent_and_destroys_the_sandbox(kind: str, tmp_path: Path) -> None:
    marker = "never-written"
    sandbox = define_sandbox("journal", _provider(kind, tmp_path), lifecycle=Lifecycle(destroy_on_complete=False))  # type: ignore[arg-type]
    harness = command_harness(f"{_script(2, 0.1)}; sleep 3; touch {marker}")
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        async for event in run_agent(
            sandbox,
            harness,
            "go",
            thread_id="t",
            run_id=f"cancel-{uuid.uuid4().hex}",  # a journaled run needs the caller's run id
            store=MemoryInstanceStore(),
            journal=JournalOptions(),
            durability=Detach(),
            signal=controller.signal,
        ):
            events.append(event)
            if isinstance(event, TextMessageContentEvent):
                controller.abort(CANCEL_REASON)
        await asyncio.sleep(4)
        return events

    events = asyncio.run(main())
    assert isinstance(events[-1], RunErrorEvent) and events[-1].code == "cancelled"
    base = tmp_path / "sb"
    assert not base.exists() or os.listdir(base) == []


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_an_agent_that_never_reads_its_prompt_still_runs_journaled(kind: str, tmp_path: Path) -> None:
    # A prompt bigger than a pipe's buffer: the write blocks until the agent has exited, then fails.
    sandbox = define_sandbox("no-read", _provider(kind, tmp_path), lifecycle=Lifecycle(destroy_on_complete=True))

    async def main() -> list[Event]:
        stream = run_agent(
            sandbox,
            command_harness("echo hi"),
            "x" * (1024 * 1024),
            thread_id="t",
            run_id=f"no-read-{uuid.uuid4().hex[:8]}",
            journal=JournalOptions(),
        )
        return [e async for e in stream]

    events = asyncio.run(main())
    assert isinstance(events[-1], RunFinishedEvent), events[-1]
    assert "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent)) == "hi\n"
