"""The coordinator's routes against spec §8 (A1-A6, A15-A16, A19-A21, A36-A40, A46-A47): the real app under uvicorn
on 127.0.0.1 (its lifespan on), SQLite stores, local-process sandboxes running the command harness."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from boxwright.coordinator import Coordinator, CoordinatorConfig, StoreSet
from boxwright.coordinator.scheduler import WATCHDOG_MESSAGE
from boxwright.definition import define_sandbox
from boxwright.harnesses.base import HarnessContext, HarnessPlan
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import CreateInput, SandboxHandle
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, client_headers, coordinator_server, scripted_agent, trigger
from tests.support.sse import Frame, aparse_frames


class _SlowCreate:
    """A provider whose ``create`` first waits ``delay`` seconds (or raises ``error``), else the local one's."""

    def __init__(self, base: Path, *, delay: float = 0.0, error: str | None = None) -> None:
        self._inner = local_process_sandbox(base_dir=base)
        self._delay = delay
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create(self, input: CreateInput | None = None) -> SandboxHandle:
        await asyncio.sleep(self._delay)
        if self._error is not None:
            raise RuntimeError(self._error)
        return await self._inner.create(input)


@dataclass(frozen=True)
class _SessionEnvHarness(CommandHarness):
    """The command harness with the adapter's session option in the agent's env (A5)."""

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        plan = super().plan(ctx)
        plan.env["SESSION_SEEN"] = ctx.session_id or "none"
        return plan


@dataclass
class Stack:
    url: str
    coordinator: Coordinator
    http: httpx.AsyncClient
    db: Path

    async def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return await self.http.post(self.url + path, json=body, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.http.get(self.url + path, **kw)

    async def record(self, run_id: str, thread_id: str) -> dict[str, Any]:
        response = await self.get(f"/runs/{run_id}", params={"threadId": thread_id})
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def until(self, run_id: str, thread_id: str, *statuses: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (record := await self.record(run_id, thread_id))["status"] not in statuses:
            assert time.monotonic() < deadline, f"{run_id}: still {record} after {timeout} s"
            await asyncio.sleep(0.05)
        return record

    async def sse(
        self, run_id: str, thread_id: str, headers: dict[str, str] | None = None, limit: int = 0
    ) -> list[Frame]:
        """``(event, id, data)`` frames until the status event (or ``limit`` data frames)."""
        frames: list[Frame] = []
        async with self.http.stream(
            "GET", f"{self.url}/runs/{run_id}/events", params={"threadId": thread_id}, headers=headers, timeout=60
        ) as response:
            assert response.status_code == 200, await response.aread()
            async with contextlib.aclosing(aparse_frames(response.aiter_lines())) as parsed:
                async for frame in parsed:
                    frames.append(frame)
                    if frame.event == "status" or (limit and len(frames) >= limit):
                        return frames
        return frames


Scenario = Callable[[Stack], Awaitable[None]]


def _run(tmp_path: Path, scenario: Scenario, **overrides: Any) -> None:
    agent = scripted_agent(tmp_path)

    async def main() -> None:
        db_path = tmp_path / "coordinator.db"
        db = open_database(db_path)
        runs, events = sqlite_run_backend(db)
        base = tmp_path / "sandboxes"
        config = CoordinatorConfig(
            sandboxes={
                "local": define_sandbox("routes", local_process_sandbox(base_dir=base), file_events=False),
                "slow": define_sandbox("slow", _SlowCreate(base, delay=2.0), file_events=False),
                "broken": define_sandbox("broken", _SlowCreate(base, error="no capacity in eu-1"), file_events=False),
            },
            harnesses={
                "command": CommandHarness(command=agent),
                "echo": _SessionEnvHarness(command='echo "session=$SESSION_SEEN"'),
            },
            stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
            client_token=CLIENT_TOKEN,
            lease_ttl_ms=3000,
            **overrides,
        )
        async with coordinator_server(config) as (url, coordinator):
            async with httpx.AsyncClient(headers=client_headers(), timeout=30) as http:
                await scenario(Stack(url, coordinator, http, db_path))

    asyncio.run(main())


def _events(frames: list[Frame]) -> list[dict[str, Any]]:
    return [json.loads(data) for event, _, data in frames if event is None]


def test_a_trigger_is_answered_before_the_sandbox_exists(tmp_path: Path) -> None:
    """A1: a provider whose create takes 2 s; the 202 comes within 1 s, with the record ``running``."""

    async def scenario(stack: Stack) -> None:
        started = time.monotonic()
        response = await stack.post("/runs", trigger("t-slow", "lines 1 0", "r-slow", sandbox="slow"))
        took = time.monotonic() - started
        assert response.status_code == 202 and response.json() == {"runId": "r-slow"}
        assert took < 1.0, took
        record = await stack.record("r-slow", "t-slow")
        assert record["status"] == "running" and "finishedAt" not in record
        assert (await stack.until("r-slow", "t-slow", "completed", "failed"))["status"] == "completed"

    _run(tmp_path, scenario)


def test_bad_triggers_are_400_json_and_start_nothing(tmp_path: Path) -> None:
    """A2 (and R1): empty messages, no threadId, array metadata, a non-object message, an unknown profile: 400
    JSON; over 2 MiB: 413."""

    async def scenario(stack: Stack) -> None:
        bad: list[Any] = [
            {"threadId": "t-b", "messages": []},
            {"messages": [{"role": "user", "content": "hi"}]},
            {"threadId": "", "messages": [{"role": "user", "content": "hi"}]},
            {"threadId": "t-b", "messages": [{"role": "user", "content": "hi"}], "metadata": [1, 2]},
            {"threadId": "t-b", "messages": ["hi"]},
            {"threadId": "t-b", "messages": [{"role": "user", "content": "hi"}], "metadata": {"sandbox": "nope"}},
        ]
        for body in bad:
            response = await stack.post("/runs", body)
            assert response.status_code == 400, (body, response.text)
            assert isinstance(response.json()["error"], str)
        huge = await stack.post("/runs", trigger("t-b", "x" * (2 * 1024 * 1024 + 10)))
        assert huge.status_code == 413
        assert (await stack.get("/threads/t-b/active")).json() == {"runId": None}

    _run(tmp_path, scenario)


def test_a_sandbox_that_cannot_be_made_fails_the_run_with_one_run_error(tmp_path: Path) -> None:
    """A3: still 202; the run ends ``failed`` with one RUN_ERROR carrying the provider's message."""

    async def scenario(stack: Stack) -> None:
        assert (await stack.post("/runs", trigger("t-x", "lines 1 0", "r-x", sandbox="broken"))).status_code == 202
        record = await stack.until("r-x", "t-x", "completed", "failed", "aborted")
        assert record["status"] == "failed" and "no capacity in eu-1" in record["error"]["message"]
        errors = [e for e in _events(await stack.sse("r-x", "t-x")) if e["type"] == "RUN_ERROR"]
        assert len(errors) == 1 and "no capacity in eu-1" in errors[0]["message"]

    _run(tmp_path, scenario)


def test_a_client_run_id_is_idempotent_in_its_thread_and_409_in_another(tmp_path: Path) -> None:
    """A4: the same X-Run-Id twice drives once; the same id from another thread is 409 naming the owner."""

    async def scenario(stack: Stack) -> None:
        body = trigger("t-idem", "lines 2 0.1")
        first, second = await asyncio.gather(
            stack.post("/runs", body, headers={"X-Run-Id": "r-idem"}),
            stack.post("/runs", body, headers={"X-Run-Id": "r-idem"}),
        )
        assert first.status_code == second.status_code == 202
        assert first.json() == second.json() == {"runId": "r-idem"}
        other = await stack.post("/runs", trigger("t-else", "lines 1 0"), headers={"X-Run-Id": "r-idem"})
        assert other.status_code == 409 and other.json()["ownerThreadId"] == "t-idem"
        events = _events(await stack.sse("r-idem", "t-idem"))
        assert [e["type"] for e in events].count("RUN_STARTED") == 1
        assert [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["line 1\n", "line 2\n"]

    _run(tmp_path, scenario)


def test_metadata_reaches_the_adapter_and_is_never_stored(tmp_path: Path) -> None:
    """A5, A6: ``metadata.sessionId`` becomes the adapter's session option (the agent prints what it got); no
    metadata value is in the record or the log; an unknown run is 404 ``unknown run``."""

    async def scenario(stack: Stack) -> None:
        body = trigger("t-meta", "x", "r-meta", harness="echo", sessionId="sess-42", note="meta-canary")
        assert (await stack.post("/runs", body)).status_code == 202
        record = await stack.until("r-meta", "t-meta", "completed", "failed")
        assert record["status"] == "completed", record
        frames = await stack.sse("r-meta", "t-meta")
        deltas = [e.get("delta") for e in _events(frames)]
        assert "session=sess-42\n" in deltas, deltas
        assert "meta-canary" not in json.dumps(record) and "meta-canary" not in json.dumps(frames)
        unknown = await stack.get("/runs/r-none", params={"threadId": "t-meta"})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown run"

    _run(tmp_path, scenario)


def test_websocket_tail_of_a_finished_run_and_its_refusals(tmp_path: Path) -> None:
    """A15-A17, R5, R12-R13: WS on a finished 3-line run from ``lastSeq=-1``: ``{seq, chunk}`` frames 0, 1, 2, ...
    in order, then ``{type: status, record}`` (the record ``GET /runs/{id}`` gives, with its ``lastSeq``) and close
    1000 ``run complete``; client messages change nothing. Refusals answer the handshake: an unknown run 404, a bad
    or future ``lastSeq`` or offset 400; a WebSocket handshake that reached the route as plain HTTP gets 426."""

    async def scenario(stack: Stack) -> None:
        assert (await stack.post("/runs", trigger("t-ws", "lines 3 0", "r-ws"))).status_code == 202
        await stack.until("r-ws", "t-ws", "completed")
        ws_base = stack.url.replace("http://", "ws://")
        async with connect(
            f"{ws_base}/runs/r-ws/stream?threadId=t-ws&lastSeq=-1", additional_headers=client_headers()
        ) as ws:
            await ws.send("hello")  # inbound frames are ignored
            frames: list[dict[str, Any]] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(json.loads(await ws.recv()))
        assert closed.value.rcvd is not None and (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1000,
            "run complete",
        )
        *events, status = frames
        assert [f["seq"] for f in events] == list(range(len(events))) and len(events) > 3, events
        deltas = [f["chunk"].get("delta") for f in events if f["chunk"]["type"] == "TEXT_MESSAGE_CONTENT"]
        assert deltas == ["line 1\n", "line 2\n", "line 3\n"]
        record = (await stack.get("/runs/r-ws", params={"threadId": "t-ws"})).json()
        assert record["lastSeq"] == len(events) - 1 and record["status"] == "completed", record
        assert status == {"type": "status", "record": record}, status
        # Resuming from a seq gets the rest only.
        async with connect(
            f"{ws_base}/runs/r-ws/stream?threadId=t-ws&lastSeq=1", additional_headers=client_headers()
        ) as ws:
            rest = [json.loads(frame) async for frame in ws]
        assert [f.get("seq") for f in rest[:-1]] == list(range(2, len(events))), rest
        for path, code in [
            ("/runs/r-none/stream?threadId=t-ws", 404),
            ("/runs/r-ws/stream?threadId=t-ws&offset=abc", 400),
            ("/runs/r-ws/stream?threadId=t-ws&lastSeq=abc", 400),
            ("/runs/r-ws/stream?threadId=t-ws&lastSeq=99", 400),
        ]:
            with pytest.raises(InvalidStatus) as refused:
                async with connect(ws_base + path, additional_headers=client_headers()):
                    pass
            assert refused.value.response.status_code == code, (path, refused.value.response)
        # What a client behind a proxy that drops Upgrade/Connection sends: the handshake's own headers.
        lost = {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}
        answer = await stack.get("/runs/r-ws/stream", params={"threadId": "t-ws"}, headers=lost)
        assert answer.status_code == 426 and answer.json()["error"] == "expected websocket upgrade", answer.text
        # A plain GET is the run's Durable Streams stream, and curl's h2c upgrade offer does not change that.
        plain = await stack.get("/runs/r-ws/stream", params={"threadId": "t-ws", "offset": "-1"})
        h2c = await stack.get(
            "/runs/r-ws/stream", params={"threadId": "t-ws", "offset": "-1"}, headers={"Upgrade": "h2c"}
        )
        assert plain.status_code == h2c.status_code == 200 and len(plain.json()) == len(events), plain.text

    _run(tmp_path, scenario)


def test_sse_ids_are_offsets_and_a_reconnecting_client_sees_each_event_once(tmp_path: Path) -> None:
    """A19-A21: each ``id:`` is the event's offset, the stream ends with an id-less ``status`` event; a client
    that reconnects every 3 events (Last-Event-ID, beating a conflicting ?offset) through a live 30-line run
    sees every event exactly once."""

    async def scenario(stack: Stack) -> None:
        assert (await stack.post("/runs", trigger("t-re", "lines 30 0.03", "r-re"))).status_code == 202
        seen: list[str] = []
        events: list[dict[str, Any]] = []
        while True:
            headers = {"Last-Event-ID": seen[-1]} if seen else None
            frames = await stack.sse("r-re", "t-re", headers=headers, limit=3)
            for event, ident, data in frames:
                if event == "status":
                    assert ident is None and json.loads(data)["status"] == "completed"
                    break
                assert ident is not None
                seen.append(ident)
                events.append(json.loads(data))
            else:
                continue
            break
        assert len(seen) == len(set(seen))
        whole = await stack.sse("r-re", "t-re")
        assert [ident for event, ident, _ in whole if event is None] == seen
        # ?lastSeq= (0-based, exclusive; R15) resumes like the offset of that event.
        async with stack.http.stream(
            "GET", f"{stack.url}/runs/r-re/events", params={"threadId": "t-re", "lastSeq": "2"}
        ) as after:
            ids = [line async for line in after.aiter_lines() if line.startswith("id: ")]
        assert ids[0] == f"id: {seen[3]}" and len(ids) == len(seen) - 3
        for bad in ("abc", "1.5", "-2", str(len(seen) + 3)):
            refused = await stack.get("/runs/r-re/events", params={"threadId": "t-re", "lastSeq": bad})
            assert refused.status_code == 400, (bad, refused.text)
        deltas = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
        assert deltas == [f"line {i}\n" for i in range(1, 31)]

    _run(tmp_path, scenario)


def test_cancel_attach_and_thread_routes(tmp_path: Path) -> None:
    """A36-A40: a cancel is 202 and the run ends ``aborted``; cancelling it again, or a completed run, is a
    200 no-op; /threads/{t}/active names the running run, /threads/{t}/cancel is 204 with none; /attach on a
    run driven here, a terminal or a cancel-requested run drives nothing and leaves its log as it was."""

    async def scenario(stack: Stack) -> None:
        assert (await stack.post("/runs", trigger("t-c", "quiet 60", "r-c"))).status_code == 202
        frames = await stack.sse("r-c", "t-c", limit=4)
        assert any('"started' in data for _, _, data in frames), frames
        assert (await stack.get("/threads/t-c/active")).json() == {"runId": "r-c"}
        here = await stack.post("/runs/r-c/attach", params={"threadId": "t-c"})
        assert here.status_code == 200 and here.json() == {"driving": False, "reason": "driven-here"}
        cancelled = await stack.post("/runs/r-c/cancel", params={"threadId": "t-c"})
        assert cancelled.status_code == 202 and cancelled.json() == {"runId": "r-c", "cancelRequested": True}
        record = await stack.until("r-c", "t-c", "aborted", "failed", "completed", timeout=30)
        assert record["status"] == "aborted" and record["cancelRequested"] is True
        log_before = await stack.sse("r-c", "t-c")
        again = await stack.post("/runs/r-c/cancel", params={"threadId": "t-c"})
        assert again.status_code == 200 and again.json()["status"] == "aborted"
        for reason in ("terminal",):
            attach = await stack.post("/runs/r-c/attach", params={"threadId": "t-c"})
            assert attach.status_code == 200 and attach.json() == {"driving": False, "reason": reason}
        assert await stack.sse("r-c", "t-c") == log_before
        assert (await stack.record("r-c", "t-c")) == record
        assert (await stack.post("/threads/t-c/cancel")).status_code == 204
        assert (await stack.get("/threads/t-c/active")).json() == {"runId": None}
        assert (await stack.post("/runs", trigger("t-c", "quiet 60", "r-c2"))).status_code == 202
        thread_cancel = await stack.post("/threads/t-c/cancel")
        assert thread_cancel.status_code == 202 and thread_cancel.json()["runId"] == "r-c2"
        assert (await stack.until("r-c2", "t-c", "aborted", "failed", "completed"))["status"] == "aborted"

    _run(tmp_path, scenario)


def test_the_watchdog_fails_an_idle_run_on_a_fake_clock(tmp_path: Path) -> None:
    """A46 / decision 4: a run idle past the inactivity timeout fails at the next tick with the watchdog's
    reason, its cancel recorded and its driver aborted; a run that makes progress is left alone."""

    async def scenario(stack: Stack) -> None:
        scheduler = stack.coordinator.scheduler
        now = [1000.0]
        scheduler.clock = lambda: now[0]
        assert (await stack.post("/runs", trigger("t-idle", "quiet 120", "r-idle"))).status_code == 202
        assert (await stack.post("/runs", trigger("t-busy", "lines 400 0.05", "r-busy"))).status_code == 202
        await stack.sse("r-idle", "t-idle", limit=4)
        await stack.sse("r-busy", "t-busy", limit=4)
        assert await scheduler.watchdog_tick() == []  # first sight of both
        now[0] += 299.0
        await asyncio.sleep(0.3)
        assert await scheduler.watchdog_tick() == []  # 299 s: not yet
        now[0] += 2.0
        await asyncio.sleep(0.3)
        assert await scheduler.watchdog_tick() == ["r-idle"]  # 301 s idle; r-busy logged lines meanwhile
        record = await stack.record("r-idle", "t-idle")
        assert record["status"] == "failed" and record["error"]["message"] == WATCHDOG_MESSAGE
        assert record["cancelRequested"] is True
        assert "r-idle" not in stack.coordinator.service.active_runs  # its driver was aborted
        assert (await stack.record("r-busy", "t-busy"))["status"] == "running"
        await stack.post("/runs/r-busy/cancel", params={"threadId": "t-busy"})
        await stack.until("r-busy", "t-busy", "aborted")

    _run(tmp_path, scenario, inactivity_timeout=300.0)


def test_a_watchdog_tick_that_raises_is_logged_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A47: ticks every 50 ms; the first raises; later ones still run, and never two at once."""

    async def scenario(stack: Stack) -> None:
        scheduler = stack.coordinator.scheduler
        calls: list[float] = []
        running = [0]
        overlapped = [False]
        third = asyncio.Event()

        async def tick() -> list[str]:
            running[0] += 1
            overlapped[0] |= running[0] > 1
            calls.append(time.monotonic())
            if len(calls) >= 3:
                third.set()
            try:
                await asyncio.sleep(0.08)  # longer than the interval: a new tick must wait for this one
                if len(calls) == 1:
                    raise RuntimeError("store unreachable")
                return []
            finally:
                running[0] -= 1

        scheduler.watchdog_tick = tick  # type: ignore[method-assign]
        loop = asyncio.ensure_future(scheduler._loop(0.05, tick))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(third.wait(), 10)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        assert len(calls) >= 3 and not overlapped[0]

    with caplog.at_level(logging.ERROR, logger="boxwright.middleware"):
        _run(tmp_path, scenario)
    assert any("store unreachable" in r.getMessage() for r in caplog.records)
