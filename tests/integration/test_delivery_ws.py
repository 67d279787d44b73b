"""WebSocket tails over real sockets (uvicorn on 127.0.0.1, the `websockets` client) of real runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from boxwright.runs import format_offset
from tests.integration.test_delivery_sse import agent_script, expected_text, run_async, running_stack


def _ws_url(http_url: str, path: str) -> str:
    return "ws" + http_url.removeprefix("http") + path


async def _frames(ws: ClientConnection) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    try:
        while True:
            frames.append(json.loads(await ws.recv()))
    except ConnectionClosed:
        return frames


def test_websocket_tail_from_an_offset_then_status_and_close_1000(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_id = await stack.start(agent_script(8, 0.05))
            # Live, from the start, the offset given as the first message.
            async with connect(_ws_url(stack.url, f"/runs/{run_id}/ws")) as ws:
                await ws.send(json.dumps({"offset": "-1"}))
                live = await _frames(ws)
                assert ws.close_code == 1000 and ws.close_reason == "run complete"
            stored = await stack.log_entries(run_id)
            assert [(f["offset"], f["event"]) for f in live[:-1]] == stored
            assert live[-1] == {"status": "completed", "closed": True}
            text = "".join(e["delta"] for _, e in stored if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert text == expected_text(8)

            # From an offset in the middle, given in the query; client chatter changes nothing.
            middle = stored[3][0]
            async with connect(_ws_url(stack.url, f"/runs/{run_id}/ws?offset={middle}")) as ws:
                await ws.send("hello")
                rest = await _frames(ws)
                assert ws.close_code == 1000
            assert [(f["offset"], f["event"]) for f in rest[:-1]] == stored[4:]
            assert rest[-1]["closed"] is True
            # A bare offset as the first message works too.
            async with connect(_ws_url(stack.url, f"/runs/{run_id}/ws")) as ws:
                await ws.send(stored[-2][0])
                last = await _frames(ws)
            assert [f["offset"] for f in last[:-1]] == [stored[-1][0]]
            await stack.wait_reads_closed()

    run_async(main)


def test_websocket_refusals_close_with_4400_and_4404(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_a = await stack.start(agent_script(1, 0))
            run_b = await stack.start(agent_script(1, 0))
            await stack.service.wait_run(run_a)
            await stack.service.wait_run(run_b)
            foreign = (await stack.log_entries(run_a))[1][0]
            cases = [
                (f"/runs/{run_b}/ws?offset=garbage", None, 4400, "malformed"),
                (f"/runs/{run_b}/ws?offset={foreign}", None, 4400, "another run"),
                (f"/runs/{run_b}/ws?offset={format_offset(run_b, 999)}", None, 4400, "never issued"),
                (f"/runs/{run_b}/ws", "not an offset", 4400, "malformed"),
                (f"/runs/{run_b}/ws", json.dumps({"offset": foreign}), 4400, "another run"),
                ("/runs/nope/ws?offset=-1", None, 4404, "unknown run"),
            ]
            for path, first, code, words in cases:
                async with connect(_ws_url(stack.url, path)) as ws:
                    if first is not None:
                        await ws.send(first)
                    assert await _frames(ws) == [], path
                    assert ws.close_code == code, (path, ws.close_code, ws.close_reason)
                    assert words in ws.close_reason, (path, ws.close_reason)
                    assert len(ws.close_reason.encode()) <= 123

    run_async(main)


def test_websocket_client_leaving_mid_run_ends_only_its_read(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_id = await stack.start(agent_script(10, 0.08))
            async with connect(_ws_url(stack.url, f"/runs/{run_id}/ws?offset=-1")) as ws:
                seen = 0
                while seen < 3:
                    frame = json.loads(await ws.recv())
                    seen += frame["event"]["type"] == "TEXT_MESSAGE_CONTENT"
            # The client closed mid-run: the tail's read ends, the run goes on to its end.
            await stack.wait_reads_closed()
            record = await stack.service.wait_run(run_id)
            assert record is not None and record.status == "completed"
            stored = await stack.log_entries(run_id)
            assert "".join(e.get("delta", "") for _, e in stored) == expected_text(10)

    run_async(main)
