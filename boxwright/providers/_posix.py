"""Host processes for the providers that run commands as children of this process.

Local-process and bubblewrap both start ``argv`` in a new session, so the child
leads its own process group; a kill signals the group (a kill of the ``sh``
wrapper alone leaves the command running: dash does not always ``exec``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import functools
import os
import signal as signals
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

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


async def end_group(pgid: int, sig: int, logger: Logger | None, fallback: Callable[[int], None] | None = None) -> None:
    """Signal group ``pgid`` with ``sig``, then SIGKILL what is left after ``KILL_GRACE``; never raises.

    ``fallback`` signals the leader alone when the group cannot be signalled (only our own child has one).
    """
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return
    except OSError as exc:
        _warn(logger, "could not signal the process group; signalling the wrapper alone", pgid, error=repr(exc))
        if fallback is None:
            return
        with contextlib.suppress(ProcessLookupError):
            fallback(sig)
    if await _wait_group_gone(pgid, KILL_GRACE):
        return
    if sig != signals.SIGKILL:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signals.SIGKILL)
    if not await _wait_group_gone(pgid, KILL_CONFIRM):
        _warn(logger, "processes survived SIGKILL", pgid, pids=group_members(pgid))


def _warn(logger: Logger | None, message: str, pid: int, **meta: Any) -> None:
    if logger is not None:
        logger.warn(message, {"pid": pid, **meta})


def start_time_of(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22); None if it is gone.

    With the pid, it names one exact process: a recycled pid starts later.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class RecordedGroup(msgspec.Struct, frozen=True):
    """One process group a handle spawned: its leader's pid (the pgid) and that leader's identity."""

    pgid: int
    start: int  # the leader's start time (``start_time_of``)
    boot: str  # the boot it started in: after a reboot every recorded group is gone


def recorded_group(pid: int) -> RecordedGroup | None:
    """The record of the group ``pid`` leads, or None where this system cannot say which process it is."""
    start = start_time_of(pid)
    return None if start is None else RecordedGroup(pid, start, _boot_id())


# Polled, not blocked on: a blocking flock in a thread cannot be given up when the waiter is cancelled.
_LOCK_POLL = 0.01
# A destroy waits this long for spawns in flight (a spawn holds the lock for milliseconds).
_SWEEP_LOCK_WAIT = 10.0
# A spawn waits this long for a destroy's kill (at most KILL_GRACE + KILL_CONFIRM per group, all at once).
_SPAWN_LOCK_WAIT = 30.0


class ProcessRecord:
    """The process groups a sandbox's handles spawned, in a directory of the sandbox's state, one file each.

    A durable agent outlives the host that spawned it, and a successor's handle (or the provider's destroy
    by id) did not spawn it: this record is how they find it to kill. A spawn holds a shared ``flock`` from
    before the fork until its entry is written, a sweep an exclusive one, so a sweep never misses a spawn in
    flight, in this process or another; a SIGKILLed holder's lock goes with it. An entry is dropped when its
    group is seen gone; a pid recycled since (its start time differs) is never signalled.
    """

    LOCK = ".lock"

    def __init__(self, directory: str, logger: Logger | None) -> None:
        self.directory = directory
        self._logger = logger

    def prepare(self) -> None:
        """Create the directory (its parent is the sandbox's private state dir)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    def _path(self, pgid: int) -> str:
        return os.path.join(self.directory, f"{pgid}.json")

    @contextlib.asynccontextmanager
    async def _locked(self, mode: int, wait: float, purpose: str) -> AsyncIterator[None]:
        try:
            fd = os.open(os.path.join(self.directory, self.LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            fd = -1  # no record directory: the sandbox is destroyed (or predates the record); nothing to order
        if fd < 0:
            yield
            return
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if loop.time() >= deadline:
                        _warn(self._logger, f"process record stayed locked; {purpose} without it", os.getpid())
                        break
                    await asyncio.sleep(_LOCK_POLL)
            yield
        finally:
            os.close(fd)  # releases the lock

    def spawning(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held from before a spawn until its entry is written (shared: spawns do not wait for each other)."""
        return self._locked(fcntl.LOCK_SH, _SPAWN_LOCK_WAIT, "spawning")

    def write(self, entry: RecordedGroup) -> None:
        """Record ``entry`` (atomically: a reader never sees half of it); a missing directory records nothing."""
        staging = f"{self._path(entry.pgid)}.{os.getpid()}.tmp"
        try:
            with open(staging, "wb") as f:
                f.write(msgspec.json.encode(entry))
            os.replace(staging, self._path(entry.pgid))
        except FileNotFoundError:
            return

    def add(self, pid: int) -> RecordedGroup | None:
        entry = recorded_group(pid)
        if entry is not None:
            self.write(entry)
        return entry

    def entries(self) -> list[RecordedGroup]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.directory, name), "rb") as f:
                    found.append(msgspec.json.decode(f.read(), type=RecordedGroup))
            except (OSError, msgspec.DecodeError):
                continue  # dropped meanwhile, or not ours to read
        return found

    def drop(self, entry: RecordedGroup) -> None:
        """Remove ``entry``, unless the file now records another process under the same pid."""
        path = self._path(entry.pgid)
        try:
            with open(path, "rb") as f:
                if msgspec.json.decode(f.read(), type=RecordedGroup) != entry:
                    return
            os.unlink(path)
        except (OSError, msgspec.DecodeError):
            return

    def drop_if_gone(self, entry: RecordedGroup) -> None:
        """The leader exited: drop its entry once no process of the group is left (a backgrounded one keeps it)."""
        try:
            os.killpg(entry.pgid, 0)
        except ProcessLookupError:
            self.drop(entry)
        except OSError:
            return

    def _still_ours(self, entry: RecordedGroup) -> bool:
        if entry.boot != _boot_id():
            return False
        start = start_time_of(entry.pgid)
        if start is not None:
            return start == entry.start
        # The leader is gone but its group may live on (a pgid is not reused while its group exists); a
        # member that started before our leader belongs to some other group that took the number later.
        members = group_members(entry.pgid)
        return bool(members) and all((start_time_of(pid) or entry.start) >= entry.start for pid in members)

    def sweeping(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while killing (exclusive): every spawn begun before has written its entry, none starts meanwhile."""
        return self._locked(fcntl.LOCK_EX, _SWEEP_LOCK_WAIT, "killing")

    async def kill_all(self, sig: int = signals.SIGTERM) -> None:
        """End every recorded group that is still the process we spawned (``sig``, then SIGKILL); never raises."""
        async with self.sweeping():
            await self.kill_recorded(sig)

    async def kill_recorded(self, sig: int = signals.SIGTERM, spare: frozenset[int] = frozenset()) -> None:
        """``kill_all`` for a caller that holds ``sweeping``; ``spare``: pgids it kills (and reaps) itself."""
        ours = []
        for entry in self.entries():
            if entry.pgid in spare:
                continue
            if self._still_ours(entry):
                ours.append(entry)
            else:
                self.drop(entry)
        await asyncio.gather(*(end_group(e.pgid, sig, self._logger) for e in ours), return_exceptions=True)
        for entry in ours:
            if not group_members(entry.pgid):
                self.drop(entry)


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
        # Its entry in the sandbox's ``ProcessRecord`` (set by the spawner), dropped when its group is gone.
        self.recorded: RecordedGroup | None = None

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
        if self.exited and not group_members(self.pid):
            return
        self.killed_by = sig
        await end_group(self.pid, sig, self._logger, fallback=self._proc.send_signal)


class Launch(Protocol):
    """Turns a command and its options into what to start on the host: argv, host cwd, env."""

    def __call__(
        self, command: str, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[Sequence[str], str | None, Mapping[str, str]]: ...


class HostProcesses:
    """``SandboxProcesses`` for a host-side provider; tracks every process it starts."""

    def __init__(self, launch: Launch, logger: Logger | None, record: ProcessRecord | None = None) -> None:
        self._launch = launch
        self._logger = logger
        self.live: set[HostProcess] = set()
        # Where the groups this handle spawns are written down, for a handle or destroy that did not spawn them.
        self.record = record

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> HostProcess:
        opts = opts or ProcessOptions()
        if opts.signal is not None:
            opts.signal.throw_if_aborted()
        argv, cwd, env = self._launch(command, opts.cwd, opts.env)
        async with self.record.spawning() if self.record is not None else contextlib.nullcontext():
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
            # Under the spawn lock and before any await: a sweep sees this process in ``live`` or the record.
            process = HostProcess(proc, self._logger)
            self.live.add(process)
            if self.record is not None:
                process.recorded = self.record.add(proc.pid)
        done = asyncio.gather(process._exit, *process._pumps, return_exceptions=True)
        done.add_done_callback(lambda _: self._ended(process))
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

    def _ended(self, process: HostProcess) -> None:
        self.live.discard(process)
        if self.record is not None and process.recorded is not None:
            self.record.drop_if_gone(process.recorded)

    async def kill_all(self) -> None:
        """Kill every tracked process and every recorded group still alive (TERM, then KILL); never raises.

        The record holds what other handles of the sandbox spawned: a dead host's durable agent among them.
        """
        if self.record is None:
            await self._kill_live(list(self.live))
            return
        async with self.record.sweeping():
            live = list(self.live)
            spare = frozenset(p.pid for p in live)
            await asyncio.gather(self._kill_live(live), self.record.kill_recorded(spare=spare), return_exceptions=True)
            for process in live:
                if process.recorded is not None:
                    self.record.drop_if_gone(process.recorded)

    @staticmethod
    async def _kill_live(live: list[HostProcess]) -> None:
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
    "ProcessRecord",
    "RecordedGroup",
    "TextStream",
    "end_group",
    "exit_code_of",
    "group_members",
    "recorded_group",
    "start_time_of",
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
