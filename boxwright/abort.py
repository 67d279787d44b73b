"""A small AbortController / AbortSignal, as the TypeScript original passes around.

asyncio cancellation covers the task that awaits; a signal also reaches work that
no task of ours awaits (a spawned process, a journal reader in another task) and
carries a reason, such as ``boxwright:cancel-requested``. Listeners are plain
callables run synchronously at abort time; one that needs to await schedules a
task it owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from .errors import AbortError

Listener = Callable[[object], None]


class AbortSignal:
    __slots__ = ("_aborted", "_listeners", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: object = None
        self._listeners: list[Listener] = []

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def reason(self) -> object:
        return self._reason

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(reason)`` on abort (at once if already aborted); returns a remover."""
        if self._aborted:
            listener(self._reason)
            return lambda: None
        self._listeners.append(listener)

        def remove() -> None:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass

        return remove

    def throw_if_aborted(self) -> None:
        if self._aborted:
            raise AbortError(self._reason)

    async def wait(self) -> object:
        """Return the reason once aborted."""
        if self._aborted:
            return self._reason
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def done(reason: object) -> None:
            if not fut.done():
                fut.set_result(reason)

        remove = self.add_listener(done)
        try:
            return await fut
        finally:
            remove()

    def _abort(self, reason: object) -> None:
        if self._aborted:
            return
        self._aborted = True
        self._reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)

    @staticmethod
    def any(signals: Iterable[AbortSignal | None]) -> AbortSignal:
        """A signal that aborts when the first of ``signals`` does."""
        controller = AbortController()
        for signal in signals:
            if signal is not None:
                signal.add_listener(controller.abort)
        return controller.signal

    @staticmethod
    def timeout(seconds: float) -> AbortSignal:
        """A signal that aborts after ``seconds`` (needs a running loop)."""
        controller = AbortController()
        asyncio.get_running_loop().call_later(seconds, controller.abort, TimeoutError(f"timed out after {seconds}s"))
        return controller.signal


class AbortController:
    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: object = "aborted") -> None:
        self.signal._abort(reason)


async def wait_unless_aborted(work: Awaitable[object], signal: AbortSignal) -> None:
    """Await ``work`` in this task until it ends or ``signal`` aborts (then it is cancelled, quietly).

    The abort cancels through a cancel scope (``asyncio.timeout`` rescheduled to now): no task per
    wait, and ``work`` keeps the caller's task, its ContextVars and its scopes.
    """
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:
            remove = signal.add_listener(lambda _reason: scope.reschedule(loop.time()))
            try:
                await work
            finally:
                remove()
    except TimeoutError:
        if not signal.aborted:
            raise  # not our scope's: the work itself timed out


async def sleep_unless_aborted(seconds: float, signal: AbortSignal | None) -> None:
    """Sleep ``seconds``, or until ``signal`` aborts (quietly): a poll's pause that a stop cuts short."""
    if seconds <= 0:
        return
    if signal is None:
        await asyncio.sleep(seconds)
        return
    await wait_unless_aborted(asyncio.sleep(seconds), signal)
