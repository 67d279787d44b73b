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
from .sandbox import NativeWatch, ProcessOptions, SandboxHandle
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


def _diff_listings(before: dict[str, str], after: dict[str, str], _last: dict[str, str], now: int) -> list[FileEvent]:
    return diff_listings(before, after, now)


def diff_listings(before: dict[str, str], after: dict[str, str], now: int) -> list[FileEvent]:
    events = [FileEvent("delete", p, now) for p in before if p not in after]
    for path, stamp in after.items():
        if path not in before:
            events.append(FileEvent("create", path, now))
        elif before[path] != stamp:
            events.append(FileEvent("change", path, now))
    return sorted(events, key=lambda e: e.path)


def reconcile(before: dict[str, str], after: dict[str, str], last: dict[str, str], now: int) -> list[FileEvent]:
    """What a last listing ``after`` must add to the live events already reported (``last``: path ->
    type of its last reported event) so that a consumer's view of which files exist is right.

    A path never reported is compared as a poll would (with ``before``); a reported one only when
    the view is wrong: reported deleted and there now (create), reported there and gone (delete).
    A change after a reported create or change is not repeated: the run's diff shows the content.
    """
    events: list[FileEvent] = []
    for path in sorted(set(before) | set(after) | set(last)):
        kind = last.get(path)
        if kind is None:
            if path not in before and path in after:
                events.append(FileEvent("create", path, now))
            elif path in before and path not in after:
                events.append(FileEvent("delete", path, now))
            elif path in after and before.get(path) != after[path]:
                events.append(FileEvent("change", path, now))
        elif kind == "delete" and path in after:
            events.append(FileEvent("create", path, now))
        elif kind != "delete" and path not in after:
            events.append(FileEvent("delete", path, now))
    return events


class WorkspaceWatcher:
    """Watches a sandbox directory and calls ``on_event`` per change, from a task it owns.

    Native events (``fs.watch``) where the provider has them, else one ``find`` listing per
    interval. Either way a last listing at ``stop`` reports what the live events missed (a
    write in the first moments of a native watch, or after the last poll).
    """

    def __init__(
        self,
        handle: SandboxHandle,
        on_event: Callable[[FileEvent], None],
        *,
        root: str = "/workspace",
        ignore: Sequence[str] = DEFAULT_IGNORE,
        interval: float = POLL_INTERVAL,
        native: bool = True,
        hold: bool = False,
    ) -> None:
        self._handle = handle
        self._on_event = on_event
        self._root = root
        self._ignore = tuple(ignore)
        self._command = find_command(ignore)
        self._interval = interval
        self._native: NativeWatch | None = getattr(handle.fs, "watch", None) if native else None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._state: dict[str, str] | None = None
        self._last: dict[str, str] = {}  # path -> type of the last event reported for it
        self._finished = False
        self._final = False  # the last listing is reporting
        # A successor's watcher (``hold=True``) keeps its live events until ``release``: what it sees
        # must follow the replay's catch-up, and what the log lacks from before it goes first.
        self._held: list[FileEvent] | None = [] if hold else None
        self._start: dict[str, str] = {}
        self._known: tuple[dict[str, str] | None, dict[str, str]] = (None, {})

    @property
    def mode(self) -> Literal["native", "poll"]:
        return "native" if self._native is not None else "poll"

    @property
    def baseline(self) -> dict[str, str]:
        """The listing taken at ``start`` (``path -> "mtime size"``), before anything was watched."""
        return dict(self._start)

    async def start(self, listing: str | None = None) -> WorkspaceWatcher:
        """Take the start listing (or parse ``listing``, an output of ``listing_command`` taken just
        now at the root) and start watching."""
        self._state = parse_listing(listing) if listing is not None else await self._list()
        self._start = dict(self._state)
        self._task = asyncio.ensure_future(self._watch() if self._native is not None else self._poll_loop())
        if self._native is not None:
            # One loop step: the task registers its watch (synchronously, before its first wait),
            # so the agent started next cannot write before the watch sees it.
            await asyncio.sleep(0)
        return self

    async def _list(self) -> dict[str, str]:
        result = await self._handle.process.exec(self._command, ProcessOptions(cwd=self._root))
        return parse_listing(result.stdout)

    def _emit(self, event: FileEvent) -> None:
        if self._finished and not self._final:
            return  # a live event after the last listing: that listing has reported it
        if self._held is not None:
            self._held.append(event)
            return
        self._last[event.path] = event.type
        self._on_event(event)

    def resume_from(self, baseline: dict[str, str] | None, reported: dict[str, str]) -> None:
        """What a held watcher's ``release`` reports first: a successor's view of the run before it.

        ``baseline``: the first driver's listing before its agent started (``None`` if unknown:
        then this watcher's own start listing, so nothing before it is reported); ``reported``:
        path -> type of the last ``sandbox.file`` event the run's log holds for it.
        """
        self._known = (dict(baseline) if baseline is not None else None, dict(reported))

    @property
    def holding(self) -> bool:
        return self._held is not None

    def release(self) -> None:
        """Report what the log lacks from before this watcher's start, then what it held; live from now on.

        The gap is ``reconcile(baseline, start listing, reported)``: the rule a run's own last
        listing follows, so a taken-over run reports a path exactly as one driver would have
        (a create, change or delete the log never got; a change after a logged create or change
        is not repeated: the run's diff shows the content). Idempotent.
        """
        held, self._held = self._held, None
        if held is None:
            return
        baseline, reported = self._known
        self._last.update(reported)
        gap = reconcile(self._start if baseline is None else baseline, self._start, reported, now_ms())
        for event in [*gap, *held]:
            self._emit(event)

    async def _watch(self) -> None:
        assert self._native is not None
        # An editor's write-and-rename (sed -i, most IDEs) arrives as a create: over a file that
        # existed, it is a change.
        known = set(self._state or ())
        # path -> "mtime size" as of the last event reported for it (or the start listing). One write
        # can reach us as a create and, a debounce window later, a modify: the file is then as it was
        # when the create was reported, and a second event would report one write twice.
        stamps = dict(self._state or {})
        try:
            async for batch in self._native(self._root, self._stopping):
                changes = [c for c in batch if not any(part in self._ignore for part in c.path.split("/"))]
                present = await self._stamps([c.path for c in changes if c.type != "delete"])
                for change in changes:
                    kind = change.type
                    if kind == "create" and change.path in known:
                        kind = "change"
                    if kind == "delete":
                        known.discard(change.path)
                        stamps.pop(change.path, None)
                    else:
                        stamp = present.get(change.path)
                        if kind == "change" and stamp is not None and stamps.get(change.path) == stamp:
                            continue  # nothing changed since the event that reported this file
                        known.add(change.path)
                        if stamp is not None:
                            stamps[change.path] = stamp
                    self._emit(FileEvent(kind, change.path, now_ms()))
        except Exception as exc:  # native watching is a nicety: fall back to polling, never fail the run
            log.warning("native workspace watch failed (%r); polling instead", exc)
            self._native = None
            await self._poll_loop()

    async def _stamps(self, paths: Sequence[str]) -> dict[str, str]:
        """``path -> "mtime size"`` of those of ``paths`` that are files now, in one exec; ``{}`` if it fails."""
        if not paths:
            return {}
        named = " ".join(quote(f"./{path}") for path in dict.fromkeys(paths))
        command = f"find {named} -maxdepth 0 -type f -printf '%T@\\t%s\\t%p\\n' 2>/dev/null; true"
        try:
            result = await self._handle.process.exec(command, ProcessOptions(cwd=self._root))
        except Exception as exc:  # unknown stamps: every event is reported, as without this check
            log.debug("workspace stamp read failed: %r", exc)
            return {}
        return parse_listing(result.stdout)

    @property
    def listing_command(self) -> str:
        """The shell command (run at the root) whose output ``finish`` takes as the last listing."""
        return self._command

    async def poll(self, *, final: bool = False, listing: str | None = None) -> None:
        """One comparison now (with ``listing``, that output of ``listing_command``); after native
        events, the final one reports only what corrects the view they gave (``reconcile``)."""
        try:
            current = parse_listing(listing) if listing is not None else await self._list()
        except Exception as exc:  # the sandbox may be going away; a missed poll is not fatal
            log.debug("workspace poll failed: %r", exc)
            return
        if self._state is not None:
            # Native events may still be in flight at the end: the last listing then settles the
            # view they gave (a poll's state already is the view).
            native_final = final and self._native is not None
            found = (reconcile if native_final else _diff_listings)(self._state, current, self._last, now_ms())
            self._final = final
            try:
                for event in found:
                    self._emit(event)
            finally:
                self._final = False
        self._state = current

    async def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval)
            if not self._stopping.is_set():
                await self.poll()

    async def finish(self, listing: str | None = None) -> None:
        """Stop reporting live events and make the last comparison now; ``stop`` then ends the task.

        ``listing``: the output of ``listing_command`` taken after the agent's end (the run takes
        it in one exec with the diff); without it the watcher lists itself.

        No settling sleep: what the native events have not delivered yet, the last listing finds
        (it is compared with the state before the watch), so the end of a run costs one listing,
        not a fixed wait. Live events arriving after this are dropped, never reported twice.
        """
        if self._finished:
            return
        # A successor whose replay never caught up (its agent had already ended): the gap and the
        # held events go now, ahead of the last listing that compares against them.
        self.release()
        self._finished = True
        self._stopping.set()
        if self._native is None and self._task is not None:
            # A poll in flight must land before the last one (it moves the state compared against);
            # the poll loop wakes on the stop at once, so this costs at most that one listing.
            await self._task
        await self.poll(final=True, listing=listing)

    async def stop(self) -> None:
        """Stop watching after one last comparison (``finish``) and end the watch task; idempotent."""
        await self.finish()
        if self._task is not None:
            # A native watch notices the stop within its step (about 20 ms): not on the run's path
            # when ``finish`` was awaited first.
            task, self._task = self._task, None
            await task


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
