"""Co-located mode through the coordinator: the real ``claude`` in the runner image (Docker) drives, against the fake
model on the host; two ``boxwright serve`` replicas over one SQLite file.

The agent's host tool call crosses back to the driving replica's own ``/tool-exec`` (its public callback origin,
the run's derived token). Replica A is SIGKILLed while the agent sits in a Bash call; a client reconnecting
through B with its last offset makes B adopt the run: B re-points the runner to its own ``/tool-exec`` grant
(``POST /runs/{id}/attach`` on the runner), so the agent's next host tool call runs on B, and the client gets
every event once and the run's completed status. The run used the non-default profiles (``docker`` /
``claude-box``), which B rebuilt from the run record.
"""

from __future__ import annotations

import concurrent.futures
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
from tests.support.coordinator import CoordinatorProcess, coordinators, sse_events, started_together, trigger
from tests.support.docker import (
    CASE_LABEL,
    bridge_address,
    colocated_replica_env,
    labelled_containers,
    remove_images,
    runner_image,
    snapshots_of,
)
from tests.support.replicas import free_port, record_row, wait_for

__all__ = ["runner_image"]
INTRO = "Recording first, then waiting."
# Long enough that the agent is still in it when A is gone.
WAIT = "sleep 3; echo waited"
SCRIPT: list[Step] = [
    ToolCall("mcp__boxwright__record_call", {"text": "before"}, text=INTRO),
    ToolCall("Bash", {"command": WAIT, "description": "wait a little"}),
    ToolCall("mcp__boxwright__record_call", {"text": "after"}),
    Text("Recorded twice."),
]


@pytest.fixture
def model(runner_image: str) -> Iterator[FakeModelServer]:
    # On the Docker bridge: the agent in the container reaches it there.
    with FakeModelServer({"colo": SCRIPT}, host=bridge_address()) as server:
        yield server


def _replica(name: str, tmp: Path, env: dict[str, str]) -> CoordinatorProcess:
    """A replica the runner in a container can call back: bound on the Docker bridge (never 0.0.0.0), its public
    callback origin the name containers resolve to that address; its own tool log (which replica ran a call)."""
    port = free_port()
    own = {
        "BOXWRIGHT_PUBLIC_ORIGIN": f"http://host.docker.internal:{port}",
        "BWT_TOOL_LOG": str(tmp / f"{name}-tools.ndjson"),
    }
    return CoordinatorProcess(name, tmp, "true", env={**env, **own}, host=bridge_address(), port=port)


def _calls(tmp: Path, name: str) -> list[dict[str, object]]:
    """The ``args`` of the host tool calls replica ``name`` ran."""
    path = tmp / f"{name}-tools.ndjson"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["args"] for line in lines if line.strip()]


def _probe(url: str, run_id: str, thread_id: str) -> int:
    """The status of a host tool call on ``url``'s ``/tool-exec`` for the run with a wrong token (it runs nothing)."""
    body = {"name": "record_call", "args": {"text": "intruder"}}
    headers = {"Authorization": "Bearer bwt_not-the-run-token"}
    answer = httpx.post(f"{url}/tool-exec/{run_id}", params={"threadId": thread_id}, json=body, headers=headers)
    return answer.status_code


def _frames_until(frames: list[tuple[str | None, str | None, str]], kind: str, nth: int) -> bool:
    types = [json.loads(data)["type"] for event, _, data in frames if event is None]
    return types.count(kind) >= nth


@pytest.mark.timeout(300)
def test_colocated_host_tools_cross_back_through_tool_exec_and_a_takeover_repoints_the_runner(
    tmp_path: Path, model: FakeModelServer
) -> None:
    case = f"colo-{secrets.token_hex(4)}"
    env = colocated_replica_env(model.base_url, case)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-colo-{secrets.token_hex(4)}"
    boxes: list[str] = []
    try:
        replicas = started_together(lambda: _replica("a", tmp_path, env), lambda: _replica("b", tmp_path, env))
        with coordinators(*replicas) as (a, b):
            body = trigger(thread, "[[script:colo]] record, wait, record", run, sandbox="docker", harness="claude-box")
            assert a.post("/runs", body).status_code == 202
            before: list[tuple[str | None, str | None, str]] = []
            # Through A until the Bash call started (the first host tool call is done by then).
            while not _frames_until(before, "TOOL_CALL_START", 2):
                got = sse_events(a.url, run, thread, last_event_id=before[-1][1] if before else None, limit=1)
                assert got and got[-1][0] != "status", ("the run ended before A was killed", got, a.stderr())
                before += got
            assert _calls(tmp_path, "a") == [{"text": "before"}], a.stderr()
            boxes += labelled_containers(f"{CASE_LABEL}={case}")
            # A's own /tool-exec holds the run's grant (a wrong token: 401, nothing run); B holds none yet.
            assert (_probe(a.url, run, thread), _probe(b.url, run, thread)) == (401, 404)
            a.kill()
            failures = f"A: {a.stderr()[-3000:]}\nB: {b.stderr()[-3000:]}"
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                tail = pool.submit(sse_events, b.url, run, thread, last_event_id=before[-1][1], timeout=180)
                # B's drive registered the run on B's /tool-exec and re-pointed the runner there.
                wait_for("B's tool-exec grant", lambda: tail.done() or _probe(b.url, run, thread) == 401, 120, 0.1)
                assert not tail.done(), "the run ended before B held a grant"
                after = tail.result()
            failures = f"A: {a.stderr()[-3000:]}\nB: {b.stderr()[-3000:]}"
            assert after[-1][0] == "status" and json.loads(after[-1][2])["status"] == "completed", (
                after[-3:],
                failures,
            )
            assert _calls(tmp_path, "b") == [{"text": "after"}], failures
            assert _calls(tmp_path, "a") == [{"text": "before"}]
            whole = sse_events(b.url, run, thread)
            seen = [ident for _, ident, _ in before + after if ident]
            assert len(seen) == len(set(seen)) and seen == [ident for _, ident, _ in whole if ident], failures
            events = [json.loads(data) for event, _, data in whole if event is None]
            names = [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"]
            assert names == ["record_call", "Bash", "record_call"], names
            results = [json.dumps(e) for e in events if e["type"] == "TOOL_CALL_RESULT"]
            assert len(results) == 3 and "waited" in results[1], results
            row = record_row(db, run)
            assert row is not None and row["status"] == "completed" and row["driver_epoch"] == 2, (row, failures)
            assert (row["sandbox_profile"], row["harness_profile"]) == ("docker", "claude-box"), row
            token = env["BOXWRIGHT_RUNNER_SECRET"]
            assert token not in db.read_bytes().decode(errors="replace")
    finally:
        wait_for("the run's container to go", lambda: labelled_containers(f"{CASE_LABEL}={case}") == [], 60, 0.2)
        # The provider's after-setup snapshot outlives its container by design: this test's go here.
        remove_images([ref for box in boxes for ref in snapshots_of(box)])
