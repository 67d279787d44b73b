"""``POST /agui`` under uvicorn: the SSE answer of a real run, its resume, and the clear 4xx for bad input.

The service's factory runs the last user message as a shell agent (``tests.support.streams``), so a
run's events are exactly what the test printed; the clients' own verification is in
``tests/e2e/test_agui_clients.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from boxwright import events as ev
from boxwright.middleware.agui import reopening
from tests.support.streams import RunStack, delta_script, run_stack


def _input(thread_id: str, run_id: str, content: Any = "echo hi", **extra: Any) -> dict[str, Any]:
    return {
        "threadId": thread_id,
        "runId": run_id,
        "state": {},
        "messages": [{"id": "u-1", "role": "user", "content": content}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def _frames(text: str) -> list[dict[str, Any]]:
    """SSE frames with data: ``{"id", "event"?, "data"}``, comments and ``retry:`` lines skipped."""
    frames = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name in ("id", "event", "data"):
                fields[name] = value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            frames.append(fields)
    return frames


async def _post(stack: RunStack, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return await stack.client.post("/agui", json=body, headers=headers or {})


def test_the_answer_is_the_run_every_frame_with_its_offset_then_a_resume_reopens_the_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with run_stack(tmp_path) as stack:
            response = await _post(stack, _input("t-1", "r-agui-1", delta_script(6, 0.02)))
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = _frames(response.text)
            stored = await stack.stored("r-agui-1")
            assert [(f["id"], json.dumps(f["data"], separators=(",", ":"))) for f in frames] == [
                (offset, event.decode()) for offset, event in stored
            ], "every stored event once, in order, under its offset"
            assert all("event" not in f for f in frames), "no tail status frame: AG-UI clients would parse it"
            types = [f["data"]["type"] for f in frames]
            assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types

            # The same input again, resuming inside the message: nothing new starts, the message is re-opened.
            third = next(
                f for f in frames if f["data"]["type"] == "TEXT_MESSAGE_CONTENT" and f["data"]["delta"] == "d2 "
            )
            again = await _post(stack, _input("t-1", "r-agui-1", "echo never run"), {"Last-Event-ID": third["id"]})
            assert again.status_code == 200, again.text
            resumed = _frames(again.text)
            assert [f["data"]["type"] for f in resumed[:2]] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
            assert {f["id"] for f in resumed[:2]} == {third["id"]}, "re-opened under the resume offset"
            rest = [f for f in frames if f["id"] > third["id"]]
            assert resumed[2:] == rest
            assert await stack.stored("r-agui-1") == stored, "the repeated input started nothing"

            # TanStack's joinRun: GET /agui?runId=&offset=-1 gives the whole run.
            joined = await stack.client.get("/agui", params={"runId": "r-agui-1", "offset": "-1"})
            assert joined.status_code == 200 and _frames(joined.text) == frames

    asyncio.run(main())


def test_bad_input_is_a_clear_4xx_and_starts_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with run_stack(tmp_path) as stack:
            first = await _post(stack, _input("t-owner", "r-owned"))
            assert first.status_code == 200

            cases: list[tuple[str, httpx.Response, int, str, str]] = []

            async def case(name: str, response: httpx.Response, status: int, code: str, says: str) -> None:
                cases.append((name, response, status, code, says))

            await case(
                "no threadId", await _post(stack, {"runId": "r-x", "messages": []}), 400, "invalid_body", "threadId"
            )
            await case(
                "messages not a list",
                await _post(stack, {**_input("t-2", "r-2"), "messages": {"id": "u"}}),
                400,
                "invalid_body",
                "messages",
            )
            bad_role = {**_input("t-2", "r-2"), "messages": [{"id": "u", "role": "robot", "content": "hi"}]}
            await case("unknown role", await _post(stack, bad_role), 400, "invalid_body", "role")
            await case(
                "not JSON",
                await stack.client.post("/agui", content=b"{nope", headers={"content-type": "application/json"}),
                400,
                "invalid_body",
                "JSON",
            )
            deep = b'{"threadId":"t","runId":"r","state":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            await case(
                "too deep",
                await stack.client.post("/agui", content=deep, headers={"content-type": "application/json"}),
                400,
                "invalid_body",
                "deep",
            )
            await case(
                "runId of another thread",
                await _post(stack, _input("t-thief", "r-owned")),
                409,
                "thread_mismatch",
                "another thread",
            )
            await case("bad runId", await _post(stack, _input("t-3", "r/../x")), 400, "invalid_run_id", "runId")
            await case(
                "text/plain",
                await stack.client.post(
                    "/agui", content=json.dumps(_input("t-4", "r-4")), headers={"content-type": "text/plain"}
                ),
                415,
                "unsupported_media_type",
                "application/json",
            )
            parts = [{"type": "text", "text": "hi"}, {"type": "hologram", "value": "?"}]
            await case(
                "unknown content part type",
                await _post(stack, _input("t-5", "r-5", parts)),
                400,
                "invalid_body",
                "hologram",
            )
            image = [{"type": "image", "source": {"type": "url", "value": "https://example.invalid/x.png"}}]
            await case(
                "an image part", await _post(stack, _input("t-6", "r-6", image)), 400, "unsupported_content", "'image'"
            )
            await case(
                "no user message",
                await _post(stack, {**_input("t-7", "r-7"), "messages": []}),
                400,
                "invalid_body",
                "user message",
            )
            huge = _input("t-8", "r-8", "x" * (3 * 1024 * 1024))
            await case("over 2 MiB", await _post(stack, huge), 413, "too_large", "2 MiB")
            resume = {**_input("t-9", "r-9"), "resume": [{"interruptId": "nobody-asks", "status": "resolved"}]}
            await case("resume of no interrupt", await _post(stack, resume), 409, "no_interrupt", "nobody-asks")
            await case("GET without runId", await stack.client.get("/agui"), 400, "no_run_id", "runId")
            await case(
                "GET unknown run",
                await stack.client.get("/agui", params={"runId": "r-none"}),
                404,
                "unknown_run",
                "unknown",
            )
            for name, response, status, code, says in cases:
                assert response.status_code == status, (name, response.status_code, response.text)
                body = response.json()
                assert body["code"] == code and says in body["error"], (name, body)
            assert (await _post(stack, _input("t-thief", "r-owned"))).json()["ownerThreadId"] == "t-owner"
            for run_id in ("r-x", "r-2", "r-3", "r-4", "r-5", "r-6", "r-7", "r-8", "r-9"):
                assert await stack.service.runs.get(run_id) is None, f"{run_id}: a refused input started a run"

    asyncio.run(main())


def test_reopening_names_what_is_open_at_an_offset_and_a_finished_run_only_its_ends() -> None:
    started = ev.RunStartedEvent(thread_id="t", run_id="r")
    text = ev.TextMessageStartEvent(message_id="m1", role="assistant")
    call = ev.ToolCallStartEvent(tool_call_id="c1", tool_call_name="Bash", parent_message_id="m0")
    span = ev.ReasoningStartEvent(message_id="th")
    thought = ev.ReasoningMessageStartEvent(message_id="th")
    step = ev.StepStartedEvent(step_name="plan")
    stored: list[ev.Event] = [
        started,
        ev.CustomEvent(name="run.accepted", value={}),
        step,
        ev.TextMessageStartEvent(message_id="m0", role="assistant"),
        ev.TextMessageEndEvent(message_id="m0"),
        span,
        thought,
        call,
        ev.ToolCallArgsEvent(tool_call_id="c1", delta="{"),
        text,
        ev.TextMessageContentEvent(message_id="m1", delta="half"),
    ]
    assert reopening(stored) == [started, step, span, thought, text, call]
    closed = [*stored, ev.ToolCallEndEvent(tool_call_id="c1"), ev.TextMessageEndEvent(message_id="m1")]
    assert reopening(closed) == [started, step, span, thought]
    finished = ev.RunFinishedEvent(thread_id="t", run_id="r")
    assert reopening([*closed, finished]) == [started, finished]
    assert reopening([]) == []


def test_a_next_input_waits_for_a_previous_run_that_ended_its_log_and_a_live_one_is_busy(tmp_path: Path) -> None:
    """A client answering a frontend tool posts on RUN_FINISHED, while that run still stops its agent."""
    from boxwright.runs import RunPatch

    async def main() -> None:
        async with run_stack(tmp_path) as stack:
            runs, log = stack.service.runs, stack.log
            await runs.create_or_resume("r-ending", "t-next")
            await log.append("r-ending", [ev.RunStartedEvent(thread_id="t-next", run_id="r-ending")])
            busy = await _post(stack, _input("t-next", "r-next", "echo hi"))
            assert busy.status_code == 409 and busy.json()["activeRunId"] == "r-ending", busy.text
            await log.append("r-ending", [ev.RunFinishedEvent(thread_id="t-next", run_id="r-ending")])

            async def end_later() -> None:
                await asyncio.sleep(0.5)
                await runs.update("r-ending", RunPatch(status="completed"))

            ending = asyncio.ensure_future(end_later())
            answered = await _post(stack, _input("t-next", "r-next", "echo hi"))
            await ending
            assert answered.status_code == 200, answered.text
            assert _frames(answered.text)[-1]["data"]["type"] == "RUN_FINISHED"

    asyncio.run(main())
