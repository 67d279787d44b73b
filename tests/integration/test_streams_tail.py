"""A live boxwright run tailed through `GET /runs/{id}/stream` by real Durable Streams clients, from an
offset taken mid-run: the official TypeScript client (npm @durable-streams/client, SSE and long-poll)
and the Python client (PyPI durable-streams 0.1.0, SSE; spec §4: never long-poll on a run that closes).
Each sees every event after the offset exactly once, in order, and stops when the run's log closes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.streams import delta_script, run_stack, scratch_project, streams_npm, streams_server

DELTAS = 40
GAP_S = 0.05


async def _ts_tail(project: Path, node_modules: Path, url: str, offset: str, live: str) -> list[Any]:
    node = await asyncio.create_subprocess_exec(
        "node",
        str(project / "tail.mjs"),
        url,
        offset,
        live,
        cwd=project,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(node.communicate(), 60)
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    assert node.returncode == 0, err.decode()[-2000:]
    return [json.loads(line) for line in out.decode().splitlines()]


async def _py_tail(url: str, offset: str) -> list[Any]:
    import durable_streams

    seen: list[Any] = []
    async with durable_streams.astream(url, offset=offset, live="sse") as response:
        async for message in response.iter_json():
            seen.append(message)
    return seen


@pytest.mark.timeout(180)
def test_a_live_run_tailed_from_mid_run_by_the_typescript_and_python_clients(tmp_path: Path) -> None:
    node_modules = streams_npm()
    project = scratch_project(tmp_path, node_modules, "tail.mjs")

    async def main() -> None:
        async with run_stack(tmp_path) as stack:
            run_id = await stack.start(delta_script(DELTAS, GAP_S))
            url = f"{stack.url}/runs/{run_id}/stream"
            # Take an offset mid-run: a catch-up read once a few events are stored, with the log still open.
            async with httpx.AsyncClient(timeout=10) as http:
                for _ in range(400):
                    first = await http.get(url, params={"offset": "-1"})
                    if first.status_code == 200 and len(first.json()) >= 5:
                        break
                    await asyncio.sleep(0.02)
                assert first.status_code == 200, first.text
                assert "stream-closed" not in first.headers, "the run ended before the test took its offset"
                offset = first.headers["stream-next-offset"]
                assert first.headers["content-type"] == "application/json"
            tails = await asyncio.gather(
                _ts_tail(project, node_modules, url, offset, "sse"),
                _ts_tail(project, node_modules, url, offset, "long-poll"),
                _py_tail(url, offset),
            )
            stored = await stack.stored(run_id)
            offsets = [o for o, _ in stored]
            after = [json.loads(blob) for _, blob in stored[offsets.index(offset) + 1 :]]
            assert len(after) > DELTAS // 2, "most of the run should land after the mid-run offset"
            assert after[-1]["type"] == "RUN_FINISHED"
            for name, seen in zip(("typescript sse", "typescript long-poll", "python sse"), tails, strict=True):
                assert seen == after, f"{name}: {len(seen)} events, expected the {len(after)} after {offset}"
            # Nothing before the offset came back, and a write from a client is refused.
            async with httpx.AsyncClient(timeout=10) as http:
                refused = await http.post(url, headers={"content-type": "application/json"}, content=b"{}")
                assert refused.status_code == 405
                head = await http.head(url)
                assert head.headers["stream-closed"] == "true"
                assert head.headers["stream-next-offset"] == offsets[-1]

    asyncio.run(main())


@pytest.mark.timeout(180)
def test_boxwright_serve_streams_tails_a_run_driven_by_another_process(tmp_path: Path) -> None:
    node_modules = streams_npm()
    project = scratch_project(tmp_path, node_modules, "tail.mjs")

    async def main() -> None:
        async with run_stack(tmp_path) as stack:
            with streams_server(tmp_path / "runs.db") as served:  # the same SQLite file, another process
                run_id = await stack.start(delta_script(DELTAS, GAP_S))
                url = f"{served}/runs/{run_id}/stream"
                async with httpx.AsyncClient(timeout=10) as http:
                    for _ in range(400):
                        first = await http.get(url, params={"offset": "-1"})
                        if first.status_code == 200 and len(first.json()) >= 5:
                            break
                        await asyncio.sleep(0.02)
                    assert first.status_code == 200, first.text
                    assert "stream-closed" not in first.headers
                    offset = first.headers["stream-next-offset"]
                    seen = await _ts_tail(project, node_modules, url, offset, "sse")
                    assert (await http.put(url, headers={"content-type": "application/json"})).status_code == 405
                    unknown = await http.get(f"{served}/runs/no-such-run/stream", params={"offset": "-1"})
                    assert unknown.status_code == 404
                stored = await stack.stored(run_id)
                offsets = [o for o, _ in stored]
                after = [json.loads(blob) for _, blob in stored[offsets.index(offset) + 1 :]]
                assert len(after) > DELTAS // 2
                assert seen == after

    asyncio.run(main())
