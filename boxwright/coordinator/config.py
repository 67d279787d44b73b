"""What a coordinator is built from: its stores, sandbox profiles, harnesses, tools, origin and auth.

``CoordinatorConfig`` is plain data; ``create_coordinator_app`` turns it into a Starlette app.
The stores come as a ``StoreSet`` or a store URL (``sqlite:///PATH``, ``redis://HOST``);
``open_store_set`` parses the URL. Several replicas over one store are one coordinator.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from boxwright.definition import SandboxDefinition
from boxwright.harnesses.base import Harness
from boxwright.middleware.approvals import ApprovalDesk
from boxwright.middleware.service import RunChoice, RunMode, StartRunRequest, ThreadRuns
from boxwright.runs import EventLog, RunStore
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, LockStore, SandboxInstanceStore
from boxwright.tool_bridge.tools import Tool

from .auth import Authorize

# Decision 4: a run with no event for this long is failed and its sandbox cancelled (0: off).
DEFAULT_INACTIVITY_TIMEOUT_S: Final = 30 * 60.0
DEFAULT_WATCHDOG_INTERVAL_S: Final = 30.0  # R34
DEFAULT_SWEEP_INTERVAL_S: Final = 60.0
DEFAULT_DRAIN_TIMEOUT_S: Final = 25.0  # R33
DEFAULT_SWEEP_MAX_RUNS: Final = 25  # R35


class StoreUrlError(ValueError):
    """A store URL this coordinator cannot open; the message names the accepted forms."""


@dataclass
class StoreSet:
    """Every store one coordinator needs, over one backend (shared by all its replicas)."""

    runs: RunStore
    log: EventLog
    locks: LockStore
    instances: SandboxInstanceStore
    url: str = ""
    close: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def aclose(self) -> None:
        if self.close is not None:
            await self.close()


def _sqlite_store_set(url: str) -> StoreSet:
    from boxwright.config import database_path
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend

    # SQLAlchemy's spelling, as boxwright.stores.open has it: sqlite:///rel.db, sqlite:////abs.db.
    rest = url[len("sqlite://") :]
    if rest in ("", "/"):
        path = database_path()
    elif rest.startswith("//"):
        path = rest[1:]
    elif rest.startswith("/"):
        path = os.path.abspath(rest[1:])
    else:
        raise StoreUrlError(f"store URL {url!r}: expected sqlite:///REL/PATH or sqlite:////ABS/PATH")
    db = open_database(path)
    runs, log = sqlite_run_backend(db)
    return StoreSet(runs, log, SqliteLockStore(db), SqliteInstanceStore(db), url=f"sqlite:///{path}", close=db.close)


def open_store_set(url: str | None) -> StoreSet:
    """The stores at ``url``: ``sqlite:///REL/PATH``, ``sqlite:////ABS/PATH`` (``sqlite://`` or none: the
    embedded database file, ``$BOXWRIGHT_DB``), ``redis://HOST[:PORT][/DB]``.

    The shared parser (``boxwright.stores.open.open_store``) opens it when it is there.
    """
    url = url or "sqlite://"
    if not url.startswith(("sqlite://", "redis://", "rediss://", "unix://")):
        raise StoreUrlError(f"store URL {url!r}: expected sqlite:///PATH or redis://HOST[:PORT]")
    try:
        shared = importlib.import_module("boxwright.stores.open")
    except ImportError:
        shared = None
    opener = getattr(shared, "open_store", None)
    if callable(opener):
        try:
            made = opener(url)
        except ImportError as exc:
            raise StoreUrlError(f"{url!r}: {exc} (the Redis stores need: pip install 'boxwright[redis]')") from exc
        return StoreSet(made.runs, made.events, made.locks, made.instances, url=made.url, close=made.close)
    if url.startswith("sqlite://"):
        return _sqlite_store_set(url)
    raise StoreUrlError(f"{url!r}: the Redis stores are not available in this install; use sqlite:///PATH")


ResolveRun: TypeAlias = Callable[[StartRunRequest], RunChoice | Awaitable[RunChoice]]


@dataclass
class CoordinatorConfig:
    """A coordinator: ``create_coordinator_app(CoordinatorConfig(...))``.

    ``sandboxes`` and ``harnesses`` are profiles by name; a trigger picks them with
    ``metadata.sandbox`` / ``metadata.harness`` (default: the first of each), unless ``resolve``
    decides itself; ``modes`` says which sandbox profiles run co-located. ``public_origin`` is where
    sandboxes call back (the tool bridge); without it a loopback-bound server uses its bound port,
    never a request's ``Host`` (S3). Client routes need
    ``authorize`` (or ``client_token``) to consent; ``allow_anonymous`` is for development only.
    """

    sandboxes: Mapping[str, SandboxDefinition] = field(default_factory=dict)
    harnesses: Mapping[str, Harness] = field(default_factory=dict)
    # By sandbox profile name: "colocated" runs the harness in the container's runner (Docker), the
    # coordinator only relaying tool execution and recording events; others are driven from here.
    modes: Mapping[str, RunMode] = field(default_factory=dict)
    tools: Sequence[Tool] = ()
    # The desk the approval route answers; pass the one an ``ask_person_tool`` in ``tools`` waits on.
    approvals: ApprovalDesk | None = None
    resolve: ResolveRun | None = None
    stores: StoreSet | None = None
    store_url: str | None = None
    public_origin: str | None = None
    trust_request_host: bool = False
    allowed_hosts: Sequence[str] = ()
    authorize: Authorize | None = None
    client_token: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    # Co-located runs: the secret every replica shares, the runner's token is derived from (default:
    # $BOXWRIGHT_RUNNER_SECRET); a durable co-located run is refused without one.
    runner_secret: str | None = field(default=None, repr=False)
    allow_anonymous: bool = False
    durable: bool = True
    thread_runs: ThreadRuns = "busy"
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    inactivity_timeout: float = DEFAULT_INACTIVITY_TIMEOUT_S
    watchdog_interval: float = DEFAULT_WATCHDOG_INTERVAL_S
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL_S
    sweep_max_runs: int = DEFAULT_SWEEP_MAX_RUNS
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S
    extra: dict[str, Any] = field(default_factory=dict)


__all__ = [
    "CoordinatorConfig",
    "ResolveRun",
    "StoreSet",
    "StoreUrlError",
    "open_store_set",
]
