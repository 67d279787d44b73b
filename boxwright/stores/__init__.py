"""Instance, lock and run stores and event logs: in-memory (one process) and SQLite (every process sharing a file)."""

from boxwright.stores.base import (
    DEFAULT_LEASE_TTL_MS,
    BlockLockStore,
    InstanceRecord,
    Lease,
    LeaseSignal,
    LockStore,
    SandboxInstanceStore,
    hold_lock,
    warn_if_not_durable,
)
from boxwright.stores.memory import (
    MemoryEventLog,
    MemoryInstanceStore,
    MemoryLockStore,
    MemoryRunStore,
    memory_run_backend,
)
from boxwright.stores.sqlite import (
    SqliteDatabase,
    SqliteEventLog,
    SqliteInstanceStore,
    SqliteLockStore,
    SqliteRunStore,
    open_database,
    sqlite_run_backend,
)

__all__ = [
    "DEFAULT_LEASE_TTL_MS",
    "BlockLockStore",
    "InstanceRecord",
    "Lease",
    "LeaseSignal",
    "LockStore",
    "MemoryEventLog",
    "MemoryInstanceStore",
    "MemoryLockStore",
    "MemoryRunStore",
    "SandboxInstanceStore",
    "SqliteDatabase",
    "SqliteEventLog",
    "SqliteInstanceStore",
    "SqliteLockStore",
    "SqliteRunStore",
    "hold_lock",
    "memory_run_backend",
    "open_database",
    "sqlite_run_backend",
    "warn_if_not_durable",
]
