"""Workspace file events: create / change / delete, for any provider.

Providers with native change events expose ``fs.watch``; every other one is
polled with one ``find`` per interval (GNU find, present in every image we
run), so no extra package or image change is needed. Paths are relative to
the watched root; ``.git`` and ``node_modules`` are ignored by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from .events import CustomEvent, now_ms
from .sandbox import ProcessOptions, SandboxHandle
from .shell import quote

log = logging.getLogger("boxwright.watcher")

DEFAULT_IGNORE = (".git", "node_modules")
POLL_INTERVAL = 0.7


class FileEvent(msgspec.Struct, frozen=True):
    type: Literal["create", "change", "delete"]
    path: str
    timestamp: int


def file_event_chunk(event: FileEvent, *, thread_id: str, run_id: str) -> CustomEvent:
    return CustomEvent(
        name="sandbox.file",
        value={"type": event.type, "path": event.path, "timestamp": event.timestamp},
        metadata={"threadId": thread_id, "runId": run_id},
        timestamp=event.timestamp,
    )


def find_command(ignore: Sequence[str]) -> str:
    prune = " -o ".join(f"-name {quote(name)}" for name in ignore)
    pruning = f"\\( {prune} \\) -prune -o " if ignore else ""
    return f"find . {pruning}-type f -printf '%T@\\t%s\\t%p\\n' 2>/dev/null"


def parse_listing(text: str) -> dict[str, str]:
    """``path -> "mtime size"``; malformed lines are dropped."""
    files: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[2].startswith("./"):
            files[parts[2][2:]] = f"{parts[0]} {parts[1]}"
    return files


def diff_listings(before: dict[str, str], after: dict[str, str], now: int) -> list[FileEvent]:
    events = [FileEvent("delete", p, now) for p in before if p not in after]
    for path, stamp in after.items():
        if path not in before:
            events.append(FileEvent("create", path, now))
        elif before[path] != stamp:
            events.append(FileEvent("change", path, now))
    return sorted(events, key=lambda e: e.path)


class WorkspaceWatcher:
    """Polls a sandbox directory and calls ``on_event`` per change, from a task it owns."""

    def __init__(
        self,
        handle: SandboxHandle,
        on_event: Callable[[FileEvent], None],
        *,
        root: str = "/workspace",
        ignore: Sequence[str] = DEFAULT_IGNORE,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self._handle = handle
        self._on_event = on_event
        self._root = root
        self._command = find_command(ignore)
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._state: dict[str, str] | None = None

    async def start(self) -> WorkspaceWatcher:
        self._state = await self._list()
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def _list(self) -> dict[str, str]:
        result = await self._handle.process.exec(self._command, ProcessOptions(cwd=self._root))
        return parse_listing(result.stdout)

    async def poll(self) -> None:
        """One comparison now (also the final one at stop, so a last write is not missed)."""
        try:
            current = await self._list()
        except Exception as exc:  # the sandbox may be going away; a missed poll is not fatal
            log.debug("workspace poll failed: %r", exc)
            return
        if self._state is not None:
            for event in diff_listings(self._state, current, now_ms()):
                self._on_event(event)
        self._state = current

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval)
            if not self._stopping.is_set():
                await self.poll()

    async def stop(self) -> None:
        """Stop polling after one last comparison; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._task is not None:
            await self._task
        await self.poll()


async def watch_workspace(
    handle: SandboxHandle,
    on_event: Callable[[FileEvent], None],
    *,
    root: str = "/workspace",
    ignore: Sequence[str] = DEFAULT_IGNORE,
    interval: float = POLL_INTERVAL,
) -> WorkspaceWatcher:
    """Start watching ``root``; ``await watcher.stop()`` ends it."""
    return await WorkspaceWatcher(handle, on_event, root=root, ignore=ignore, interval=interval).start()
