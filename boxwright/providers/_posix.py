"""Host processes for the providers that run commands as children of this process.

Local-process and bubblewrap both start ``argv`` in a new session, so the child
leads its own process group; a kill signals the group (a kill of the ``sh``
wrapper alone leaves the command running: dash does not always ``exec``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal as signals
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from ..errors import ProcessExitedError
from ..sandbox import ExecResult, ProcessOptions, SandboxChannel

_READ_SIZE = 65536
# A consumer that reads slower than the child writes pauses the pump past this many
# buffered bytes; a stream nobody reads never pauses it, so an unread stderr cannot stall.
_HIGH_WATER = 1 << 20
KILL_GRACE = 2.0
KILL_CONFIRM = 5.0


class Logger(Protocol):
    def warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None: ...


def exit_code_of(returncode: int) -> int:
    """A signalled command reports 128 + signal number, never 0."""
    return 128 - returncode if returncode < 0 else returncode


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


async def _wait_group_gone(pgid: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.005
    while group_members(pgid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


class TextStream:
    """A single-consumer async iterator of decoded text fed by a pump task.

    UTF-8 is decoded incrementally: a character split across reads is joined, an
    incomplete tail at EOF becomes exactly one U+FFFD.
    """

    def __init__(self) -> None:
        self._chunks: asyncio.Queue[str | None] = asyncio.Queue()
        self._buffered = 0
        self._started = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._done = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        self._started = True
        chunk = await self._chunks.get()
        if chunk is None:
            self._done = True
            raise StopAsyncIteration
        self._buffered -= len(chunk)
        if self._buffered <= _HIGH_WATER:
            self._drained.set()
        return chunk

    async def feed(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self._chunks.put_nowait(text)
            self._buffered += len(text)
            if self._started and self._buffered > _HIGH_WATER:
                self._drained.clear()
                await self._drained.wait()

    def close(self) -> None:
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._chunks.put_nowait(tail)
        self._chunks.put_nowait(None)


async def _pump(reader: asyncio.StreamReader | None, stream: TextStream) -> None:
    try:
        if reader is not None:
            while data := await reader.read(_READ_SIZE):
                await stream.feed(data)
    except (ConnectionError, OSError):
        pass
    finally:
        stream.close()


class HostStdin:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        writer = self._proc.stdin
        if self._ended or writer is None:
            raise ProcessExitedError(self._proc.pid, "stdin was already ended")
        if self._proc.returncode is not None:
            raise ProcessExitedError(self._proc.pid, f"the process exited with code {self._proc.returncode}")
        try:
            writer.write(data.encode() if isinstance(data, str) else data)
            await writer.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ProcessExitedError(self._proc.pid, "the process closed its stdin") from exc

    async def end(self) -> None:
        if self._ended or self._proc.stdin is None:
            return
        self._ended = True
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
            await self._proc.stdin.wait_closed()


class HostProcess:
    """``SpawnHandle`` over an ``asyncio`` subprocess that leads its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process, logger: Logger | None) -> None:
        self._proc = proc
        self._logger = logger
        self.pid = proc.pid
        self.stdout = TextStream()
        self.stderr = TextStream()
        self.stdin = HostStdin(proc)
        self._pumps = [
            asyncio.ensure_future(_pump(proc.stdout, self.stdout)),
            asyncio.ensure_future(_pump(proc.stderr, self.stderr)),
        ]
        self._exit: asyncio.Future[int] = asyncio.ensure_future(self._await_exit())
        self._kill: asyncio.Task[None] | None = None
        self.killed_by: int | None = None

    async def _await_exit(self) -> int:
        try:
            return exit_code_of(await self._proc.wait())
        except asyncio.CancelledError:
            self._release_without_kill()
            raise

    def _release_without_kill(self) -> None:
        """The loop is shutting down while the child runs (a durable agent must outlive us).

        Closing the asyncio transport would kill the child, and leaving it open makes its
        ``__del__`` raise on the closed loop later, at any point of the program. So: close
        our ends of the pipes now, mark the transport closed, and let the child run on.
        """
        transport = getattr(self._proc, "_transport", None)
        if transport is None or transport.is_closing():
            return
        for protocol in getattr(transport, "_pipes", {}).values():
            pipe = getattr(protocol, "pipe", None)
            if pipe is not None:
                pipe.close()
        transport._closed = True

    @property
    def exited(self) -> bool:
        return self._exit.done()

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def drain(self) -> None:
        """Wait until both pipes closed and every byte reached the streams."""
        await asyncio.gather(*self._pumps)

    async def settle(self, timeout: float = KILL_CONFIRM) -> None:
        """Wait (bounded) for the exit to be reaped, then release the transport and its pipes.

        A transport left open when the loop closes is collected later and raises
        there (even inside an unrelated ``compile``); and a pipe held open by an
        escaped grandchild, or output nobody reads any more, must not hold us.
        """
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._exit), timeout)
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()

    def kill_soon(self, sig: int | None = None) -> asyncio.Task[None]:
        """Start the kill (or join the one under way) and return its task."""
        if self._kill is None:
            self._kill = asyncio.ensure_future(self._kill_group(sig or signals.SIGTERM))
        return self._kill

    async def kill(self, sig: int | None = None) -> None:
        await asyncio.shield(self.kill_soon(sig))

    async def _kill_group(self, sig: int) -> None:
        try:
            await self._signal_group(sig)
        finally:
            await self.settle()

    async def _signal_group(self, sig: int) -> None:
        pgid = self.pid
        if self.exited and not group_members(pgid):
            return
        self.killed_by = sig
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        except OSError as exc:
            self._warn("could not signal the process group; signalling the wrapper alone", exc)
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)
        if await _wait_group_gone(pgid, KILL_GRACE):
            return
        if sig != signals.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signals.SIGKILL)
        if not await _wait_group_gone(pgid, KILL_CONFIRM):
            self._warn("processes survived SIGKILL", None, pids=group_members(pgid))

    def _warn(self, message: str, exc: BaseException | None, **meta: Any) -> None:
        if self._logger is not None:
            if exc is not None:
                meta["error"] = repr(exc)
            self._logger.warn(message, {"pid": self.pid, **meta})


class Launch(Protocol):
    """Turns a command and its options into what to start on the host: argv, host cwd, env."""

    def __call__(
        self, command: str, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[Sequence[str], str | None, Mapping[str, str]]: ...


class HostProcesses:
    """``SandboxProcesses`` for a host-side provider; tracks every process it starts."""

    def __init__(self, launch: Launch, logger: Logger | None) -> None:
        self._launch = launch
        self._logger = logger
        self.live: set[HostProcess] = set()

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> HostProcess:
        opts = opts or ProcessOptions()
        if opts.signal is not None:
            opts.signal.throw_if_aborted()
        argv, cwd, env = self._launch(command, opts.cwd, opts.env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                exc.errno, f"cannot start {argv[0]!r} in {cwd!r}: {exc.strerror}", exc.filename
            ) from exc
        process = HostProcess(proc, self._logger)
        self.live.add(process)
        done = asyncio.gather(process._exit, *process._pumps, return_exceptions=True)
        done.add_done_callback(lambda _: self.live.discard(process))
        if opts.signal is not None:

            def on_abort(_reason: object) -> None:
                process.kill_soon()

            remove = opts.signal.add_listener(on_abort)
            process._exit.add_done_callback(lambda _: remove())
        return process

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        process = await self.spawn(command, opts)
        try:
            await process.stdin.end()
            out, err, code = await asyncio.gather(_collect(process.stdout), _collect(process.stderr), process.wait())
        except asyncio.CancelledError:
            await process.kill()
            raise
        return ExecResult(stdout=out, stderr=err, exit_code=code)

    async def kill_all(self) -> None:
        """Kill every tracked process (TERM, then KILL survivors) and release it; never raises."""
        live = list(self.live)
        if live:
            await asyncio.gather(*(p.kill() for p in live), return_exceptions=True)
            await asyncio.gather(*(p.settle() for p in live), return_exceptions=True)


async def _collect(stream: TextStream) -> str:
    return "".join([chunk async for chunk in stream])


__all__ = [
    "KILL_CONFIRM",
    "KILL_GRACE",
    "HostProcess",
    "HostProcesses",
    "Launch",
    "Logger",
    "TextStream",
    "exit_code_of",
    "group_members",
]


class StdlibLogger:
    """The default ``Logger``: forwards to the standard ``logging`` module."""

    def __init__(self, name: str) -> None:
        import logging

        self._log = logging.getLogger(name)

    def warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None:
        self._log.warning("%s %s", message, dict(meta) if meta else "")


def merged_env(
    base: Mapping[str, str], handle: Mapping[str, str], command: Mapping[str, str] | None, scrub: Sequence[str]
) -> dict[str, str]:
    """base | handle | command, then every ``scrub`` key deleted (absent, not empty; it wins over all)."""
    env = {**base, **handle, **(command or {})}
    for key in scrub:
        env.pop(key, None)
    return env


class HandleEnv:
    """``SandboxEnv``: values merged into every later exec/spawn of one handle."""

    def __init__(self, initial: Mapping[str, str] | None = None) -> None:
        self._values = dict(initial or {})

    def set(self, values: Mapping[str, str]) -> None:
        self._values.update(values)

    def get(self) -> dict[str, str]:
        return dict(self._values)


class LocalPorts:
    """Ports of a sandbox whose network is the host's: reached on the loopback address."""

    async def connect(self, port: int) -> SandboxChannel:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int between 1 and 65535, got {port!r}")
        return SandboxChannel(url=f"http://127.0.0.1:{port}")


def remove_tree_with_retry(path: str, logger: Logger | None, tries: int = 10) -> None:
    """Remove ``path``; retry briefly while a dying child still holds it; other errors raise."""
    import errno
    import shutil
    import time

    busy = (errno.EBUSY, errno.EPERM, errno.EACCES, errno.ENOTEMPTY)
    for attempt in range(1, tries + 1):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in busy:
                raise
            if attempt == tries:
                if logger is not None:
                    logger.warn("sandbox directory still busy; left in place", {"path": path, "error": repr(exc)})
                return
            time.sleep(0.05 * attempt)
