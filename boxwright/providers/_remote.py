"""Pieces the cloud providers (E2B, Daytona, ...) share: the importer of a vendor SDK (an
optional extra), a create that leaves nothing behind when aborted, the env export lines, a
text stream fed with decoded text, the workspace path mapping, an exec-backed file system,
the process handle and its tracking set (Docker's processes use them too), the group-kill
script, and the ownership metadata and ``Reapable`` listing a reaper looks for.

A cloud SDK hands over output already decoded (its own incremental UTF-8 decoder), so
these streams take ``str``; the exec-backed fs runs small ``sh -c`` scripts whose values
travel as positional arguments, never spliced into the script text.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, runtime_checkable

import msgspec

from ..abort import AbortSignal
from ..errors import AbortError, ProviderUnavailableError, SandboxCommandError, UnsupportedCapabilityError
from ..sandbox import (
    WORKSPACE,
    DestroyInput,
    ExecResult,
    FsEntry,
    FsStat,
    NativeWatch,
    ProcessOptions,
    SandboxChannel,
    SpawnHandle,
)
from ..shell import join, quote

LABEL_MANAGED = "boxwright.managed"
LABEL_OWNER = "boxwright.owner"
LABEL_SANDBOX = "boxwright.sandbox"
LABEL_RUN = "boxwright.run"
LABEL_LEASE = "boxwright.lease-expires"
DEFAULT_LEASE = 6 * 3600.0
MISSING = "__boxwright_missing__"
NO_PID = "__boxwright_kill_no_pid__"
SURVIVED = "__boxwright_kill_survived__"
_WRITE_CHUNK = 48 * 1024
# How long a kill waits for the remote exit it caused before it says the command may still run.
KILL_CONFIRM = 10.0


def import_sdk(provider: str, module: str, distribution: str, extra: str) -> Any:
    """The vendor SDK ``module`` of ``provider``, imported at first use: an optional dependency.

    Only the provider's own module names its SDK (the SDK is behind the extra ``extra``, its
    PyPI name ``distribution``), so importing boxwright never needs it; without it the provider
    says which package is missing and the ``pip install`` that brings it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # the extra is optional
        raise ProviderUnavailableError(
            provider, f"the `{distribution}` Python package is not installed", f"pip install 'boxwright[{extra}]'"
        ) from exc


def owner_id() -> str:
    """This host's name in the owner metadata: reaping by owner stays per host."""
    return socket.gethostname()


def ownership(
    key: str | None, run: str | None, lease_seconds: float, extra: Mapping[str, str] | None
) -> dict[str, str]:
    """The metadata/labels every remote sandbox carries, so ``boxwright reap`` can find a leaked one."""
    labels = {
        **(extra or {}),
        LABEL_MANAGED: "1",
        LABEL_OWNER: owner_id(),
        LABEL_LEASE: f"{time.time() + lease_seconds:.0f}",
    }
    if key:
        labels[LABEL_SANDBOX] = key
    if run:
        labels[LABEL_RUN] = run
    return labels


def lease_expiry(value: str | None) -> float | None:
    """The epoch seconds a ``LABEL_LEASE`` value says; None when absent or not a number (never "expired")."""
    try:
        return float(value) if value else None
    except ValueError:
        return None


class OwnedSandbox(msgspec.Struct, frozen=True, kw_only=True):
    """One of this host's boxwright sandboxes at a provider, as ``list_owned`` finds it.

    ``lease_expires`` is the epoch second its ownership lease ends (``LABEL_LEASE``), None where
    the vendor stores no labels to hold it (Railway): a reaper keeps those for a person to decide.
    """

    id: str
    lease_expires: float | None = None


@runtime_checkable
class Reapable(Protocol):
    """A provider whose leaked sandboxes ``boxwright reap`` can find and destroy.

    ``list_owned`` returns this host's boxwright-owned sandboxes (managed and owner labels, then
    every pair of ``labels`` too), every page, none already being torn down.
    """

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]: ...
    async def destroy(self, input: DestroyInput) -> None: ...


def owned(sandbox_id: str, labels: Mapping[str, str]) -> OwnedSandbox:
    return OwnedSandbox(id=sandbox_id, lease_expires=lease_expiry(labels.get(LABEL_LEASE)))


def vm_name(key: str | None, limit: int = 63) -> str:
    """A vendor name for a sandbox key: ``bw-`` and the key's lowercase letters, digits and single hyphens.

    No key gives a random name. ``limit`` is the vendor's longest name (63: a DNS label).
    """
    if not key:
        return f"bw-{uuid.uuid4().hex[:16]}"
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", key.lower())).strip("-")
    return f"bw-{name}"[:limit].rstrip("-")


def export_lines(values: Mapping[str, str]) -> str:
    """``export K='v'`` lines a shell sources or evals: values quoted, keys checked (a key is script text)."""
    lines = []
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"not an environment variable name: {key!r}")
        lines.append(f"export {key}={quote(value)}")
    return "\n".join(lines)


def env_line(values: Mapping[str, str]) -> bytes:
    """A loader's stdin: ``export_lines``, base64 on one line.

    For a vendor whose per-command env would travel where logs keep it (a URL's query): the
    command's stdin carries it instead, and ``eval`` of the decoded line exports it.
    """
    return base64.b64encode(export_lines(values).encode()) + b"\n"


H = TypeVar("H")
# How long a failed create waits for the vendor's create call to answer before it deletes the sandbox.
CREATE_ANSWER = 120.0


async def abortable_create(
    creating: Awaitable[Any],
    signal: AbortSignal | None,
    ready: Callable[[Any], Awaitable[H]],
    delete: Callable[[Any], Awaitable[None]],
    answer_within: float = CREATE_ANSWER,
) -> H:
    """A create that leaves no sandbox behind when it is aborted, cancelled or fails.

    ``creating`` is the vendor's create call; an abort before it answers raises at once. ``ready``
    turns its answer into the handle (and prepares it); an abort by then raises too. On any
    failure ``delete`` runs once the create call answered, with its answer (the sandbox may exist
    by then), or with None when it failed or gave none within ``answer_within`` seconds: then the
    sandbox, if any, is known only by what the create named or labelled it.
    """
    created = asyncio.ensure_future(creating)
    aborted = asyncio.ensure_future(signal.wait()) if signal is not None else None
    try:
        waiting: set[asyncio.Future[Any]] = {created} if aborted is None else {created, aborted}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if aborted is not None and aborted.done() and not created.done():
            raise AbortError(signal.reason if signal is not None else None)
        handle = await ready(await created)
        if signal is not None:
            signal.throw_if_aborted()
        return handle
    except BaseException:
        await asyncio.shield(_delete_created(created, delete, answer_within))
        raise
    finally:
        if aborted is not None:
            aborted.cancel()


async def _delete_created(
    created: asyncio.Future[Any], delete: Callable[[Any], Awaitable[None]], answer_within: float
) -> None:
    answer = None
    with contextlib.suppress(BaseException):
        answer = await asyncio.wait_for(asyncio.shield(created), answer_within)
    with contextlib.suppress(Exception):
        await delete(answer)


async def make_workdir(plain: Callable[[str], Awaitable[ExecResult]], workdir: str) -> None:
    """Create the workdir in a new sandbox (a helper command); a failure is the create's."""
    made = await plain(script("create", 'mkdir -p -- "$1"', workdir))
    if made.exit_code != 0:
        raise SandboxCommandError("create", made.exit_code, made.stderr.strip())


def map_path(path: str, workdir: str) -> str:
    """``/workspace[/x]`` is ``workdir[/x]``; a relative path is under it; other absolute paths are the VM's own."""
    if "\x00" in path:
        raise ValueError(f"a path cannot contain a NUL byte: {path!r}")
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return workdir + path[len(WORKSPACE) :]
    if not path.startswith("/"):
        return f"{workdir}/{path}" if path else workdir
    return path


def check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be an int between 1 and 65535, got {port!r}")


class TextChannel:
    """A single-consumer async iterator of text chunks that a callback feeds (SDK output handlers)."""

    def __init__(self) -> None:
        self._chunks: asyncio.Queue[str | None] = asyncio.Queue()
        self._closed = False
        self._done = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        chunk = await self._chunks.get()
        if chunk is None:
            self._done = True
            raise StopAsyncIteration
        return chunk

    def feed(self, text: str) -> None:
        if text and not self._closed:
            self._chunks.put_nowait(text)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._chunks.put_nowait(None)


async def collect(stream: AsyncIterator[str]) -> str:
    return "".join([chunk async for chunk in stream])


# The wrapper every spawned command runs in, as the leader of its own session and group
# (started by `setsid`): $1 is the pid file, $2 the command. Its pid is the group id, recorded
# from inside because `setsid` forks when its caller already leads a group (then the SDK's pid
# is not the group's). A normal end removes the record; after a kill the kill script does.
WRAPPER = 'echo $$ > "$1" || exit 125; sh -c "$2"; c=$?; rm -f "$1"; exit $c'

# $1 pid file, $2 signal. Waits for the record (a kill may come before the wrapper ran), signals
# the group, KILLs what is left, and says when something survived or no pid was recorded.
KILL_SCRIPT = r"""F="$1"; S="$2"; i=0
while [ ! -s "$F" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
if [ ! -s "$F" ]; then echo __boxwright_kill_no_pid__ >&2; rm -f "$F"; exit 0; fi
p=$(cat "$F")
alive() { ps -eo pgid=,stat= | while read g s; do
  [ "$g" = "$p" ] && case "$s" in Z*) ;; *) echo y; break;; esac; done; }
kill -"$S" -"$p" 2>/dev/null || kill -"$S" "$p" 2>/dev/null
i=0; while [ -n "$(alive)" ] && [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done
if [ -n "$(alive)" ]; then
  kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
  i=0; while [ -n "$(alive)" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
fi
[ -n "$(alive)" ] && echo __boxwright_kill_survived__ >&2
rm -f "$F"; exit 0"""


# -- processes -----------------------------------------------------------------------------------


class NoStdin:
    """The stdin of a provider that cannot write to a running command (``writable_stdin`` false)."""

    def __init__(self, provider: str) -> None:
        self._provider = provider

    async def write(self, data: str | bytes) -> None:
        raise UnsupportedCapabilityError(self._provider, "writable_stdin", "write the prompt to a file and redirect it")

    async def end(self) -> None:
        return None


def _retrieve(future: asyncio.Future[Any]) -> None:
    # An exit nobody waits for (a spawned server) must not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


class RemoteProcess:
    """The ``SpawnHandle`` lifecycle every cloud provider shares; a subclass says how it ends and how it dies.

    The subclass calls ``watch(exit)`` with what resolves to the exit code (its output pump, the
    SDK's wait) and writes ``_do_kill(sig)``, the vendor's kill. ``wait`` and ``kill`` are
    shielded: a caller cancelled while it waits (an aborted ``exec``) leaves the exit and the
    kill running, and a second ``kill`` joins the first instead of signalling twice.
    """

    pid: int = -1  # most remote APIs report no pid of the command's own
    _exit: asyncio.Future[int]
    _kill: asyncio.Task[None] | None = None

    def watch(self, exit: Awaitable[int]) -> None:
        self._exit = asyncio.ensure_future(exit)
        self._exit.add_done_callback(_retrieve)

    @property
    def exited(self) -> bool:
        return self._exit.done()

    def on_exit(self, callback: Callable[[], object]) -> None:
        self._exit.add_done_callback(lambda _: callback())

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def kill_soon(self, sig: int | None = None) -> asyncio.Task[None]:
        if self._kill is None:
            self._kill = asyncio.ensure_future(self._do_kill(sig))
        return self._kill

    async def kill(self, sig: int | None = None) -> None:
        await asyncio.shield(self.kill_soon(sig))

    async def _do_kill(self, sig: int | None) -> None:
        raise NotImplementedError

    async def confirm_exit(self, timeout: float = KILL_CONFIRM) -> None:
        """Wait up to ``timeout`` for the exit a kill caused; whatever the exit raises is the waiter's, not ours."""
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self._exit), timeout)


class ScriptHost(Protocol):
    """What the group kill needs of a handle: a plain helper command and the provider's logger."""

    async def plain(self, line: str) -> ExecResult: ...
    def warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None: ...


class GroupProcess(RemoteProcess):
    """A command started under ``WRAPPER``: its kill runs ``KILL_SCRIPT`` on the group its pid file records.

    ``kill_signal`` is the first signal (the script KILLs what survives it); ``after_kill`` is
    the vendor's last resort when no exit came (close the stream, end the host CLI).
    """

    kill_signal = "TERM"

    def __init__(self, host: ScriptHost, pid_file: str | None) -> None:
        self._host = host
        self._pid_file = pid_file

    async def _do_kill(self, sig: int | None) -> None:
        if self.exited or self._pid_file is None:
            return
        await kill_group(self._host, self._pid_file, self.kill_signal, lambda: self.exited)
        await self.confirm_exit()
        if not self.exited:
            await self.after_kill()

    async def after_kill(self) -> None:
        return None


async def kill_group(host: ScriptHost, pid_file: str, signal: str, exited: Callable[[], bool]) -> None:
    """Run the kill script on ``pid_file``'s group; say what survived or was never recorded."""
    try:
        result = await host.plain(script("kill", KILL_SCRIPT, pid_file, signal))
    except Exception as exc:  # a gone VM: its processes went with it
        if not exited():
            host.warn("could not run the kill script", {"error": repr(exc)})
        return
    if SURVIVED in result.stderr:
        host.warn("processes survived SIGKILL", {"pidFile": pid_file})
    elif NO_PID in result.stderr and not exited():
        host.warn("the process recorded no pid; it may still run", {"pidFile": pid_file})


P = TypeVar("P", bound=RemoteProcess)


class ProcessSet(Generic[P]):
    """The live processes of one handle: tracked until they exit, killed by an abort, all killed at destroy."""

    def __init__(self) -> None:
        self.live: set[P] = set()

    @staticmethod
    def started(opts: ProcessOptions | None) -> ProcessOptions:
        """A spawn's options (the defaults for None), an already aborted signal refused before anything starts."""
        opts = opts or ProcessOptions()
        if opts.signal is not None:
            opts.signal.throw_if_aborted()
        return opts

    def track(self, process: P, signal: AbortSignal | None, abort_sig: int | None = None) -> P:
        """Keep ``process`` until it exits; ``signal`` aborting kills it (with ``abort_sig``)."""
        self.live.add(process)
        process.on_exit(lambda: self.live.discard(process))
        if signal is not None:

            def on_abort(_reason: object) -> None:
                process.kill_soon(abort_sig)

            process.on_exit(signal.add_listener(on_abort))
        return process

    async def kill_all(self, sig: int | None = None) -> None:
        live = list(self.live)
        if live:
            await asyncio.gather(*(p.kill(sig) for p in live), return_exceptions=True)


class SpawnSet(ProcessSet[P]):
    """The process API of a handle whose ``exec`` is its ``spawn`` run to the end (``exec_result``).

    A subclass writes ``spawn``; it starts with ``started(opts)``: the options, an aborted signal refused.
    ``end_stdin``: ``exec`` ends the command's stdin first (a vendor whose stream stays open until then).
    """

    end_stdin = False

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self._handle = handle

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> P:
        raise NotImplementedError

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        # A spawned process is a SpawnHandle too (its streams set in __init__); P's bound says only RemoteProcess.
        return await exec_result(cast(SpawnHandle, await self.spawn(command, opts)), end_stdin=self.end_stdin)


class RemoteHandle:
    """What a cloud handle shares: warnings tagged with its sandbox, and a destroy that kills its processes first.

    The handle sets ``_provider`` (its ``logger`` and ``destroy``), ``id``, ``process`` and
    ``destroyed``; its processes read ``destroyed`` to tell a destroy's disconnect from a failure.
    """

    _provider: Any
    id: str
    process: ProcessSet[Any]
    destroyed: bool

    def warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None:
        self._provider.logger.warn(message, {"sandbox": self.id, **(meta or {})})

    async def destroy(self) -> None:
        if not self.destroyed:
            await self.process.kill_all()
        self.destroyed = True
        await self._provider.destroy(DestroyInput(id=self.id))


async def exec_result(process: SpawnHandle, *, end_stdin: bool = False) -> ExecResult:
    """``exec`` over a spawned process: its whole output and code; a cancelled caller kills it."""
    try:
        if end_stdin:
            await process.stdin.end()
        out, err, code = await asyncio.gather(collect(process.stdout), collect(process.stderr), process.wait())
    except asyncio.CancelledError:
        await process.kill()
        raise
    return ExecResult(stdout=out, stderr=err, exit_code=code)


def script(op: str, text: str, *args: str) -> str:
    """A command line running ``text`` with ``args`` as its positional parameters (``$1``...)."""
    return f"sh -c {quote(text)} {quote(op)} {join(args)}".rstrip()


Run = Callable[[str], Awaitable[ExecResult]]


class ShellFs:
    """``SandboxFs`` over shell commands (GNU coreutils/find/stat in the VM); subclasses may read/write natively."""

    watch: NativeWatch | None = None  # the framework polls with `find`

    def __init__(self, run: Run, workdir: str) -> None:
        self._run = run
        self.workdir = workdir

    def p(self, path: str) -> str:
        return map_path(path, self.workdir)

    async def sh(self, op: str, text: str, *args: str) -> str:
        result = await self._run(script(op, text, *args))
        if result.exit_code != 0:
            raise SandboxCommandError(op, result.exit_code, (result.stderr or result.stdout).strip())
        return result.stdout

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8", errors="replace")

    async def read_bytes(self, path: str) -> bytes:
        return base64.b64decode(await self.sh("read", 'base64 -w0 -- "$1"', self.p(path)))

    async def write(self, path: str, data: str | bytes) -> None:
        target = self.p(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        chunks = [raw[i : i + _WRITE_CHUNK] for i in range(0, len(raw), _WRITE_CHUNK)] or [b""]
        first = base64.b64encode(chunks[0]).decode()
        await self.sh("write", 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"', target, first)
        for chunk in chunks[1:]:
            await self.sh("write", 'printf %s "$2" | base64 -d >> "$1"', target, base64.b64encode(chunk).decode())

    async def list(self, path: str) -> list[FsEntry]:
        virtual = path.rstrip("/") or "/"
        out = await self.sh("list", 'ls -1Ap -- "$1"', self.p(path))
        entries = []
        for line in out.splitlines():
            if not line:
                continue
            kind: Literal["file", "dir"] = "dir" if line.endswith("/") else "file"
            name = line.rstrip("/")
            entries.append(FsEntry(name, f"{virtual.rstrip('/')}/{name}", kind))
        return entries

    async def mkdir(self, path: str) -> None:
        await self.sh("mkdir", 'mkdir -p -- "$1"', self.p(path))

    async def remove(self, path: str) -> None:
        await self.sh("remove", 'rm -rf -- "$1"', self.p(path))

    async def rename(self, src: str, dst: str) -> None:
        await self.sh("rename", 'mkdir -p -- "$(dirname -- "$2")" && mv -- "$1" "$2"', self.p(src), self.p(dst))

    async def exists(self, path: str) -> bool:
        result = await self._run(script("exists", 'test -e "$1" || test -L "$1"', self.p(path)))
        return result.exit_code == 0

    async def lstat(self, path: str) -> FsStat | None:
        # On a stat failure, absence is proven by listing the parent (an unreadable parent is an error).
        probe = (
            'if s=$(stat -c "%f:%s" -- "$1" 2>/dev/null); then echo "$s"; exit 0; fi; '
            'd=$(dirname -- "$1"); b=$(basename -- "$1"); '
            'if [ ! -e "$d" ]; then echo ' + MISSING + "; exit 0; fi; "
            'l=$(find -H "$d" -mindepth 1 -maxdepth 1 -name "$b" -print 2>&1) || { echo "$l" >&2; exit 1; }; '
            '[ -z "$l" ] && { echo ' + MISSING + '; exit 0; }; stat -c "%f:%s" -- "$1"'
        )
        out = (await self.sh("lstat", probe, self.p(path))).strip()
        if out == MISSING:
            return None
        hex_mode, _, size = out.partition(":")
        mode = int(hex_mode, 16)
        kind = mode & 0o170000
        if kind == 0o100000:
            return FsStat("file", mode, int(size))
        if kind == 0o040000:
            return FsStat("dir", mode)
        if kind == 0o120000:
            return FsStat("symlink", mode)
        return FsStat("other", mode)


def channel(url: str, headers: Mapping[str, str] | None = None, token: str | None = None) -> SandboxChannel:
    return SandboxChannel(url=url, token=token, headers=dict(headers) if headers else None)
