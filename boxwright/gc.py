"""``boxwright gc``: remove the sandbox folders and run journals that no record owns any more.

A sandbox folder is owned while an instance record names it (local-process's private state beside
it, ``<base>.state/<digest>``, goes with it); a journal while its run is not over.
What nothing owns piles up in the host's temp directory run after run. Three guards keep gc from
removing what someone still uses: a folder or journal younger than ``min_age`` stays (a run
creates its sandbox before it records it), a folder a live process works in or names on its
command line stays, and the store must exist (an empty store owns nothing, so gc against a wrong
path would remove every sandbox on the machine).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from .journal import (
    DEFAULT_JOURNAL_DIR,
    JOURNAL_SUFFIXES,
    Decoded,
    decode_journal_run_id,
    encode_run_id,
    is_terminal_status,
)
from .providers._posix import remove_tree_with_retry
from .providers.local_process import default_base_dir
from .sandbox import DestroyInput
from .stores.sqlite import SqliteDatabase, SqliteRunStore

DEFAULT_MIN_AGE = 3600.0


def default_sandbox_dirs() -> list[str]:
    """Where the two host providers create sandboxes by default (bubblewrap's is fixed in its provider)."""
    return [default_base_dir(), os.path.join(tempfile.gettempdir(), "boxwright-bwrap")]


class GcEntry(msgspec.Struct, frozen=True):
    kind: Literal["sandbox", "journal"]
    path: str
    reason: str


class GcResult(msgspec.Struct, kw_only=True):
    dry_run: bool
    removed: list[GcEntry] = msgspec.field(default_factory=list)
    kept: list[GcEntry] = msgspec.field(default_factory=list)


class StoreMissingError(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"no boxwright database at {path}: nothing there owns a sandbox, so every one would be removed; "
            "pass --db with the database your runs use (or set $BOXWRIGHT_DB)"
        )


async def _owned_sandboxes(db: SqliteDatabase) -> set[str]:
    """Every sandbox id an instance record names (for the host providers, the folder's path)."""
    async with db.connection() as conn:
        tables = await conn.execute_fetchall("SELECT name FROM sqlite_master WHERE name = 'sandbox_instances'")
        if not list(tables):
            return set()
        rows = await conn.execute_fetchall("SELECT provider_sandbox_id FROM sandbox_instances")
    return {os.path.realpath(row[0]) for row in rows}


def _newest_mtime(path: str) -> float:
    """The folder's and its direct children's newest mtime: a sandbox in use touches its top level."""
    newest = os.lstat(path).st_mtime
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return newest


def _live_users() -> list[tuple[int, str, str]]:
    """(pid, cwd, command line) of every process this user can see."""
    users = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            cwd = ""
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            cmdline = ""
        users.append((int(name), cwd, cmdline))
    return users


def _used_by(path: str, users: Iterable[tuple[int, str, str]]) -> int | None:
    inside = path.rstrip(os.sep) + os.sep
    for pid, cwd, cmdline in users:
        if pid != os.getpid() and (cwd == path or cwd.startswith(inside) or path in cmdline):
            return pid
    return None


def _state_dir(base: str, root: str) -> str | None:
    """Where local-process keeps a sandbox's private state (journals), if this version keeps one."""
    from .providers import local_process

    derive = getattr(local_process, "state_dir_for", None)
    return derive(base, root) if callable(derive) else None


async def _remove_sandbox(base: str, path: str) -> None:
    from .providers.bubblewrap import BubblewrapProvider
    from .providers.local_process import LocalProcessProvider

    # Each provider's own destroy: bubblewrap kills what still runs there and never removes a
    # workspace the user named; local-process removes the folder and its private state with it.
    if os.path.isfile(os.path.join(path, "sandbox.json")):
        await BubblewrapProvider(base_dir=base).destroy(DestroyInput(id=path))
    else:
        await LocalProcessProvider(base_dir=base).destroy(DestroyInput(id=path))
    if os.path.lexists(path):
        await asyncio.to_thread(remove_tree_with_retry, path, None)


async def collect_garbage(
    db: SqliteDatabase,
    *,
    sandbox_dirs: Sequence[str] | None = None,
    journal_dir: str = DEFAULT_JOURNAL_DIR,
    min_age: float = DEFAULT_MIN_AGE,
    dry_run: bool = False,
    now: float | None = None,
) -> GcResult:
    """Remove (or, with ``dry_run``, only list) what no record owns; ``min_age`` in seconds."""
    if db.path != ":memory:" and not os.path.isfile(db.path):
        raise StoreMissingError(db.path)
    result = GcResult(dry_run=dry_run)
    cutoff = (time.time() if now is None else now) - min_age
    owned = await _owned_sandboxes(db)
    users = await asyncio.to_thread(_live_users)
    journal_dirs = [journal_dir]
    for base in default_sandbox_dirs() if sandbox_dirs is None else sandbox_dirs:
        if not os.path.isdir(base):
            continue
        base = os.path.realpath(base)
        standing: set[str] = set()  # sandbox folders that stay: their private state stays too
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            if path in owned:
                reason = "a sandbox record owns it"
            elif _newest_mtime(path) > cutoff:
                reason = f"changed less than {min_age:g} s ago"
            elif (pid := _used_by(path, users)) is not None:
                reason = f"in use by process {pid}"
            else:
                if not dry_run:
                    await _remove_sandbox(base, path)
                result.removed.append(GcEntry("sandbox", path, "no sandbox record owns it"))
                continue
            result.kept.append(GcEntry("sandbox", path, reason))
            standing.add(path)
        journal_dirs += await _states(base, standing | owned, cutoff, min_age, result)
    for directory in journal_dirs:
        await _journals(db, directory, cutoff, min_age, result)
    return result


async def _states(base: str, standing: set[str], cutoff: float, min_age: float, result: GcResult) -> list[str]:
    """Sweep local-process's ``<base>.state``: a state whose sandbox folder is gone goes; the journal
    folders of those that stay are returned, to be swept run by run."""
    states = base.rstrip(os.sep) + ".state"
    if not os.path.isdir(states) or _state_dir(base, base) is None:
        return []
    alive = {_state_dir(base, root) for root in standing}
    kept: list[str] = []
    for name in sorted(os.listdir(states)):
        path = os.path.join(states, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        if path in alive:
            kept.append(os.path.join(path, "journals"))
        elif _newest_mtime(path) > cutoff:
            result.kept.append(GcEntry("sandbox", path, f"sandbox state changed less than {min_age:g} s ago"))
            kept.append(os.path.join(path, "journals"))
        else:
            if not result.dry_run:
                from .providers.local_process import process_record_of

                # A durable agent a dead host started may still run though its folder is gone: the state's
                # record is the last place that names it.
                await process_record_of(path, None).kill_all()
                await asyncio.to_thread(remove_tree_with_retry, path, None)
            result.removed.append(GcEntry("sandbox", path, "the state of a sandbox that is gone"))
    return kept


async def _journals(db: SqliteDatabase, journal_dir: str, cutoff: float, min_age: float, result: GcResult) -> None:
    if not os.path.isdir(journal_dir):
        return
    runs = SqliteRunStore(db)
    for name in sorted(os.listdir(journal_dir)):
        path = os.path.join(journal_dir, name)
        if not name.endswith(JOURNAL_SUFFIXES) or not os.path.isfile(path):
            continue
        decoded = decode_journal_run_id(name)
        # Only a canonical spelling: a hashed (truncated) name would decode to another run's id.
        if not isinstance(decoded, Decoded) or name not in (
            encode_run_id(decoded.run_id) + s for s in JOURNAL_SUFFIXES
        ):
            result.kept.append(GcEntry("journal", path, "its name is not a run id boxwright writes"))
            continue
        try:
            record = await runs.get(decoded.run_id)
        except Exception as exc:
            result.kept.append(GcEntry("journal", path, f"the run store did not answer: {exc}"))
            continue
        if record is not None and not is_terminal_status(record):
            result.kept.append(GcEntry("journal", path, f"run {decoded.run_id} is {record.status}"))
            continue
        if record is None and os.lstat(path).st_mtime > cutoff:
            result.kept.append(GcEntry("journal", path, f"no run record, but written less than {min_age:g} s ago"))
            continue
        reason = "no run record owns it" if record is None else f"run {decoded.run_id} ended {record.status}"
        if not result.dry_run:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        result.removed.append(GcEntry("journal", path, reason))
