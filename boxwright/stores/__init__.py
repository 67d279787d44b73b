"""Instance, lock and run stores and event logs: in-memory (one process), SQLite (every process sharing a file)
and Redis (``boxwright.stores.redis``, extra ``redis``: every host reaching the server); ``open_store(url)``
opens a whole set from a ``sqlite:///PATH`` or ``redis://HOST:PORT/DB`` URL."""

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
from boxwright.stores.open import StoreSet, open_store
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
    "StoreSet",
    "hold_lock",
    "memory_run_backend",
    "open_database",
    "open_store",
    "sqlite_run_backend",
    "warn_if_not_durable",
]
