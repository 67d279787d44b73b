"""File-event hooks: the sandbox's own (``define_sandbox(hooks=SandboxHooks(on_file=...))``) and a run's
(``run_agent(file_hooks=[RunFileHooks(...)])``, the seed's chat-middleware ``sandbox`` group).

Each workspace file event calls, in order (coordinator R53): the sandbox's ``on_file``, its typed hook
(``on_file_create`` / ``on_file_change`` / ``on_file_delete``), then each run-scoped group's ``on_file`` and
typed hook, which also get the run's ``FileHookContext``. Hooks may be plain or async functions; one event's
hooks finish before the next event's start, and the run waits for them before its terminal event. A hook
that raises is logged and swallowed: an app's audit hook must not fail the agent's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .watcher import FileEvent

log = logging.getLogger("boxwright.file_hooks")

FileHook = Callable[[FileEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class FileHookContext:
    """What a run-scoped hook knows of the run the event belongs to."""

    run_id: str
    thread_id: str


RunFileHook = Callable[[FileHookContext, FileEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class RunFileHooks:
    """One group of run-scoped file hooks (all optional)."""

    on_file: RunFileHook | None = None
    on_file_create: RunFileHook | None = None
    on_file_change: RunFileHook | None = None
    on_file_delete: RunFileHook | None = None


class _Hooks(Protocol):
    @property
    def on_file(self) -> Callable[..., Any] | None: ...
    @property
    def on_file_create(self) -> Callable[..., Any] | None: ...
    @property
    def on_file_change(self) -> Callable[..., Any] | None: ...
    @property
    def on_file_delete(self) -> Callable[..., Any] | None: ...


def _chain(hooks: _Hooks, kind: str) -> list[Callable[..., Any]]:
    typed = getattr(hooks, f"on_file_{kind}", None)
    return [hook for hook in (hooks.on_file, typed) if hook is not None]


def _any(hooks: _Hooks) -> bool:
    return any(h is not None for h in (hooks.on_file, hooks.on_file_create, hooks.on_file_change, hooks.on_file_delete))


class FileHookDispatcher:
    """Calls the hooks of one run's file events from a task of its own, in event order."""

    def __init__(self, sandbox: _Hooks, runs: Sequence[RunFileHooks], ctx: FileHookContext) -> None:
        self._sandbox = sandbox
        self._runs = [group for group in runs if _any(group)]
        self._ctx = ctx
        self.active = _any(sandbox) or bool(self._runs)
        self._queue: asyncio.Queue[FileEvent] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def push(self, event: FileEvent) -> None:
        """Queue ``event``'s hooks (called from the watcher's synchronous callback)."""
        if not self.active:
            return
        self._queue.put_nowait(event)
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def drain(self) -> None:
        """Wait until the hooks of every event pushed so far have run."""
        if self._task is not None:
            await self._queue.join()

    async def aclose(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                for hook in _chain(self._sandbox, event.type):
                    await _call(hook, event)
                for group in self._runs:
                    for hook in _chain(group, event.type):
                        await _call(hook, self._ctx, event)
            finally:
                self._queue.task_done()


async def _call(hook: Callable[..., Any], *args: Any) -> None:
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        log.warning("file hook %s raised; ignored: %r", getattr(hook, "__qualname__", hook), exc)


__all__ = ["FileHook", "FileHookContext", "FileHookDispatcher", "RunFileHook", "RunFileHooks"]
