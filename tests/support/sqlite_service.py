"""A ``SandboxService`` whose every store is one SQLite file, as the hosts of one app over a shared database.

Services built over the same file, in this process or in others (tests/support/colocated_app.py), share runs,
records, logs, locks and sandbox records: one stops, another takes its runs over. ``service.runs`` and
``service.log`` are the file's run store and event log, for a test that writes or reads them directly.
"""

from __future__ import annotations

import os

from boxwright.middleware import SandboxService
from boxwright.middleware.service import RunFactory
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend


def sqlite_service(
    path: str | os.PathLike[str], factory: RunFactory, *, lease_ttl_ms: int, runner_secret: str | None = None
) -> SandboxService:
    """A service over the SQLite file ``path`` whose runs ``factory`` chooses."""
    db = open_database(path)
    runs, log = sqlite_run_backend(db)
    return SandboxService(
        runs,
        log,
        locks=SqliteLockStore(db),
        store=SqliteInstanceStore(db),
        factory=factory,
        lease_ttl_ms=lease_ttl_ms,
        runner_secret=runner_secret,
    )
