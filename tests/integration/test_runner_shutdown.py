"""The runner's ``POST /shutdown`` right after a run's end, as the host that read it sends it.

The host reads the run's terminal line and asks at once, while the run's own clean-up (its sandbox's
teardown, which ends what the agent left running) is still going: the runner must stop once that
clean-up is done, not answer ``409 runs still going`` and stay up until something kills it. A run
still going is refused, and stays going. The real runner app under uvicorn, a command harness in
place of claude, no Docker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from boxwright.harnesses.command import CommandHarness
from boxwright.runner.server import create_runner_app, terminal
from boxwright.tool_bridge import serve_asgi

TOKEN = "runner-shutdown-token-" + "t" * 16
# The agent's exit leaves a child that ignores SIGTERM: the run's teardown takes its kill grace (2 s)
# after the terminal line is written.
LINGERING = "echo done; (trap '' TERM; exec sleep 30) >/dev/null 2>&1 &"


def _body(run_id: str, workspace: Path) -> dict[str, Any]:
    return {
        "runId": run_id,
        "threadId": "t-" + run_id,
        "messages": [{"role": "user", "content": "go"}],
        "harness": "claude-code",
        "model": "m",
        "workspace": {"path": str(workspace), "secrets": []},
        "toolDescriptors": [],
        "toolExecUrl": "http://127.0.0.1:9/tool-exec/" + run_id,
        "toolExecToken": "unused",
    }


async def _serve(tmp: Path, command: str) -> tuple[Any, list[float]]:
    stops: list[float] = []
    (tmp / "state").mkdir()

    def adapter(harness: str, model: str, env: Mapping[str, str]) -> CommandHarness:
        return CommandHarness(command=command)

    app = create_runner_app(
        TOKEN, str(tmp / "state"), on_shutdown=lambda: stops.append(time.monotonic()), resolve_adapter=adapter
    )
    return await serve_asgi(app), stops


def test_a_shutdown_sent_on_reading_the_runs_end_stops_the_runner_after_its_cleanup(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()

    async def scenario() -> tuple[int, dict[str, Any], int, dict[str, Any], list[float], float]:
        server, stops = await _serve(tmp_path, LINGERING)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                async with http.stream("POST", "/run", json=_body("r-1", tmp_path / "ws"), headers=headers) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if terminal(line.encode()):
                            break  # the host stops reading here and asks the runner to stop
                read_end = time.monotonic()
                shutdown = await http.post("/shutdown", headers=headers)
                # The run's clean-up is still going (its lingering child has the kill grace): no new run now.
                during = (await http.get("/runs/r-1", headers=headers)).json()
                refused = await http.post("/run", json=_body("r-new", tmp_path / "ws"), headers=headers)
                for _ in range(300):  # bounded: the clean-up takes the 2 s kill grace
                    if stops:
                        break
                    await asyncio.sleep(0.05)
                after = (await http.get("/runs/r-1", headers=headers)).json()
                return shutdown.status_code, during, refused.status_code, after, stops, read_end
        finally:
            await server.close()

    code, during, refused, after, stops, read_end = asyncio.run(scenario())
    assert code == 202, "the runner refused to stop after its only run ended"
    assert during["ended"] == "RUN_FINISHED" and during["done"] is False, during
    assert refused == 503, "a runner that accepted its shutdown started a new run"
    assert len(stops) == 1 and stops[0] >= read_end, "the runner never stopped"
    assert after["done"] is True, after


def test_a_shutdown_while_a_run_is_going_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()

    async def scenario() -> tuple[httpx.Response, list[float], list[str]]:
        server, stops = await _serve(tmp_path, "echo first; sleep 1; echo second")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        lines: list[str] = []
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                async with http.stream("POST", "/run", json=_body("r-2", tmp_path / "ws"), headers=headers) as r:
                    refused: httpx.Response | None = None
                    async for line in r.aiter_lines():
                        lines.append(line)
                        if refused is None and "first" in line:
                            refused = await http.post("/shutdown", headers=headers)
                assert refused is not None
                return refused, stops, lines
        finally:
            await server.close()

    refused, stops, lines = asyncio.run(scenario())
    assert refused.status_code == 409 and "r-2" in refused.text, refused.text
    assert stops == []
    assert any("second" in line for line in lines) and terminal(lines[-1].encode()), lines[-3:]
