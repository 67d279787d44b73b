"""The coordinator's tails when things go wrong (spec §8 A18, A22): the real app under uvicorn on 127.0.0.1.

A18: a log read that raises mid-tail closes the WebSocket 1011 with a short reason (at most 120
characters, never the error's text), and the full error is logged. A22: a client dropping its SSE
tail mid-run changes no record field (no detach stamp, no cancel, same epoch), and the run goes on to
its end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from boxwright.abort import AbortSignal
from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.definition import define_sandbox
from boxwright.events import Event
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.runs import START_OFFSET, EventLog
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import (
    CLIENT_TOKEN,
    client_headers,
    coordinator_server,
    scripted_agent,
    sse_events,
    trigger,
)

FAILING_RUN = "r-fails"
# What the failing read raises: long, and naming nothing a client should see in a close reason.
READ_ERROR = "disk went away under the log: " + "x" * 300


class _ReadsFailAfterTwo:
    """The real log, except that a read of ``FAILING_RUN`` raises after two events (every other call passes)."""

    def __init__(self, inner: EventLog) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        return self._read(run_id, after, signal, live)

    async def _read(
        self, run_id: str, after: str, signal: AbortSignal | None, live: bool
    ) -> AsyncIterator[tuple[str, Event]]:
        count = 0
        reader = self._inner.read(run_id, after, signal=signal, live=live)
        try:
            async for item in reader:
                if run_id == FAILING_RUN and count == 2:
                    raise RuntimeError(READ_ERROR)
                count += 1
                yield item
        finally:
            await reader.aclose()  # type: ignore[attr-defined]


def _config(tmp_path: Path, *, failing: bool) -> CoordinatorConfig:
    db = open_database(tmp_path / "c.db")
    runs, log = sqlite_run_backend(db)
    events: Any = _ReadsFailAfterTwo(log) if failing else log
    return CoordinatorConfig(
        sandboxes={"local": define_sandbox("tails", local_process_sandbox(base_dir=tmp_path / "sb"))},
        harnesses={"command": CommandHarness(command=scripted_agent(tmp_path))},
        stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
        client_token=CLIENT_TOKEN,
    )


async def _record(http: httpx.AsyncClient, url: str, run: str, thread: str) -> dict[str, Any]:
    answer = await http.get(f"{url}/runs/{run}", params={"threadId": thread})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def _until_finished(http: httpx.AsyncClient, url: str, run: str, thread: str) -> dict[str, Any]:
    for _ in range(1200):
        if (record := await _record(http, url, run, thread))["status"] != "running":
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run} still running after 60 s")


def test_a_log_read_that_raises_closes_the_websocket_1011_with_a_short_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    thread = f"t-{secrets.token_hex(4)}"

    async def main() -> None:
        async with (
            coordinator_server(_config(tmp_path, failing=True)) as (url, coordinator),
            httpx.AsyncClient(headers=client_headers(), timeout=30) as http,
        ):
            assert (await http.post(f"{url}/runs", json=trigger(thread, "lines 3 0", FAILING_RUN))).status_code == 202
            assert (await _until_finished(http, url, FAILING_RUN, thread))["status"] == "completed"
            ws_url = url.replace("http://", "ws://") + f"/runs/{FAILING_RUN}/stream?threadId={thread}&lastSeq=-1"
            frames: list[dict[str, Any]] = []
            async with connect(ws_url, additional_headers=client_headers()) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        frames.append(json.loads(await ws.recv()))
            received = closed.value.rcvd
            assert received is not None and received.code == 1011, (received, frames)
            assert 0 < len(received.reason) <= 120 and "disk went away" not in received.reason, received.reason
            assert len(frames) == 2 and all("chunk" in f for f in frames), frames
            # The log itself is whole: only the tail's read failed, after two of the run's events.
            assert len(await coordinator.stores.log.snapshot(FAILING_RUN)) > 2

    with caplog.at_level(logging.ERROR, logger="boxwright.middleware"):
        asyncio.run(main())
    assert any(READ_ERROR in r.getMessage() or READ_ERROR in (r.exc_text or "") for r in caplog.records), [
        r.getMessage()[:200] for r in caplog.records
    ]


def test_dropping_an_sse_tail_mid_run_changes_no_record_field(tmp_path: Path) -> None:
    thread, run = f"t-{secrets.token_hex(4)}", f"r-drop-{secrets.token_hex(4)}"
    lines = 30

    async def main() -> None:
        async with (
            coordinator_server(_config(tmp_path, failing=False)) as (url, _),
            httpx.AsyncClient(headers=client_headers(), timeout=30) as http,
        ):
            assert (await http.post(f"{url}/runs", json=trigger(thread, f"lines {lines} 0.1", run))).status_code == 202
            first = await asyncio.to_thread(sse_events, url, run, thread, limit=5)
            assert len(first) == 5
            before = await _record(http, url, run, thread)
            # The tail above hung up; another one joins and hangs up again mid-run.
            again = await asyncio.to_thread(sse_events, url, run, thread, limit=8)
            assert [ident for _, ident, _ in again[:5]] == [ident for _, ident, _ in first]
            await asyncio.sleep(0.5)
            after = await _record(http, url, run, thread)
            assert after["status"] == "running", after
            moving = {"lastSeq", "updatedAt"}  # the run going on, not the tail going away
            assert {k: v for k, v in after.items() if k not in moving} == {
                k: v for k, v in before.items() if k not in moving
            }
            assert after.get("detachedSince") is None and not after.get("cancelRequested"), after
            final = await _until_finished(http, url, run, thread)
            assert final["status"] == "completed" and final["driverEpoch"] == before["driverEpoch"], final
            frames = await asyncio.to_thread(sse_events, url, run, thread)
            deltas = [
                json.loads(d)["delta"]
                for e, _, d in frames
                if e is None and json.loads(d)["type"] == "TEXT_MESSAGE_CONTENT"
            ]
            assert deltas == [f"line {i}\n" for i in range(1, lines + 1)]

    asyncio.run(main())
