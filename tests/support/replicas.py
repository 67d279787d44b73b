"""App replicas as real processes (``tests.support.replica_app`` under uvicorn) and read-only looks at
the SQLite file they share: what a multi-process test drives and what it checks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from boxwright.events import Event, TextMessageContentEvent, decode_event
from boxwright.journal import encode_run_id

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica:
    """One app process; ``stop``/``resume``/``kill`` are SIGSTOP, SIGCONT, SIGKILL."""

    def __init__(
        self, name: str, db: Path, base: Path, agent: str, *, lease_ms: int, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = db.parent / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # closed in close()
        argv = [sys.executable, "-m", "tests.support.replica_app", "--db", str(db), "--base-dir", str(base)]
        argv += ["--agent", agent, "--port", str(self.port), "--lease-ms", str(lease_ms)]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._stderr, env={**os.environ, **(env or {})}
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if line != f"listening {self.port}":
            self.close()
            raise RuntimeError(f"replica {name} did not start ({line!r}): {self.stderr()}")

    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._stderr.close()


@contextlib.contextmanager
def replicas(*made: Replica) -> Iterator[tuple[Replica, ...]]:
    try:
        yield made
    finally:
        for replica in made:
            replica.close()


def _connect(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)


def stored_log(db: Path, run_id: str) -> list[tuple[int, Event]]:
    """Every stored (seq, event) of a run, read straight from the SQLite file; empty before the app made it."""
    if not db.exists():
        return []
    with contextlib.closing(_connect(db)) as conn:
        # A starting app creates the file before its schema: until both tables exist nothing is stored.
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"run_logs", "run_log_events"} <= tables:
            return []
        rows = conn.execute(
            "SELECT e.seq, e.event FROM run_logs AS l JOIN run_log_events AS e ON e.log_id = l.id "
            "WHERE l.run_id = ? ORDER BY e.seq",
            (run_id,),
        ).fetchall()
    return [(seq, decode_event(blob)) for seq, blob in rows]


def stored_events(db: Path, run_id: str) -> list[Event]:
    return [event for _, event in stored_log(db, run_id)]


def stored_deltas(db: Path, run_id: str) -> list[str]:
    return [e.delta for e in stored_events(db, run_id) if isinstance(e, TextMessageContentEvent)]


def log_closed(db: Path, run_id: str) -> bool:
    with contextlib.closing(_connect(db)) as conn:
        row = conn.execute("SELECT closed FROM run_logs WHERE run_id = ?", (run_id,)).fetchone()
    return bool(row and row[0])


def record_row(db: Path, run_id: str) -> dict[str, Any] | None:
    """The run's row as stored (every column), or ``None``."""
    with contextlib.closing(_connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else dict(row)


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def journal_files(run_id: str, *roots: Path) -> list[Path]:
    """Where a local-process sandbox keeps the run's journal and sidecar (under its state or /tmp)."""
    name = encode_run_id(run_id)
    found: list[Path] = []
    for root in (*roots, Path("/tmp/boxwright-runs")):
        if root.exists():
            found += [p for p in root.rglob(f"{name}.*") if p.suffix in (".ndjson", ".err")]
    return found
