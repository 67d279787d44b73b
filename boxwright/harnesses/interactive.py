"""A harness that talks back to its agent while it runs: the one extension of the line-translator contract.

The base contract (``base``) is "plan a command, translate its stdout lines", with the prompt
written to stdin once and stdin closed. A protocol agent (ACP over stdio JSON-RPC) needs more:
it asks us things mid-run (permissions, file reads) and must be answered on its stdin, it does
not exit when stdin closes, and a cancel is a message before it is a kill.

So a translator may also be ``Interactive``: ``run_agent`` then hands it an ``AgentChannel``
instead of writing ``plan.stdin``, and it keeps using ``feed``/``finish`` for the agent's lines.
The channel owns its tasks (closed by ``run_agent`` when the agent exits, and in teardown), so
nothing the translator starts outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

from ..abort import AbortSignal
from ..events import Event
from ..sandbox import SandboxHandle, StdinWriter

log = logging.getLogger("boxwright.harnesses.interactive")

# After a cancel was sent, how long the agent may take to wind down before it is killed.
CANCEL_GRACE = 2.0


@runtime_checkable
class Interactive(Protocol):
    def attach(self, channel: AgentChannel) -> None: ...
    def on_abort(self) -> None: ...


@runtime_checkable
class Resumable(Protocol):
    """An interactive translator that can join a conversation another host began (``harnesses/relay.py``)."""

    def resume(self, sent: list[str]) -> None: ...


class AgentProcess(Protocol):
    """What the channel needs of the agent: a spawned process, or a relayed one (``harnesses/relay.py``)."""

    @property
    def stdin(self) -> StdinWriter: ...

    async def wait(self) -> int: ...
    async def kill(self, sig: int | None = None) -> None: ...


class AgentChannel:
    """The running agent, as an interactive translator sees it: its stdin, the sandbox, the run's event queue."""

    def __init__(
        self,
        process: AgentProcess,
        handle: SandboxHandle,
        cwd: str,
        emit: Callable[[list[Event]], None],
        signal: AbortSignal | None = None,
        cancel_grace: float = CANCEL_GRACE,
    ) -> None:
        self.process = process
        self.handle = handle
        self.cwd = cwd
        self._emit = emit
        self._signal = signal
        self._grace = cancel_grace
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[Any]] = []
        self._ended = False
        self._remove_listener: Callable[[], None] | None = None
        self.spawn(self._writer())

    def listen(self, translator: Interactive, only: Callable[[object], bool] | None = None) -> None:
        """Abort -> ``translator.on_abort()`` (a protocol cancel), then a kill after the grace period.

        ``only``: which abort reasons count (a journaled agent outlives every abort but a cancel).
        """
        if self._signal is None:
            return

        def aborted(reason: object) -> None:
            if only is not None and not only(reason):
                return
            with contextlib.suppress(Exception):
                translator.on_abort()
            self.spawn(self._kill_after(self._grace))

        self._remove_listener = self._signal.add_listener(aborted)

    def send(self, text: str) -> None:
        """Queue one line for the agent's stdin (a newline is added); lines go out in order."""
        if not self._ended:
            self._outbox.put_nowait(text if text.endswith("\n") else text + "\n")

    def emit(self, events: list[Event]) -> None:
        """Events produced outside ``feed`` (a handshake failure, say): into the run's stream, in order."""
        if events:
            self._emit(events)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` for the channel's lifetime; an error it raises is logged, never lost silently."""
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(_log_failure)
        self._tasks.append(task)

    def end(self, grace: float = 0.0) -> None:
        """The conversation is over: close stdin and stop the agent (protocol agents do not exit on EOF).

        ``grace``: how long it may take to wind down first (after a cancel it is still stopping its tools).
        """
        if self._ended:
            return
        self._ended = True
        self._outbox.put_nowait(None)
        self.spawn(self._kill_after(grace))

    async def _writer(self) -> None:
        while (line := await self._outbox.get()) is not None:
            try:
                await self.process.stdin.write(line)
            except Exception:  # the agent is gone: what it did not read, it cannot answer
                return
        with contextlib.suppress(Exception):
            await self.process.stdin.end()

    async def _kill_after(self, seconds: float) -> None:
        if seconds:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(self.process.wait())), seconds)
                return
        with contextlib.suppress(Exception):
            await self.process.kill()

    async def close(self) -> None:
        """Cancel and await everything the channel started. Idempotent."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("interactive harness task failed: %s", task.exception())
