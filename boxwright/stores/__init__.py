"""Instance stores and lock stores: in-memory (one process) and SQLite (every process sharing a file)."""

from boxwright.stores.base import (
    DEFAULT_LEASE_TTL_MS,
    InstanceRecord,
    Lease,
    LeaseSignal,
    LockStore,
    SandboxInstanceStore,
    warn_if_not_durable,
)
from boxwright.stores.memory import MemoryInstanceStore, MemoryLockStore
from boxwright.stores.sqlite import SqliteDatabase, SqliteInstanceStore, SqliteLockStore, open_database

__all__ = [
    "DEFAULT_LEASE_TTL_MS",
    "InstanceRecord",
    "Lease",
    "LeaseSignal",
    "LockStore",
    "MemoryInstanceStore",
    "MemoryLockStore",
    "SandboxInstanceStore",
    "SqliteDatabase",
    "SqliteInstanceStore",
    "SqliteLockStore",
    "open_database",
    "warn_if_not_durable",
]
