"""One long-lived task that pulls an async iterator one item at a time, on demand.

A reader that must race "the next item" against an abort or a timer used to wrap every pull in a
Task of its own. That breaks the iterator it pulls from: each step of an async generator then runs
in another task, so a ContextVar it sets before a ``yield`` is gone after it, and a cancel scope
(``asyncio.timeout``, a TaskGroup) it holds across a ``yield`` belongs to a task that has ended.

``Puller`` runs every step of the iterator, and its close, in one task (its ``run``), and hands
each item over through a plain future: racing that future against an abort future or a timeout
(``asyncio.wait`` on futures) creates no task at all. The consumer owns the task: start it in a
TaskGroup (or create it and await it after ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final, Generic, TypeVar

T = TypeVar("T")


class Ended:
    """The iterator is exhausted (``StopAsyncIteration``), or the puller stopped before it pulled."""


class Failed:
    """The iterator raised ``error``; nothing more is pulled."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


ENDED: Final = Ended()


class Puller(Generic[T]):
    """``next()`` asks for one item; ``run()`` (the one task) pulls it; ``stop()`` ends the task."""

    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        self._requests: asyncio.Queue[asyncio.Future[T | Ended | Failed] | None] = asyncio.Queue()
        self._stopped = False

    def next(self) -> asyncio.Future[T | Ended | Failed]:
        """A future resolved with the next item, ``ENDED`` or ``Failed``; never cancelled by the puller."""
        slot: asyncio.Future[T | Ended | Failed] = asyncio.get_running_loop().create_future()
        if self._stopped:
            slot.set_result(ENDED)
        else:
            self._requests.put_nowait(slot)
        return slot

    def stop(self) -> None:
        """No more pulls: an idle ``run`` closes the iterator and returns. An in-flight pull is
        left to finish; cancel the task to interrupt it (then await the task)."""
        if not self._stopped:
            self._stopped = True
            self._requests.put_nowait(None)

    async def run(self) -> None:
        """The task body: pull on demand until stopped, exhausted or failed, then close the iterator here."""
        slot: asyncio.Future[T | Ended | Failed] | None = None
        try:
            while (slot := await self._requests.get()) is not None:
                try:
                    item: T | Ended | Failed = await anext(self._source)
                except StopAsyncIteration:
                    item = ENDED
                except Exception as exc:
                    item = Failed(exc)
                if not slot.done():
                    slot.set_result(item)
                if isinstance(item, (Ended, Failed)):
                    return
        finally:
            self._stopped = True
            # A cancelled pull still answers its consumer, and so does every request queued after it.
            for pending in (slot, *self._drain()):
                if pending is not None and not pending.done():
                    pending.set_result(ENDED)
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                # Closed in the task that ran every step: a scope held across a yield exits where it began.
                with contextlib.suppress(Exception):
                    await aclose()

    def _drain(self) -> list[asyncio.Future[T | Ended | Failed]]:
        pending: list[asyncio.Future[T | Ended | Failed]] = []
        while not self._requests.empty():
            slot = self._requests.get_nowait()
            if slot is not None:
                pending.append(slot)
        return pending


__all__ = ["ENDED", "Ended", "Failed", "Puller"]
