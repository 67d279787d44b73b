"""A coordinator config whose inactivity watchdog would fail every run a replica adopts is refused, by name.

A successor's first append waits for the run's log to be quiet for the takeover's window (R30, 5 s),
and that wait logs nothing: a watchdog shorter than it fails the adopted run while its agent still
works (measured with tests/integration/test_coordinator_redis_replicas.py: 3 s fails it, 6 s does not).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from boxwright.coordinator import CoordinatorConfig, StoreSet, create_coordinator_app
from boxwright.coordinator.app import CoordinatorConfigError
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN
from tests.support.replicas import ROOT


def _config(tmp_path: Path, inactivity_timeout: float) -> CoordinatorConfig:
    db = open_database(tmp_path / f"c-{inactivity_timeout:g}.db")
    runs, events = sqlite_run_backend(db)
    stores = StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close)
    return CoordinatorConfig(stores=stores, client_token=CLIENT_TOKEN, inactivity_timeout=inactivity_timeout)


def test_a_watchdog_shorter_than_a_takeovers_quiet_wait_is_refused(tmp_path: Path) -> None:
    for short in (0.5, 3.0, 5.0):
        with pytest.raises(CoordinatorConfigError, match=r"inactivity_timeout .*quiet wait") as refused:
            create_coordinator_app(_config(tmp_path, short))
        assert "--inactivity-timeout" in str(refused.value)
    for fine in (0.0, 6.0, 1800.0):
        assert create_coordinator_app(_config(tmp_path, fine)).state.coordinator.config.inactivity_timeout == fine


def test_serve_says_so_and_exits(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "BWT_AGENT": "true",
        "BWT_BASE_DIR": str(tmp_path / "sandboxes"),
        "BWT_TOOL_LOG": str(tmp_path / "calls.ndjson"),
        "BOXWRIGHT_CLIENT_TOKEN": CLIENT_TOKEN,
    }
    argv = [sys.executable, "-m", "boxwright", "serve", "--config", "tests.support.coordinator:test_config"]
    argv += ["--store", f"sqlite:///{tmp_path / 'c.db'}", "--port", "0", "--inactivity-timeout", "3"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stderr
    assert "inactivity_timeout 3 s" in done.stderr and "quiet wait" in done.stderr, done.stderr[-2000:]
