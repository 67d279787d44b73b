"""Pieces of the chaos test and bench/takeover.py: app processes, an SSE client, a write audit, event projection.

An ``App`` is ``tests/e2e/chaos_app.py`` as a real process (SandboxService + sandbox_routes under
uvicorn) over one shared SQLite file, optionally armed with a fault point (``BOXWRIGHT_FAULT``).
``install_audit`` adds SQLite triggers to that file that record every log append and every
record write with the driver epoch in force, in the writer's own transaction, so a test sees
who wrote what after a handover without trusting the writers. ``project`` makes two runs'
events comparable (see its docstring for what it takes out and why).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from boxwright.events import Event, decode_event, encode_event
from boxwright.journal import journal_files_path, journal_paths
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from tests.fixtures import DEFAULT_CLAUDE_BIN
from tests.fixtures.fake_model import FakeModelServer
from tests.support.sse import parse_frames

ROOT = Path(__file__).resolve().parents[2]
AGENT_BIN = str(Path(DEFAULT_CLAUDE_BIN).parent)


@dataclass
class Message:
    """One SSE message: its id (the log offset), its event name, its data."""

    id: str | None
    kind: str
    data: str

    @property
    def event(self) -> Event:
        return decode_event(self.data)


class App:
    """One app process (tests/e2e/chaos_app.py) over ``tmp/chaos.db``; ``fault`` arms ``BOXWRIGHT_FAULT``."""

    def __init__(
        self, name: str, tmp: Path, claude: str, model: FakeModelServer, *, lease_ms: int, fault: str | None = None
    ) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PATH": f"{AGENT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        env.pop("BOXWRIGHT_FAULT", None)
        if fault is not None:
            env["BOXWRIGHT_FAULT"] = fault
        argv = [sys.executable, "-m", "tests.e2e.chaos_app", "--db", str(tmp / "chaos.db")]
        # A home of its own: concurrent claude processes sharing one ~/.claude.json may clobber it.
        home = tmp / f"home-{name}"
        home.mkdir(exist_ok=True)
        argv += ["--base-dir", str(tmp / "sandboxes"), "--claude", claude, "--home", str(home)]
        argv += ["--lease-ms", str(lease_ms)]
        with open(self.log_path, "ab") as stderr:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening "), f"{name} did not start: {line!r} (see {self.log_path})"
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def state(self) -> str:
        """The process state letter from /proc (R running, S sleeping, T stopped, Z zombie; X gone)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return "X"
        return stat.rpartition(")")[2].split()[0]

    def wait_stopped(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.state() != "T":
            assert self.proc.poll() is None, f"{self.name} exited ({self.proc.returncode}) instead of stopping"
            assert time.monotonic() < deadline, f"{self.name} never reached its stop point (see {self.log_path})"
            time.sleep(0.02)

    def faulted(self) -> str | None:
        """The point where ``BOXWRIGHT_FAULT`` struck this process (``<name> pass <n>``), from its log."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("boxwright fault: "):
                return line.removeprefix("boxwright fault: ").rpartition(":")[0]
        return None

    def wait_dead(self, timeout: float) -> int:
        """Wait for the process to end (a fault point killed it); returns its return code."""
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def trigger(self, run_id: str, thread_id: str, prompt: str) -> None:
        body = {"runId": run_id, "threadId": thread_id, "prompt": prompt}
        response = httpx.post(f"{self.url}/runs", json=body, timeout=30)
        assert response.status_code == 202, response.text

    def sse(self, run_id: str, *, last_id: str | None = None, stop_after: int | None = None) -> Iterator[Message]:
        return sse(f"{self.url}/runs/{run_id}/events", last_id=last_id, stop_after=stop_after)


def sse(
    url: str, *, last_id: str | None = None, stop_after: int | None = None, timeout: float = 90
) -> Iterator[Message]:
    """The SSE messages of ``url`` up to and including the ``status`` one; after ``stop_after`` data messages
    (not counting ``status``) the connection is dropped instead."""
    headers = {"Accept": "text/event-stream"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    seen = 0
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(timeout, connect=10)) as response:
        assert response.status_code == 200, response.read()
        for frame in parse_frames(response.iter_lines()):
            yield Message(frame.id, frame.event or "message", frame.data)
            if frame.event == "status":
                return
            seen += 1
            if stop_after is not None and seen >= stop_after:
                return


# -- the write audit ------------------------------------------------------------------------------

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
AUDIT_DDL = f"""
CREATE TABLE IF NOT EXISTS chaos_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    run_id TEXT,
    kind TEXT NOT NULL,
    epoch INTEGER,
    status TEXT,
    detached_since INTEGER,
    detail TEXT
);
CREATE TRIGGER IF NOT EXISTS chaos_audit_append AFTER INSERT ON run_log_events BEGIN
    INSERT INTO chaos_audit (at, run_id, kind, epoch, detail)
    SELECT {_NOW}, r.run_id, 'append', r.driver_epoch, json_extract(NEW.event, '$.type') || ' #' || NEW.seq
    FROM run_logs l LEFT JOIN runs r ON r.run_id = l.run_id WHERE l.id = NEW.log_id;
END;
CREATE TRIGGER IF NOT EXISTS chaos_audit_record AFTER UPDATE ON runs BEGIN
    INSERT INTO chaos_audit (at, run_id, kind, epoch, status, detached_since, detail)
    VALUES ({_NOW}, NEW.run_id, 'record', NEW.driver_epoch, NEW.status, NEW.detached_since,
            json_object('old_epoch', OLD.driver_epoch, 'old_status', OLD.status, 'cancel', NEW.cancel_requested,
                        'error', NEW.error_message));
END;
CREATE TRIGGER IF NOT EXISTS chaos_audit_close AFTER UPDATE OF closed ON run_logs WHEN NEW.closed != OLD.closed BEGIN
    INSERT INTO chaos_audit (at, run_id, kind) VALUES ({_NOW}, NEW.run_id, 'close');
END;
"""


def install_audit(db: Path) -> None:
    """Create the stores' schema in ``db`` (through the shipped store) and the audit triggers on it."""

    async def schema() -> None:
        async with open_database(db) as database:
            runs, log = sqlite_run_backend(database)
            await runs.get("chaos-schema")
            await log.tail("chaos-schema")

    asyncio.run(schema())
    with sqlite3.connect(db) as conn:
        conn.executescript(AUDIT_DDL)


@dataclass(frozen=True)
class Write:
    """One audited write: an append (``detail`` = event type and seq), a record write, or the log's close."""

    at: float
    kind: str
    epoch: int | None
    status: str | None
    detached_since: int | None
    detail: str | None

    @property
    def old_epoch(self) -> int | None:
        return json.loads(self.detail or "{}").get("old_epoch") if self.kind == "record" else None


def writes(db: Path, run_id: str) -> list[Write]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT at, kind, epoch, status, detached_since, detail FROM chaos_audit WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
    return [Write(*row) for row in rows]


@dataclass(frozen=True)
class Stored:
    record: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    closed: bool = False


def stored(db: Path, run_id: str) -> Stored:
    """The run's record row and its log, straight from the file."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        log = conn.execute("SELECT id, closed FROM run_logs WHERE run_id = ?", (run_id,)).fetchone()
        blobs = []
        if log is not None:
            blobs = [
                r[0]
                for r in conn.execute("SELECT event FROM run_log_events WHERE log_id = ? ORDER BY seq", (log["id"],))
            ]
    assert row is not None, f"run {run_id!r} has no record"
    return Stored(dict(row), [decode_event(b) for b in blobs], bool(log["closed"]) if log is not None else False)


def journal_exists(run_id: str) -> bool:
    paths = journal_paths(run_id)
    return any(os.path.exists(p) for p in (paths.journal, paths.stderr, journal_files_path(paths)))


# -- comparing two runs' events ---------------------------------------------------------------------

# Ids the fake model mints from a server-wide counter (msg_fake0012, toolu_fake0013) and the
# session id the real claude draws at random: run-specific, so renamed by first appearance.
_MINTED = re.compile(
    r"\b(?:msg|toolu|call|resp|fc)_fake\d+\b|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
)
# Wall clock: when, not what (the events carry no durations; RUN_FINISHED's cost and usage are compared).
_CLOCK_KEYS = frozenset({"timestamp"})


def project(events: list[Event], run_id: str, thread_id: str, base_dir: str) -> list[Any]:
    """``events`` as comparable values: every field of every event (CUSTOM included, with its value) except

    - ``timestamp``, at any depth (the file events carry one in their value too): wall clock, different
      in every run by nature;
    - the run id, the thread id and the sandbox base directory, wherever they occur inside a string
      (ids are ``<run id>-<n>`` from the run-scoped generator): replaced by ``<run>``, ``<thread>``,
      ``<base>``, so the counter ``n`` and the rest of the string are still compared;
    - ids minted outside the run (the fake model's ``msg_fake*``/``toolu_fake*`` counter, claude's
      random session uuid): renamed ``<id0>``, ``<id1>``, ... by first appearance, so that which
      event refers to which id is still compared.
    """
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0), f"<id{len(names)}>")

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in sorted(value.items()) if k not in _CLOCK_KEYS}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            value = value.replace(base_dir, "<base>").replace(run_id, "<run>").replace(thread_id, "<thread>")
            return _MINTED.sub(rename, value)
        return value

    return [clean(json.loads(encode_event(event))) for event in events]


def _is_file_event(event: Any) -> bool:
    return isinstance(event, dict) and event.get("type") == "CUSTOM" and event.get("name") == "sandbox.file"


def compare_runs(got: list[Any], want: list[Any]) -> str | None:
    """Where projected run ``got`` breaks the rule every correct run satisfies against reference ``want``;
    ``None`` if it keeps it.

    Every event but the ``sandbox.file`` ones: exactly the reference's, in its order, with its values.
    The ``sandbox.file`` events: for each path exactly the reference's events (with their values), in the
    same order; each one after the TOOL_CALL_END of the call that wrote it (in the reference: the last
    call started before it) and before the diff (``file.changed``) and the terminal event.

    Why not one exact position: a file event is seen by a watcher racing the agent, so where it lands
    among the agent's events is timing, not meaning. A driver killed between a write and its event, or
    one dead while the agent wrote, leaves the event to its successor, which can report it only once it
    has replayed the call that made it: later than an uninterrupted run would, never earlier than the
    call, never missing, never twice.
    """
    rest_got = [e for e in got if not _is_file_event(e)]
    rest_want = [e for e in want if not _is_file_event(e)]
    if rest_got != rest_want:
        return "the events other than sandbox.file: " + first_difference(rest_got, rest_want)

    def per_path(events: list[Any]) -> dict[str, list[Any]]:
        paths: dict[str, list[Any]] = {}
        for event in events:
            if _is_file_event(event):
                paths.setdefault(str(event["value"].get("path")), []).append(event)
        return paths

    if per_path(got) != per_path(want):
        return f"sandbox.file events by path: got {per_path(got)}, want {per_path(want)}"
    writer: dict[tuple[str, int], str | None] = {}  # (path, n-th event of it) -> the call that wrote it
    started: str | None = None
    counts: dict[str, int] = {}
    for event in want:
        if event.get("type") == "TOOL_CALL_START":
            started = event.get("toolCallId")
        elif _is_file_event(event):
            path = str(event["value"].get("path"))
            writer[(path, counts.get(path, 0))] = started
            counts[path] = counts.get(path, 0) + 1
    ended: set[str] = set()
    finished = False
    counts = {}
    for i, event in enumerate(got):
        if event.get("type") == "TOOL_CALL_END":
            ended.add(str(event.get("toolCallId")))
        elif event.get("type") in ("RUN_FINISHED", "RUN_ERROR") or event.get("name") == "file.changed":
            finished = True
        elif _is_file_event(event):
            path = str(event["value"].get("path"))
            call = writer[(path, counts.get(path, 0))]
            counts[path] = counts.get(path, 0) + 1
            if call is not None and call not in ended:
                return f"event {i}: {json.dumps(event)} before the end of its tool call {call}"
            if finished:
                return f"event {i}: {json.dumps(event)} after the run's diff or end"
    return None


def first_difference(got: list[Any], want: list[Any]) -> str:
    """Where two projections part, for an assertion message."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"event {i}: got {json.dumps(g)[:600]}\n  want {json.dumps(w)[:600]}"
    return f"lengths {len(got)} vs {len(want)}; extra: {json.dumps((got[len(want) :] or want[len(got) :])[:3])[:600]}"


def tail(url: str, *, last_id: str | None = None, read_timeout: float = 90) -> list[Message]:
    """What a client gets from ``url`` before the status message, the server's death, or ``read_timeout`` of
    silence (a stopped server sends nothing and closes nothing), whichever comes first."""
    got: list[Message] = []
    try:
        for message in sse(url, last_id=last_id, timeout=read_timeout):
            got.append(message)
    except httpx.TransportError:
        pass  # the connection died with its server, or went silent: the client drops it
    return got
