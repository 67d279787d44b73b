"""A coordinator config whose inactivity watchdog would fail every run a replica adopts is refused, by name.

A successor's first append waits for the run's log to be quiet for the takeover's window (R30, 5 s),
and that wait logs nothing: a watchdog shorter than it fails the adopted run while its agent still
works (measured with tests/integration/test_coordinator_redis_replicas.py: 3 s fails it, 6 s does not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from boxwright.coordinator import CoordinatorConfig, StoreSet, create_coordinator_app
from boxwright.coordinator.app import CoordinatorConfigError
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN


def _config(tmp_path: Path, inactivity_timeout: float) -> CoordinatorConfig:
    db = open_database(tmp_path / f"c-{inactivity_timeout:g}.db")
    runs, events = sqlite_run_backend(db)
    stores = StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close)
    return CoordinatorConfig(stores=stores, client_token=CLIENT_TOKEN, inactivity_timeout=inactivity_timeout)


def test_a_watchdog_shorter_than_a_takeovers_quiet_wait_is_refused(tmp_path: Path) -> None:
    # A ValueError: `boxwright serve` prints it as a usage error and exits.
    for short in (0.5, 3.0, 5.0):
        with pytest.raises(CoordinatorConfigError, match=r"inactivity_timeout .*quiet wait") as refused:
            create_coordinator_app(_config(tmp_path, short))
        assert "--inactivity-timeout" in str(refused.value)
    for fine in (0.0, 6.0, 1800.0):
        assert create_coordinator_app(_config(tmp_path, fine)).state.coordinator.config.inactivity_timeout == fine
