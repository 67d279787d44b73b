"""Chaos: the driver of a run is SIGKILLed mid-run; another process takes the run over from its journal.

Real processes throughout: app process A triggers a durable run of the real `claude` CLI (against the fake
model, a long script) over one SQLite file and serves it over SSE; a client tails it; A is killed with SIGKILL
at a different point each round; app process B, sharing only the SQLite file, takes the run over when the
client comes back with its last offset. The client must receive every event exactly once, in order — the same
events as an uninterrupted reference run — and the run must end `completed`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from boxwright.events import Event, chunk_fingerprint, decode_event, encode_event
from tests.fixtures import find_claude
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("BOXWRIGHT_CHAOS_ROUNDS", "20"))
STEPS = 5


def _steps() -> list[object]:
    calls = [
        ToolCall("Bash", {"command": f"sleep 0.25; echo step {i}", "description": f"step {i}"}) for i in range(STEPS)
    ]
    return [*calls, Text("All steps done.")]


class App:
    def __init__(self, name: str, tmp: Path, claude: str, model: FakeModelServer) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.e2e.chaos_app",
                "--db",
                str(tmp / "chaos.db"),
                "--base-dir",
                str(tmp / "sandboxes"),
                "--claude",
                claude,
                "--home",
                str(tmp / "home"),
                "--model-url",
                model.base_url,
            ],
            stdout=subprocess.PIPE,
            stderr=open(tmp / f"{name}.log", "ab"),
            env=env,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening "), f"{name} did not start: {line!r} (see {tmp / (name + '.log')})"
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _sse(url: str, last_id: str | None, stop_after: int | None) -> Iterator[tuple[str | None, str, str]]:
    """(id, event, data) messages; stops reading after ``stop_after`` data messages (the connection drops)."""
    headers = {"Accept": "text/event-stream"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    seen = 0
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(60, connect=10)) as response:
        assert response.status_code == 200, response.read()
        msg_id: str | None = None
        kind, data = "message", []
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line == "":
                if data:
                    yield msg_id, kind, "\n".join(data)
                    if kind == "status":
                        return
                    seen += 1
                    if stop_after is not None and seen >= stop_after:
                        return
                msg_id, kind, data = None, "message", []
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "id":
                msg_id = value
            elif field == "event":
                kind = value
            elif field == "data":
                data.append(value)


def _meaning(event: Event) -> tuple[object, ...]:
    """What a reader sees, without ids and timestamps (ids differ between runs, not between drivers)."""
    raw = json.loads(encode_event(event))
    for key in ("timestamp", "messageId", "parentMessageId", "toolCallId", "runId", "threadId", "metadata", "rawEvent"):
        raw.pop(key, None)
    if raw["type"] == "RUN_FINISHED":
        raw.pop("usage", None)
        raw.pop("result", None)
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in raw.items()))


def _translated(events: list[Event]) -> list[tuple[object, ...]]:
    # CUSTOM events (run.accepted, file events, session id) are out of band: their count and place may differ.
    return [_meaning(e) for e in events if e.type != "CUSTOM"]


def _driver_epoch(db: Path, run_id: str) -> int | None:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT driver_epoch FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]


def _trigger(app: App, run_id: str) -> None:
    response = httpx.post(f"{app.url}/runs", json={"runId": run_id, "threadId": f"t-{run_id}"}, timeout=30)
    assert response.status_code == 202, response.text


@pytest.fixture
def claude() -> str:
    found = find_claude()
    if found is None:
        missing("the `claude` CLI is not installed (npm install @anthropic-ai/claude-code)")
    return found


def test_a_killed_driver_is_taken_over_and_the_client_sees_every_event_exactly_once(
    tmp_path: Path, claude: str
) -> None:
    (tmp_path / "home").mkdir()
    with FakeModelServer({"chaos": _steps()}) as model:
        b = App("b", tmp_path, claude, model)
        try:
            # The reference: one run, never interrupted.
            ref_id = f"ref-{uuid.uuid4().hex[:8]}"
            _trigger(b, ref_id)
            reference = [
                (i, decode_event(d)) for i, k, d in _sse(f"{b.url}/runs/{ref_id}/events", None, None) if k != "status"
            ]
            expected = _translated([e for _, e in reference])
            assert len(expected) > 20, "the script must be long enough to kill the driver at 20 points"
            first_translated = next(
                n for n, (_, e) in enumerate(reference) if e.type != "CUSTOM" and e.type != "RUN_STARTED"
            )
            kill_points = sorted(
                {first_translated + 1 + (r * (len(reference) - first_translated - 4)) // ROUNDS for r in range(ROUNDS)}
            )
            assert len(kill_points) >= ROUNDS - 2

            takeovers = 0
            for round_, kill_at in enumerate(kill_points):
                run_id = f"chaos-{round_}-{uuid.uuid4().hex[:6]}"
                a = App(f"a{round_}", tmp_path, claude, model)
                try:
                    _trigger(a, run_id)
                    before = list(_sse(f"{a.url}/runs/{run_id}/events", None, kill_at))
                finally:
                    a.kill()
                assert len(before) == kill_at
                last_id = before[-1][0]
                after = list(_sse(f"{b.url}/runs/{run_id}/events", last_id, None))
                status = after[-1]
                assert status[1] == "status", after[-3:]
                assert json.loads(status[2])["status"] == "completed", (round_, status)
                messages = before + after[:-1]
                ids = [m[0] for m in messages]
                assert len(ids) == len(set(ids)), f"round {round_}: an offset was delivered twice"
                assert ids == sorted(ids), f"round {round_}: offsets out of order"
                events = [decode_event(m[2]) for m in messages]
                prints = [chunk_fingerprint(e) for e in events]
                assert len(prints) == len(set(prints)), f"round {round_} (kill at {kill_at}): a duplicate event"
                assert _translated(events) == expected, f"round {round_} (kill at {kill_at}): events lost or changed"
                takeovers += _driver_epoch(tmp_path / "chaos.db", run_id) == 2
            print(f"chaos: {takeovers} takeovers in {len(kill_points)} rounds")
            # Each run was claimed by A (epoch 1); epoch 2 means B really drove the rest from the journal.
            assert takeovers >= len(kill_points) - 2, f"only {takeovers} of {len(kill_points)} rounds were takeovers"
        finally:
            b.stop()
