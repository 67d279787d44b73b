"""Pull an async iterator telling apart the items it has ready now from the ones it must wait for.

``ReadyPuller(source)``: ``await puller.next()`` is the next item, waiting as long as it takes;
``puller.ready()`` is the next item only if ``source`` produces it without suspending (a log
reader handing out the rest of a page it already fetched), else ``NOT_READY``, and the step it
began stays pending for the next ``next()``. A writer uses it to coalesce: take one item, then
what is ready, and write them at once (one socket send for many events, not one each).

Why not a task per pull, or a queue fed by a reader task: a task per event is the cost being
removed, and a reader task reads ahead of a slow client. The step is driven here, in the
caller's task, with the coroutine protocol (``send`` / ``throw``), so the source runs exactly
as it would under ``await`` (its ``asyncio.current_task()``, timeouts and cancellation).

``aclose()`` ends a pending step too (cancelled where it waits, as its task's cancel would), then
closes the source.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Generator
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")

# How long ``aclose`` lets a cancelled pending step unwind when its cleanup awaits.
CLOSE_TIMEOUT_S: Final = 5.0


class NotReady:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_READY"


NOT_READY: Final = NotReady()


@types.coroutine
def _rest_of(step: Generator[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """The rest of ``step``, which already suspended once on ``yielded``: what ``yield from step`` does next."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            step.close()
            raise
        except BaseException as exc:
            try:
                yielded = step.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = step.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


class ReadyPuller(Generic[T]):
    """``next()`` waits for an item; ``ready()`` takes one only if it needs no wait (see the module)."""

    __slots__ = ("_pending", "_source")

    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        # A step ``ready()`` began that suspended: the step and what it suspended on.
        self._pending: tuple[Generator[Any, Any, T], Any] | None = None

    async def next(self) -> T:
        """The next item (``StopAsyncIteration`` at the end), finishing a step ``ready()`` began."""
        pending, self._pending = self._pending, None
        if pending is not None:
            return await _rest_of(*pending)
        return await anext(self._source)

    def ready(self) -> T | NotReady:
        """The next item if the source has it without waiting, else ``NOT_READY``; ``StopAsyncIteration`` at the end."""
        if self._pending is not None:
            return NOT_READY
        step = anext(self._source).__await__()
        try:
            yielded = step.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        self._pending = (step, yielded)
        return NOT_READY

    async def aclose(self) -> None:
        """End a pending step (cancelled where it waits), then close the source."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await _cancel(*pending)
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()


async def _cancel(step: Generator[Any, Any, Any], yielded: Any) -> None:
    """Cancel a pending step where it waits, as cancelling its task would, and let it unwind (bounded).

    Thrown in, not awaited out: the wait may be one only its first task can wake (an ``asyncio.timeout``
    scope of that task), and a generator finalizer closes us in a task of its own.
    """
    try:
        yielded = step.throw(asyncio.CancelledError())
    except (Exception, StopAsyncIteration, asyncio.CancelledError):
        return  # unwound at once: the usual case
    # It awaits on its way out (a cleanup step): let it finish, bounded.
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await _rest_of(step, yielded)
    except (Exception, StopAsyncIteration):
        pass
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # ours: this task is being cancelled
        # The step's own end (the cancel thrown above): done.


__all__ = ["NOT_READY", "NotReady", "ReadyPuller"]
