"""SSE and long-poll tails over real HTTP (uvicorn on 127.0.0.1), of real runs: a command harness
printing AG-UI NDJSON on the local-process provider, journaled, with the SQLite run backend.

The helpers here (agent script, service + server, SSE client) are shared by the other delivery tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from boxwright.definition import define_sandbox
from boxwright.events import TextMessageContentEvent, TextMessageEndEvent, TextMessageStartEvent, encode_event
from boxwright.harnesses.command import command_harness
from boxwright.middleware import RunSpec, SandboxMiddleware, SandboxService, StartRunRequest, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.runs import format_offset
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import AsgiServer, serve_asgi

# -- shared helpers -------------------------------------------------------------------------------


def agent_script(deltas: int, gap: float, *, then: str = "") -> str:
    """A shell agent printing one AG-UI text message as ``deltas`` NDJSON deltas, ``gap`` seconds apart."""
    start = encode_event(TextMessageStartEvent(message_id="m", role="assistant")).decode()
    lines = [f"printf '%s\\n' '{start}'"]
    for i in range(deltas):
        delta = encode_event(TextMessageContentEvent(message_id="m", delta=f"d{i} ")).decode()
        lines.append(f"printf '%s\\n' '{delta}'; sleep {gap}")
    lines.append(f"printf '%s\\n' '{encode_event(TextMessageEndEvent(message_id='m')).decode()}'")
    if then:
        lines.append(then)
    return "; ".join(lines)


def expected_text(deltas: int) -> str:
    return "".join(f"d{i} " for i in range(deltas))


class CountingLog:
    """The real event log, counting the reads in progress (a tail left running would show here)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.open_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, run_id: str, after: str = "-1", *, signal: Any = None, live: bool = True) -> Any:
        self.open_reads += 1
        try:
            async with contextlib.aclosing(self.inner.read(run_id, after, signal=signal, live=live)) as reader:
                async for item in reader:
                    yield item
        finally:
            self.open_reads -= 1


@dataclass
class Stack:
    service: SandboxService
    log: CountingLog
    server: AsgiServer
    client: httpx.AsyncClient
    sandboxes: Path

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self, script: str, *, thread_id: str | None = None, run_id: str | None = None) -> str:
        body: dict[str, Any] = {"prompt": script, "threadId": thread_id or f"t-{uuid.uuid4().hex[:8]}"}
        if run_id is not None:
            body["runId"] = run_id
        response = await self.client.post("/runs", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["runId"])

    async def log_entries(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every stored (offset, event JSON) of a run, straight from the log."""
        return [(o, json.loads(encode_event(e))) async for o, e in self.log.inner.read(run_id, "-1", live=False)]

    async def wait_for_event(self, run_id: str, event_type: str) -> None:
        async with contextlib.aclosing(self.log.inner.read(run_id)) as reader:
            async for _, event in reader:
                if event.type == event_type:
                    return

    async def wait_reads_closed(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.log.open_reads and time.monotonic() < deadline:  # noqa: ASYNC110 - a counter, polled
            await asyncio.sleep(0.02)
        assert self.log.open_reads == 0, f"{self.log.open_reads} log read(s) still running after the client left"


def _factory(sandbox: Any) -> Callable[[StartRunRequest], RunSpec]:
    # The prompt is the agent's script: one harness per run, so each test says what its agent does.
    def make(request: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=command_harness(request.prompt))

    return make


@contextlib.asynccontextmanager
async def running_stack(
    tmp_path: Path, *, extra_routes: list[BaseRoute] | None = None, wrap: Callable[[Any], Any] | None = None
) -> AsyncIterator[Stack]:
    """SQLite runs + logs, a service whose factory runs the prompt as a shell agent, served by uvicorn."""
    db = open_database(tmp_path / "runs.db")
    runs, events = sqlite_run_backend(db)
    counting = CountingLog(events)
    sandboxes = tmp_path / "sb"
    sandbox = define_sandbox("delivery", local_process_sandbox(base_dir=sandboxes), file_events=False)
    service = SandboxService(runs, counting, store=MemoryInstanceStore(), factory=_factory(sandbox))  # type: ignore[arg-type]
    app: Any = Starlette(
        routes=[*sandbox_routes(service), *(extra_routes or [])],
        middleware=[Middleware(SandboxMiddleware, service=service)],
    )
    server = await serve_asgi(wrap(app) if wrap else app)
    client = httpx.AsyncClient(base_url=server.url, timeout=30)
    try:
        yield Stack(service, counting, server, client, sandboxes)
    finally:
        await client.aclose()
        await server.close()
        await service.aclose(cancel=True)
        await db.close()


@dataclass
class SseMessage:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_messages(response: httpx.Response) -> AsyncIterator[SseMessage]:
    """A minimal EventSource parser: fields up to a blank line make one message; comments are skipped."""
    fields: dict[str, list[str]] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                ids = fields.get("id")
                yield SseMessage(
                    ids[-1] if ids else None, fields.get("event", ["message"])[-1], "\n".join(fields["data"])
                )
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)


async def read_sse(
    client: httpx.AsyncClient,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    stop: Callable[[list[SseMessage]], bool] | None = None,
) -> tuple[list[SseMessage], SseMessage | None]:
    """Events read (until ``stop`` says so, then the connection is dropped) and the status message, if reached."""
    seen: list[SseMessage] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for message in sse_messages(response):
            if message.event == "status":
                return seen, message
            seen.append(message)
            if stop is not None and stop(seen):
                return seen, None
    return seen, None


def deltas_seen(messages: list[SseMessage]) -> int:
    return sum(1 for m in messages if m.json().get("type") == "TEXT_MESSAGE_CONTENT")


def run_async(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())


# -- tests ----------------------------------------------------------------------------------------


def test_sse_resume_after_disconnect_gets_every_remaining_event_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_id = await stack.start(agent_script(16, 0.08))
            # Half the deltas, then the client goes away mid-run.
            first, status = await read_sse(stack.client, f"/runs/{run_id}/events", stop=lambda s: deltas_seen(s) >= 8)
            assert status is None
            # AG-UI order (issue 18): the run's RUN_STARTED, then the run.accepted announcement.
            assert first[0].json()["type"] == "RUN_STARTED"
            assert first[1].json() == {
                "type": "CUSTOM",
                "name": "run.accepted",
                "value": {"runId": run_id, "threadId": first[1].json()["value"]["threadId"]},
                "timestamp": first[1].json()["timestamp"],
            }
            await stack.wait_reads_closed()
            record = (await stack.client.get(f"/runs/{run_id}")).json()
            assert record["status"] == "running", "a dropped tail must not stop the run"

            # EventSource's own reconnect: Last-Event-ID is the last id it saw.
            rest, status = await read_sse(
                stack.client, f"/runs/{run_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
            )
            assert status is not None and status.json() == {"status": "completed"}
            assert status.id is None
            stored = await stack.log_entries(run_id)
            assert [(m.id, m.json()) for m in first + rest] == stored, "every event exactly once, in order"
            assert stored[-1][1]["type"] == "RUN_FINISHED"
            text = "".join(e["delta"] for _, e in stored if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert text == expected_text(16)
            await stack.wait_reads_closed()
            assert (await stack.client.get(f"/runs/{run_id}")).json()["status"] == "completed"

            # ?offset= is the same cursor; Last-Event-ID wins over a conflicting one.
            middle = stored[len(stored) // 2][0]
            by_query, status = await read_sse(stack.client, f"/runs/{run_id}/events?offset={middle}")
            assert [(m.id, m.json()) for m in by_query] == stored[len(stored) // 2 + 1 :]
            both, _ = await read_sse(
                stack.client, f"/runs/{run_id}/events?offset={stored[0][0]}", headers={"Last-Event-ID": middle}
            )
            assert [m.id for m in both] == [m.id for m in by_query]
            # `now` on a finished run: nothing more, just the status.
            tail, status = await read_sse(stack.client, f"/runs/{run_id}/events?offset=now")
            assert tail == [] and status is not None and status.json()["status"] == "completed"

    run_async(main)


def test_sse_bad_offsets_and_unknown_runs_are_refused_with_a_reason(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_a = await stack.start(agent_script(1, 0))
            run_b = await stack.start(agent_script(1, 0))
            await stack.service.wait_run(run_a)
            await stack.service.wait_run(run_b)
            foreign = (await stack.log_entries(run_a))[1][0]
            cases = {
                "garbage": ("?offset=garbage", {}, "malformed"),
                "empty": ("?offset=", {}, "malformed"),
                "header garbage": ("", {"Last-Event-ID": "12"}, "malformed"),
                "another run's": (f"?offset={foreign}", {}, "another run"),
                "past the tail": (f"?offset={format_offset(run_b, 10_000)}", {}, "never issued"),
            }
            for name, (query, headers, words) in cases.items():
                for route in ("events", "poll"):
                    response = await stack.client.get(f"/runs/{run_b}/{route}{query}", headers=headers)
                    assert response.status_code == 400, (name, route, response.text)
                    body = response.json()
                    assert body["code"] == "invalid_offset" and words in body["error"], (name, body)
            for path in ("/runs/nope/events", "/runs/nope/poll", "/runs/nope"):
                response = await stack.client.get(path)
                assert response.status_code == 404 and response.json()["error"] == "unknown run", path
            assert (await stack.client.post("/runs/nope/cancel")).status_code == 404
            bad_wait = await stack.client.get(f"/runs/{run_b}/poll?wait=soon")
            assert bad_wait.status_code == 400 and "wait" in bad_wait.json()["error"]

    run_async(main)


def test_long_poll_pages_through_a_whole_run(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_id = await stack.start(agent_script(10, 0.05))
            offset, pages, collected = "-1", 0, []
            while True:
                response = await stack.client.get(f"/runs/{run_id}/poll", params={"offset": offset, "limit": 4})
                assert response.status_code == 200, response.text
                page = response.json()
                assert len(page["events"]) <= 4
                pages += 1
                collected += [(e["offset"], e["event"]) for e in page["events"]]
                offset = page["nextOffset"]
                if page["closed"]:
                    break
                assert page["status"] == "running" or page["events"], "an open run's poll waits for an event"
            assert page["status"] == "completed"
            assert collected == await stack.log_entries(run_id)
            assert pages >= len(collected) // 4
            # At the end of a closed log a poll answers at once, however long it may wait.
            began = time.monotonic()
            last = (await stack.client.get(f"/runs/{run_id}/poll", params={"offset": offset, "wait": 20_000})).json()
            assert time.monotonic() - began < 2
            assert last["events"] == [] and last["closed"] is True and last["nextOffset"] == offset

            # An open run with nothing new: the poll waits ?wait= ms, then answers empty and not closed.
            quiet = await stack.start(agent_script(1, 0, then="sleep 3"))
            offset = "-1"
            while True:
                page = (await stack.client.get(f"/runs/{quiet}/poll", params={"offset": offset, "wait": 5000})).json()
                offset = page["nextOffset"]
                if any(e["event"]["type"] == "TEXT_MESSAGE_END" for e in page["events"]):
                    break
            began = time.monotonic()
            waited = (await stack.client.get(f"/runs/{quiet}/poll", params={"offset": offset, "wait": 300})).json()
            elapsed = time.monotonic() - began
            assert waited["events"] == [] and waited["closed"] is False and waited["status"] == "running"
            assert waited["nextOffset"] == offset
            assert 0.25 <= elapsed < 2, elapsed
            await stack.wait_reads_closed()
            # A waiting poll is answered by the next event: the agent's end, after its sleep.
            nxt = (await stack.client.get(f"/runs/{quiet}/poll", params={"offset": offset, "wait": 10_000})).json()
            assert nxt["events"], nxt

    run_async(main)


def test_idle_sse_tail_gets_keepalive_pings_and_no_cache_headers(tmp_path: Path) -> None:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from boxwright.middleware import sse_response

    async def fast_ping(request: Request) -> Response:
        service: SandboxService = request.state.boxwright
        return await sse_response(service.log, service.runs, request.path_params["run_id"], request, ping_s=0.2)

    async def main() -> None:
        route = Route("/fast-ping/{run_id}", fast_ping)
        async with running_stack(tmp_path, extra_routes=[route]) as stack:
            run_id = await stack.start(agent_script(0, 0, then="sleep 5"))
            await stack.wait_for_event(run_id, "TEXT_MESSAGE_END")  # then the agent sleeps: a tail from now is idle
            async with stack.client.stream("GET", f"/fast-ping/{run_id}?offset=now") as response:
                assert response.headers["cache-control"] == "no-cache"
                assert response.headers["x-accel-buffering"] == "no"
                lines = []
                async for line in response.aiter_lines():
                    lines.append(line)
                    if line.startswith(": ping"):
                        break
            assert lines[0] == "retry: 1000", lines
            assert not any(line.startswith(("id:", "data:")) for line in lines), "an idle tail sends only pings"
            await stack.wait_reads_closed()

    run_async(main)
