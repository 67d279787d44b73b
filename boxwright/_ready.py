"""Read an async iterator ahead, in a task of its own, so a writer can take what is ready without waiting.

``async with ReadAhead(source, limit) as ahead:`` a task, owned by the block, pulls ``source``
into a queue of at most ``limit`` items;
``await ahead.next()`` is the next item, waiting as long as it takes; ``ahead.ready()`` is the
next item if one is queued, else ``NOT_READY``. A writer uses it to coalesce: take one item,
then what is ready, and write them at once (one socket send for many events, not one each).
Leaving the block (or ``aclose()``) cancels the task and waits for it; the source is closed with it.

Why a task, and not stepping the source in the writer's task until it would suspend: a source
suspends inside its own I/O too (a log reader in the middle of a store query, holding the
store's connection), and a step left pending there while the writer waits on a client that
never reads holds that connection for good: every other reader and writer of the store hangs
(measured: a stuck SSE tailer stopped a run). Here the source always runs on, in its own task,
and waits only at its ``yield`` when the queue is full, holding nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

T = TypeVar("T")


class NotReady:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_READY"


NOT_READY: Final = NotReady()


@dataclass(frozen=True)
class _End:
    error: Exception | None = None


class ReadAhead(Generic[T]):
    """``next()`` waits for an item; ``ready()`` takes one only if it is queued already (see the module)."""

    def __init__(self, source: AsyncIterator[T], limit: int, *, name: str = "boxwright read-ahead") -> None:
        self._queue: asyncio.Queue[T | _End] = asyncio.Queue(max(limit, 1))
        self._end: _End | None = None
        self._task = asyncio.get_running_loop().create_task(self._pump(source), name=name)

    async def __aenter__(self) -> ReadAhead[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _pump(self, source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await self._queue.put(item)
        except Exception as exc:
            await self._queue.put(_End(exc))
        else:
            await self._queue.put(_End())
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    def _ended(self, end: _End) -> T:
        self._end = end
        if end.error is not None:
            raise end.error
        raise StopAsyncIteration

    async def next(self) -> T:
        """The next item; ``StopAsyncIteration`` at the end; the source's error where it failed."""
        if self._end is not None:
            return self._ended(self._end)
        item = await self._queue.get()
        return self._ended(item) if isinstance(item, _End) else item

    def ready(self) -> T | NotReady:
        """The next item if it is queued, else ``NOT_READY``; the end and errors as ``next()`` gives them."""
        if self._end is not None:
            return self._ended(self._end)
        try:
            item = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return NOT_READY
        return self._ended(item) if isinstance(item, _End) else item

    async def aclose(self) -> None:
        """Stop reading ahead: cancel the task (wherever the source waits) and wait for it and the source to end."""
        self._task.cancel()
        await asyncio.wait({self._task})  # never cancels the caller's task; its own cancel propagates
        if not self._task.cancelled():
            # Retrieved, so it is never reported as lost: a source that failed to close ends with the stream.
            self._task.exception()


__all__ = ["NOT_READY", "NotReady", "ReadAhead"]
