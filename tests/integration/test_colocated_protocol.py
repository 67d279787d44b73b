"""The host side of co-located mode against a scripted runner (coordinator spec §8, A29-A34).

``run_agent(mode="colocated")`` drives a local-process sandbox whose runner port leads to a fake
runner (tests/support/chaos_runner.py's boxes, serving a Starlette app under uvicorn on 127.0.0.1
from the runner's launch) that answers ``/health`` and ``/run`` as each case scripts it: the spec's
own device for these cases, since what a real runner never sends is what they are about. The real
runner app answers the cases about its own checks (A33, A34, and ``/shutdown`` after a run).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from boxwright import colocated
from boxwright.agent import run_agent
from boxwright.definition import define_sandbox
from boxwright.events import Event, RunErrorEvent, TextMessageContentEvent
from boxwright.harnesses.claude_code import claude_code
from boxwright.runner.server import create_runner_app
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge import serve_asgi
from boxwright.tool_bridge.tools import tool
from tests.support.chaos_runner import RunnerBoxes

Script = Callable[[dict[str, Any]], AsyncIterator[bytes]]


class FakeRunner:
    """A runner whose ``/run`` streams what ``script`` yields (or answers ``status``); its ``/health`` may fail."""

    def __init__(self, script: Script | None = None, *, status: int = 200, healthy: bool = True) -> None:
        self.script = script
        self.status = status
        self.healthy = healthy
        self.runs: list[dict[str, Any]] = []
        self.probes = 0

    def app(self) -> Starlette:
        async def health(request: Request) -> Response:
            self.probes += 1
            if not self.healthy:
                return Response(f"still booting ({self.probes})", status_code=503)
            return JSONResponse({"ok": True, "attach": True, "version": "fake"})

        async def run(request: Request) -> Response:
            body = json.loads(await request.body())
            self.runs.append(body)
            if self.status != 200 or self.script is None:
                return Response("runner over capacity", status_code=self.status)
            return StreamingResponse(self.script(body), media_type="application/x-ndjson")

        async def ok(request: Request) -> Response:
            return JSONResponse({})

        return Starlette(
            routes=[
                Route("/health", health),
                Route("/run", run, methods=["POST"]),
                Route("/shutdown", ok, methods=["POST"]),
                Route("/runs/{run_id}/cancel", ok, methods=["POST"]),
            ]
        )


async def _drive(tmp: Path, runner: FakeRunner, *, tools: list[Any] | None = None) -> tuple[list[Event], RunnerBoxes]:
    boxes = RunnerBoxes(tmp, "protocol-runner-secret", "true", runner_up=False, app=runner.app())
    sandbox = define_sandbox("fake-runner", boxes)  # type: ignore[arg-type]
    try:
        events = [
            event
            async for event in run_agent(
                sandbox,
                claude_code("m"),
                "hi",
                thread_id="t-proto",
                run_id="r-proto",
                tools=tools or [],
                store=MemoryInstanceStore(),
                mode="colocated",
            )
        ]
    finally:
        await boxes.close()
    return events, boxes


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _errors(events: list[Event]) -> list[str]:
    return [e.message for e in events if isinstance(e, RunErrorEvent)]


def _deltas(events: list[Event]) -> list[str]:
    return [e.delta for e in events if isinstance(e, TextMessageContentEvent)]


def test_a_runner_calling_tool_exec_inside_its_run_handler_gets_the_result(tmp_path: Path) -> None:
    """A29: the run's tool-exec URL and token exist before ``/run`` is sent, so a call made while the runner
    is still inside that request is served, by the host's own tool."""
    calls: list[str] = []

    @tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        calls.append(text)
        return text.upper()

    async def script(body: dict[str, Any]) -> AsyncIterator[bytes]:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(
                body["toolExecUrl"],
                json={"name": "shout", "args": {"text": "quiet"}},
                headers={"Authorization": f"Bearer {body['toolExecToken']}"},
            )
        yield _line({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})
        yield _line({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"{answer.status_code} {answer.text}"})
        yield _line({"type": "TEXT_MESSAGE_END", "messageId": "m"})
        yield _line({"type": "RUN_FINISHED", "threadId": body["threadId"], "runId": body["runId"]})

    runner = FakeRunner(script)
    events, provider = asyncio.run(_drive(tmp_path, runner, tools=[shout]))
    assert calls == ["quiet"] and _errors(events) == [], events
    assert _deltas(events) == ['200 {"result":"QUIET"}'], events
    assert events[-1].type == "RUN_FINISHED"
    # The runner was launched once, its token on stdin (never in its command line), and the run posted once.
    (launch,) = provider.boxes[0].launches
    assert "--token-file" not in launch and runner.runs[0]["toolExecToken"] not in launch
    assert len(runner.runs) == 1 and runner.runs[0]["harness"] == "claude-code"


def test_a_truncated_ndjson_line_is_one_run_error_and_what_follows_is_ignored(tmp_path: Path) -> None:
    """A30: a line cut mid-JSON gives RUN_ERROR ``runner sent unparseable NDJSON: …`` (at most 200 characters of
    it), and nothing the runner sends after is read."""

    async def script(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield _line({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})
        yield b"\n"  # blank lines are skipped
        yield b'{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "' + b"x" * 400 + b"\n"
        yield _line({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "after"})

    events, _ = asyncio.run(_drive(tmp_path, FakeRunner(script)))
    (error,) = _errors(events)
    assert error.startswith('runner sent unparseable NDJSON: {"type": "TEXT_MESSAGE_CONTENT"'), error
    assert len(error) <= len("runner sent unparseable NDJSON: ") + 200, len(error)
    assert "after" not in _deltas(events) and events[-1].type == "RUN_ERROR", events


def test_lines_after_a_run_error_are_ignored(tmp_path: Path) -> None:
    """A30: reading stops at the runner's RUN_ERROR."""

    async def script(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield _line({"type": "RUN_ERROR", "message": "the agent crashed"})
        yield _line({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "ghost"})
        yield _line({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})

    events, _ = asyncio.run(_drive(tmp_path, FakeRunner(script)))
    assert _errors(events) == ["the agent crashed"] and "ghost" not in _deltas(events), events
    assert [e.type for e in events].count("RUN_FINISHED") == 0 and events[-1].type == "RUN_ERROR"


def test_a_runner_answering_503_fails_the_run_with_its_status(tmp_path: Path) -> None:
    """A31: a non-2xx ``/run`` gives RUN_ERROR ``container runner failed: 503 <body>`` (after the error's type, as
    every failure of a drive is reported)."""
    events, _ = asyncio.run(_drive(tmp_path, FakeRunner(status=503)))
    assert _errors(events) == ["ColocatedRunError: container runner failed: 503 runner over capacity"], events
    assert events[-1].type == "RUN_ERROR"


def test_a_runner_that_never_gets_healthy_fails_with_its_last_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A32: the host probes ``/health`` every 250 ms until its wait runs out (60 s by default: a real container's
    first start under load takes longer than the spec's 5 s), then fails naming the last answer; no run is posted."""
    monkeypatch.setattr(colocated, "HEALTH_WAIT", 5 * colocated.HEALTH_EVERY * 4)  # the spec's 20 probes
    runner = FakeRunner(healthy=False)
    events, _ = asyncio.run(_drive(tmp_path, runner))
    (error,) = _errors(events)
    prefix = "ColocatedRunError: in-container runner did not become healthy in time: 503 still booting"
    assert error.startswith(prefix), error
    assert 15 <= runner.probes <= 21, runner.probes
    assert runner.runs == []


def _runner_body(path: Path, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "runId": "r-real",
        "threadId": "t-real",
        "messages": [{"role": "user", "content": "hi"}],
        "harness": "claude-code",
        "model": "m",
        "workspace": {"path": str(path), "secrets": []},
        "toolDescriptors": [],
        "toolExecUrl": "http://127.0.0.1:9/tool-exec/r-real",
        "toolExecToken": "t",
    }
    body.update(changes)
    return body


def test_the_real_runner_refuses_an_unknown_harness_no_token_and_a_missing_secret(tmp_path: Path) -> None:
    """A33: ``harness: "nope"`` is a 400 whose text names ``harness``; no runner token is a 401. A34: a declared
    secret the runner's env lacks fails the run naming it, and no agent starts (nothing is written)."""
    token = "runner-token-" + "z" * 32
    state = tmp_path / "state"
    state.mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def scenario() -> None:
        server = await serve_asgi(create_runner_app(token, str(state)))
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                auth = {"Authorization": f"Bearer {token}"}
                nope = await http.post("/run", json=_runner_body(workspace, harness="nope"), headers=auth)
                assert nope.status_code == 400 and "harness" in nope.text, nope.text
                anonymous = await http.post("/run", json=_runner_body(workspace))
                assert anonymous.status_code == 401, anonymous.text
                secret = "BOXWRIGHT_TEST_NEVER_SET_" + "Q" * 8
                missing = await http.post(
                    "/run",
                    json=_runner_body(workspace, workspace={"path": str(workspace), "secrets": [secret]}),
                    headers=auth,
                )
                said = missing.text
                assert secret in said, (missing.status_code, said)
                if missing.status_code == 200:  # streamed: its one line is the run's RUN_ERROR
                    assert [json.loads(line)["type"] for line in said.splitlines() if line] == ["RUN_ERROR"], said
                else:
                    assert missing.status_code == 400, said
        finally:
            await server.close()

    asyncio.run(scenario())
    assert list(workspace.iterdir()) == [], "an agent started in the workspace"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b"[1]", "runner sent a non-chunk line: [1]"),
        (b'{"delta": "no type"}', 'runner sent a non-chunk line: {"delta": "no type"}'),
        (b'{"type": "TEXT_MESSAGE_CONTENT", "delta": 5}', "runner sent an event this host cannot read: "),
    ],
)
def test_json_that_is_no_chunk_is_named_as_such(tmp_path: Path, line: bytes, said: str) -> None:
    """A30: a line that is JSON but not a chunk (``[1]``, no ``type``) gives ``runner sent a non-chunk line``; one
    whose fields do not fit its type is named too; nothing after it is read."""

    async def script(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield line + b"\n"
        yield _line({"type": "RUN_FINISHED", "threadId": body["threadId"], "runId": body["runId"]})

    events, _ = asyncio.run(_drive(tmp_path, FakeRunner(script)))
    (error,) = _errors(events)
    assert error.startswith(said), error
    assert events[-1].type == "RUN_ERROR", events
