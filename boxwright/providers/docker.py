"""Docker: one container per sandbox, driven through the Docker Engine API (the ``docker`` SDK, extra ``docker``).

The container runs a keep-alive under ``docker-init`` (which reaps the zombies a
killed command leaves); every command is a ``docker exec`` of ``sh -c`` as a
non-root user. Hardened by default: ``cap_drop=ALL``, ``no-new-privileges``,
pids/memory/cpu limits, no Docker socket inside, ``network_mode="none"`` when
the policy denies network, ``host.docker.internal`` (host-gateway) otherwise so
the host's tool bridge is reachable.

Secrets never enter the container's config: the handle env travels with each
exec, so an image committed for a snapshot holds none (spec K4). Images are
never pulled: there may be no registry, and a silent pull of a look-alike image
is worse than a clear error naming the missing one.

Exec streams are the daemon's hijacked socket, read non-blocking on the event
loop (no thread held per stream, no 60 s socket timeout on a quiet command);
short API calls run on a provider-owned thread pool, never the default one.

Every container carries labels naming the owner host, the sandbox key, the run
and a lease expiry, so any host can find and reap a leaked one
(``boxwright.docker_reap``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import re
import shlex
import signal as signals
import socket
import struct
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import msgspec

from ..errors import (
    ProcessExitedError,
    ProviderUnavailableError,
    SandboxCommandError,
    SandboxNotFoundError,
    UnsupportedCapabilityError,
)
from ..git_exec import ExecGit
from ..sandbox import (
    WORKSPACE,
    Capabilities,
    CreateInput,
    DestroyInput,
    ExecResult,
    FsEntry,
    FsStat,
    NativeWatch,
    ProcessOptions,
    RestoreInput,
    ResumeInput,
    SandboxChannel,
    SnapshotRef,
)
from ._docker_fast import SERVER as _FAST_SERVER
from ._docker_fast import FastExec, FastExecLost, FastExecUnavailable, go_lines, keep_alive_command
from ._posix import HandleEnv, Logger, StdlibLogger, TextStream
from ._remote import ProcessSet, RemoteProcess, import_sdk

NAME = "docker"
INSTALL_HELP = (
    "install Docker (`apt-get install docker.io`), start the engine (`dockerd` or `systemctl start docker`), "
    "and make its socket reachable (DOCKER_HOST, or membership of the `docker` group)"
)
LABEL_MANAGED = "boxwright.managed"
LABEL_OWNER = "boxwright.owner"
LABEL_SANDBOX = "boxwright.sandbox"
LABEL_RUN = "boxwright.run"
LABEL_LEASE = "boxwright.lease-expires"
# On committed images: "snapshot" or "fork", and when it was committed (epoch seconds).
LABEL_KIND = "boxwright.kind"
LABEL_CREATED = "boxwright.created"
SNAPSHOT_REPOSITORY = "boxwright-snapshot"
FORK_REPOSITORY = "boxwright-fork"
# Extra labels for every container and image (``k=v,k2=v2``): a deployment or a CI session tags its own.
LABELS_ENV = "BOXWRIGHT_DOCKER_LABELS"
DEFAULT_LEASE = 6 * 3600.0
# A snapshot outlives its container (restore after destroy), so its lease is longer.
DEFAULT_SNAPSHOT_LEASE = 7 * 24 * 3600.0
DEFAULT_USER = "1000:1000"
DEFAULT_KEEP_ALIVE = ("sleep", "infinity")
# How long the keep-alive's words are awaited (its setup at create, python3 starting after).
_SERVE_WITHIN = 20.0
_READ = 65536
_WRITE_CHUNK = 32768
# Bounded waits on the daemon: exec state after EOF, a kill, a stop.
_INSPECT_FOR = 10.0
# How long the exec server's start waits for the handle's first command (``DockerHandle._start_fast``).
_FAST_START_AFTER = 0.5
_NO_PID = "__boxwright_kill_no_pid__"
_SURVIVED = "__boxwright_kill_survived__"
_MISSING = "__boxwright_missing__"
_SIGNAL = re.compile(r"^[A-Z][A-Z0-9]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_T = TypeVar("_T")

CAPABILITIES = Capabilities(
    fs=True,
    exec=True,
    env=True,
    ports=True,
    background_processes=True,
    writable_stdin=True,  # half-close of the hijacked unix socket; measured by C12
    killable_processes=True,  # process-group kill through the pid-file wrapper; measured by C13/C14/J7/J8
    snapshots=True,
    network_policy=True,  # deny = network_mode "none"; a host allow-list is refused
    durable_filesystem=True,
    fork=True,
)


class DockerLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of every container; ``None`` lifts one."""

    pids: int | None = 1024
    memory: str | None = "4g"
    cpus: float | None = 2.0


def owner_id() -> str:
    """This host's name in the owner label: reaping by owner stays per host."""
    return socket.gethostname()


def _docker() -> Any:
    return import_sdk(NAME, "docker", "docker", "docker")


class DockerApi:
    """The low-level client and the pool its blocking calls run on."""

    def __init__(self, base_url: str | None = None, *, max_workers: int = 16) -> None:
        docker = _docker()
        self.errors = docker.errors
        kwargs: dict[str, Any] = {"version": "auto", "max_pool_size": 64, "timeout": 120}
        url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._url = url
        try:
            self.api = docker.APIClient(base_url=url, **kwargs)
        except docker.errors.DockerException as exc:
            raise ProviderUnavailableError(NAME, f"no Docker engine at {url}: {exc}", INSTALL_HELP) from exc
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="boxwright-docker")

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, lambda: fn(*args, **kwargs))
        except self.errors.NotFound:
            raise
        except self.errors.APIError:
            raise
        except (self.errors.DockerException, ConnectionError, OSError) as exc:
            raise self.unavailable(exc) from exc
        except Exception as exc:  # requests' ConnectionError is not an OSError
            if type(exc).__module__.startswith(("requests", "urllib3")):
                raise self.unavailable(exc) from exc
            raise

    def unavailable(self, exc: BaseException) -> ProviderUnavailableError:
        return ProviderUnavailableError(NAME, f"the Docker engine at {self._url} does not answer: {exc}", INSTALL_HELP)


def env_labels() -> dict[str, str]:
    """The labels of ``BOXWRIGHT_DOCKER_LABELS`` (``k=v,k2=v2``; a bare ``k`` is ``k=1``)."""
    found: dict[str, str] = {}
    for item in os.environ.get(LABELS_ENV, "").split(","):
        key, _, value = item.strip().partition("=")
        if key:
            found[key] = value or "1"
    return found


def _env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def _demux_frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Pop every whole frame of Docker's multiplexed stream: 8-byte header (stream, 0, 0, 0, be32 size)."""
    frames = []
    while len(buffer) >= 8:
        kind = buffer[0]
        (size,) = struct.unpack(">I", bytes(buffer[4:8]))
        if len(buffer) < 8 + size:
            break
        frames.append((kind, bytes(buffer[8 : 8 + size])))
        del buffer[: 8 + size]
    return frames


def _sanitise_signal(sig: int | str | None) -> str:
    if sig is None:
        return "TERM"
    if isinstance(sig, int) and not isinstance(sig, bool):
        return str(int(sig)) if sig > 0 else "TERM"
    text = str(sig).upper().removeprefix("SIG")
    return text if _SIGNAL.match(text) else "TERM"


# The wrapper of every exec that may be killed: records the pid (runc makes it a session
# and group leader), runs the command in the requested directory, removes the record on a
# normal end. A killed wrapper leaves the record to the kill script, which removes it.
_WRAPPER = 'echo $$ > "$1" || exit 125; cd "$2" || { rm -f "$1"; exit 2; }; sh -c "$3"; c=$?; rm -f "$1"; exit $c'

# $1 pid file, $2 signal. Waits for the record (a kill may come before the wrapper ran),
# signals the group, then KILLs what is left, and says when something survived.
_KILL = r"""F="$1"; S="$2"; i=0
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


class _Stdin:
    def __init__(self, process: DockerProcess, writable: bool) -> None:
        self._process = process
        self._writable = writable
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        if not self._writable:
            raise UnsupportedCapabilityError(NAME, "writable_stdin", "this exec was started without stdin")
        if self._ended:
            raise ProcessExitedError(self._process.pid, "stdin was already ended (closed)")
        if self._process.exited:
            raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed")
        payload = data.encode() if isinstance(data, str) else bytes(data)
        try:
            await asyncio.get_running_loop().sock_sendall(self._process.sock, payload)
        except OSError as exc:
            raise ProcessExitedError(self._process.pid, "the process closed its stdin") from exc

    async def end(self) -> None:
        if self._ended or not self._writable:
            return
        self._ended = True
        with contextlib.suppress(OSError):
            self._process.sock.shutdown(socket.SHUT_WR)


class DockerProcess(RemoteProcess):
    """``SpawnHandle`` over one ``docker exec``: its hijacked socket, demultiplexed on the loop."""

    # pid -1: the only pid we could give is the host's, wrong on a remote or rootless daemon

    def __init__(
        self,
        handle: DockerHandle,
        exec_id: str,
        raw: Any,
        pid_file: str | None,
        stdin: bool,
    ) -> None:
        self._handle = handle
        self._exec_id = exec_id
        self._raw = raw  # keeps the SDK's response (and so the socket) alive
        self.sock: socket.socket = raw._sock
        self.sock.settimeout(None)
        self.sock.setblocking(False)
        self._pid_file = pid_file
        self.stdout = TextStream()
        self.stderr = TextStream()
        self.stdin = _Stdin(self, stdin)
        self._eof = asyncio.Event()
        self._pump = asyncio.ensure_future(self._read())
        self.watch(self._await_exit())
        self.kill_requested = False

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        try:
            while True:
                try:
                    data = await loop.sock_recv(self.sock, _READ)
                except (ConnectionError, OSError):
                    break
                if not data:
                    break
                buffer += data
                for kind, payload in _demux_frames(buffer):
                    await (self.stderr if kind == 2 else self.stdout).feed(payload)
        finally:
            self.stdout.close()
            self.stderr.close()
            self._eof.set()
            self._close_socket()

    def _close_socket(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()
        with contextlib.suppress(Exception):
            self._raw.close()

    async def _await_exit(self) -> int:
        await self._eof.wait()
        api = self._handle.api
        deadline = time.monotonic() + _INSPECT_FOR
        delay = 0.002
        while True:
            try:
                state = await api.call(api.api.exec_inspect, self._exec_id)
            except api.errors.NotFound as exc:
                raise SandboxNotFoundError(NAME, self._handle.id, "is gone (its container was removed)") from exc
            if not state.get("Running"):
                code = state.get("ExitCode")
                if code is None:
                    raise SandboxNotFoundError(NAME, self._handle.id, "lost the command (no exit code reported)")
                if int(code) in (126, 137):
                    # SIGKILL, or the runtime's own failure: say so when the container itself went away
                    # (its state flips a moment after its processes die, hence the short recheck).
                    await self._handle._check_alive(settle=1.0 if int(code) == 137 else 0.0)
                return int(code)
            if time.monotonic() > deadline:
                # The stream closed but the process runs on (it closed its stdout): say so, do not hang.
                raise SandboxCommandError("exec", -1, "the command closed its output but did not exit")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _do_kill(self, sig: int | None) -> None:
        if self.exited or self._pid_file is None:
            return
        self.kill_requested = True
        try:
            result = await self._handle._bare_exec(
                ["sh", "-c", _KILL, "kill", self._pid_file, _sanitise_signal(sig or signals.SIGTERM)]
            )
        except Exception as exc:  # a gone daemon or container: the process went with it
            self._handle._warn("could not run the kill script", {"error": repr(exc)})
            result = None
        if result is not None:
            if _SURVIVED in result.stderr:
                self._handle._warn("processes survived SIGKILL", {"pidFile": self._pid_file})
            elif _NO_PID in result.stderr and not self.exited:
                self._handle._warn("the process recorded no pid; it may still run", {"pidFile": self._pid_file})
        # Closing alone only detaches the client; after the kill it unblocks a stream held open by nobody.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._eof.wait()), 2.0)
        self._close_socket()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._exit), _INSPECT_FOR)


class DockerProcesses(ProcessSet[DockerProcess]):
    def __init__(self, handle: DockerHandle) -> None:
        super().__init__()
        self._handle = handle

    async def spawn(self, command: str, opts: ProcessOptions | None = None, *, stdin: bool = True) -> DockerProcess:
        opts = opts or ProcessOptions()
        if opts.signal is not None:
            opts.signal.throw_if_aborted()
        handle = self._handle
        # /dev/shm (a tmpfs Docker gives every container), not /tmp: the pid record of a command
        # listing /tmp is not among the files it lists.
        pid_file = f"/dev/shm/.boxwright-{'spawn' if stdin else 'exec'}-{uuid.uuid4().hex}.pid"
        cwd = opts.cwd or handle.workdir
        if not cwd.startswith("/"):
            cwd = f"{handle.workdir}/{cwd}"
        argv = ["sh", "-c", _WRAPPER, "boxwright", pid_file, cwd, command]
        process = await handle._start_exec(argv, {**handle.env.get(), **(opts.env or {})}, stdin, pid_file)
        if stdin:
            handle._first_command.set()  # a spawn: started is enough (it may run for the whole session)
        return self.track(process, opts.signal)

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        handle = self._handle
        if handle._fast is None and handle._channel is not None and (opts is None or opts.signal is None):
            # Before the exec server answers: the keep-alive runs it (the first command costs no docker exec).
            cwd = (opts.cwd if opts else None) or handle.workdir
            if not cwd.startswith("/"):
                cwd = f"{handle.workdir}/{cwd}"
            try:
                found = await handle._channel_exec(
                    command, {**handle.env.get(), **((opts.env if opts else None) or {})}, cwd
                )
            finally:
                handle._first_command.set()
            if found is not None:
                return found
        if handle._fast is not None and (opts is None or opts.signal is None):
            # The fast path: a hang-up (our cancel) kills the command inside; abort signals take docker exec,
            # whose pid-file kill reports the signal's exit code.
            opts = opts or ProcessOptions()
            cwd = opts.cwd or handle.workdir
            if not cwd.startswith("/"):
                cwd = f"{handle.workdir}/{cwd}"
            argv = ["sh", "-c", 'cd "$1" || exit 2; sh -c "$2"', "boxwright", cwd, command]
            result = await handle._fast_exec(argv, {**handle.env.get(), **(opts.env or {})})
            if result is not None:
                return result
        process = await self.spawn(command, opts, stdin=False)
        try:
            out, err, code = await asyncio.gather(_collect(process.stdout), _collect(process.stderr), process.wait())
        except asyncio.CancelledError:
            await process.kill()
            raise
        finally:
            handle._first_command.set()
        return ExecResult(stdout=out, stderr=err, exit_code=code)


class _AttachLines:
    """Lines of a container's stdout on its attach socket (multiplexed frames), and writes to its stdin."""

    def __init__(self, attach: Any) -> None:
        self._attach = attach
        self._sock: socket.socket = attach._sock
        self._sock.setblocking(False)
        self._frames = bytearray()
        self._out = bytearray()

    async def next(self) -> str:
        """The next stdout line; "" when the stream ended before one."""
        loop = asyncio.get_running_loop()
        while b"\n" not in self._out:
            data = await loop.sock_recv(self._sock, _READ)
            if not data:
                self._out += b"\n"
                break
            self._frames += data
            for kind, payload in _demux_frames(self._frames):
                if kind == 1:
                    self._out += payload
        line, _, self._out[:] = bytes(self._out).partition(b"\n")
        return line.decode(errors="replace").strip()

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self._sock, data)

    async def run(self, nonce: str, script: str) -> ExecResult:
        """The keep-alive runs ``script`` (base64); its output ends with the nonce on both streams."""
        await self.send(f"run {nonce} {script}\n".encode())
        loop = asyncio.get_running_loop()
        mark = nonce.encode()
        out = bytearray(self._out)
        self._out.clear()
        err = bytearray()
        while True:
            at = out.rfind(mark + b" ")
            if at >= 0 and out.endswith(b"\n") and err.endswith(mark + b"\n"):
                code = int(out[at + len(mark) + 1 :].strip())
                return ExecResult(
                    stdout=bytes(out[:at]).decode(errors="replace"),
                    stderr=bytes(err[: -len(mark) - 1]).decode(errors="replace"),
                    exit_code=code,
                )
            data = await loop.sock_recv(self._sock, _READ)
            if not data:
                raise EOFError("the keep-alive's stream ended mid-command")
            self._frames += data
            for kind, payload in _demux_frames(self._frames):
                (err if kind == 2 else out).extend(payload)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._attach.close()


async def _collect(stream: TextStream) -> str:
    return "".join([chunk async for chunk in stream])


def _virtual(path: str, workdir: str) -> str:
    """``/workspace[/x]`` is the container's workdir; other absolute paths are the container's own."""
    if "\x00" in path:
        raise ValueError(f"a path cannot contain a NUL byte: {path!r}")
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return workdir + path[len(WORKSPACE) :]
    if not path.startswith("/"):
        return f"{workdir}/{path}"
    return path


class DockerFs:
    """``SandboxFs`` over bare execs (no wrapper: an fs op is never killed alone)."""

    watch: NativeWatch | None = None  # the framework polls with `find`

    def __init__(self, handle: DockerHandle) -> None:
        self._handle = handle

    def _p(self, path: str) -> str:
        return _virtual(path, self._handle.workdir)

    async def _sh(self, op: str, script: str, *args: str) -> str:
        result = await self._handle._bare_exec(["sh", "-c", script, op, *args])
        if result.exit_code != 0:
            raise SandboxCommandError(op, result.exit_code, result.stderr.strip())
        return result.stdout

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8", errors="replace")

    async def read_bytes(self, path: str) -> bytes:
        out = await self._sh("read", 'base64 -w0 -- "$1"', self._p(path))
        return base64.b64decode(out)

    async def write(self, path: str, data: str | bytes) -> None:
        target = self._p(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        chunks = [raw[i : i + _WRITE_CHUNK] for i in range(0, len(raw), _WRITE_CHUNK)] or [b""]
        # Each chunk appends; argv stays far under the kernel's 128 KiB per-argument limit.
        first = base64.b64encode(chunks[0]).decode()
        await self._sh("write", 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"', target, first)
        for chunk in chunks[1:]:
            await self._sh("write", 'printf %s "$2" | base64 -d >> "$1"', target, base64.b64encode(chunk).decode())

    async def list(self, path: str) -> list[FsEntry]:
        virtual = path.rstrip("/") or "/"
        out = await self._sh("list", 'ls -1Ap -- "$1"', self._p(path))
        entries = []
        for line in out.splitlines():
            if not line:
                continue
            kind: Literal["file", "dir"] = "dir" if line.endswith("/") else "file"
            name = line.rstrip("/")
            entries.append(FsEntry(name, f"{virtual.rstrip('/')}/{name}", kind))
        return entries

    async def mkdir(self, path: str) -> None:
        await self._sh("mkdir", 'mkdir -p -- "$1"', self._p(path))

    async def remove(self, path: str) -> None:
        await self._sh("remove", 'rm -rf -- "$1"', self._p(path))

    async def rename(self, src: str, dst: str) -> None:
        await self._sh("rename", 'mkdir -p -- "$(dirname -- "$2")" && mv -- "$1" "$2"', self._p(src), self._p(dst))

    async def exists(self, path: str) -> bool:
        result = await self._handle._bare_exec(["sh", "-c", 'test -e "$1" || test -L "$1"', "exists", self._p(path)])
        return result.exit_code == 0

    async def lstat(self, path: str) -> FsStat | None:
        target = self._p(path)
        # On a stat failure, absence is proven by listing the parent (an unreadable parent is an error).
        script = (
            'if s=$(stat -c "%f:%s" -- "$1" 2>/dev/null); then echo "$s"; exit 0; fi; '
            'd=$(dirname -- "$1"); b=$(basename -- "$1"); '
            'if [ ! -e "$d" ]; then echo ' + _MISSING + "; exit 0; fi; "
            'l=$(find -H "$d" -mindepth 1 -maxdepth 1 -name "$b" -print 2>&1) || { echo "$l" >&2; exit 1; }; '
            '[ -z "$l" ] && { echo ' + _MISSING + '; exit 0; }; stat -c "%f:%s" -- "$1"'
        )
        out = (await self._sh("lstat", script, target)).strip()
        if out == _MISSING:
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


class DockerPorts:
    def __init__(self, handle: DockerHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int between 1 and 65535, got {port!r}")
        if port not in self._handle._published:
            raise ValueError(f"port {port} is not published; list it in docker_sandbox(publish_ports=[...])")
        api = self._handle.api
        bound = await api.call(api.api.port, self._handle.id, port)
        if not bound:
            raise ValueError(f"port {port} has no host mapping on container {self._handle.id[:12]}")
        return SandboxChannel(url=f"http://127.0.0.1:{bound[0]['HostPort']}")


class DockerHandle:
    provider = NAME
    capabilities = CAPABILITIES

    def __init__(
        self,
        provider: DockerProvider,
        container_id: str,
        env: Mapping[str, str] | None,
        network: Literal["allow", "deny"],
    ) -> None:
        self._provider = provider
        self.api = provider.api
        self.id = container_id
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.user = provider.user
        self.network = network
        self._published = provider.publish_ports
        self._logger = provider.logger
        self.env = HandleEnv(env)
        self.fs = DockerFs(self)
        self.process = DockerProcesses(self)
        self.git = ExecGit(self.process)
        self.ports = DockerPorts(self)
        self._fast: FastExec | None = None
        self._fast_server: DockerProcess | None = None
        self._fast_start: asyncio.Task[None] | None = None
        # Set when the first command ended (exec) or started (spawn): the exec server waits for it.
        self._first_command = asyncio.Event()
        # The keep-alive's stdin/stdout until its exec server starts: it runs plain commands one at a time.
        self._channel: _AttachLines | None = None
        self._channel_lock = asyncio.Lock()
        self._channel_kill: asyncio.Future[ExecResult] | None = None
        self._channel_runs = False  # it has `setsid`: a command it runs leads its own group (pid-file kill)

    def start_fast_exec(self) -> None:
        if self._fast is None and self._fast_start is None and self.network == "allow" and self._provider.fast_exec:
            self._fast_start = asyncio.get_running_loop().create_task(self._start_fast())

    def _warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None:
        self._logger.warn(message, {"container": self.id[:12], **(meta or {})})

    def _gone(self, exc: BaseException) -> SandboxNotFoundError:
        detail = getattr(exc, "explanation", None) or str(exc)
        return SandboxNotFoundError(NAME, self.id, f"cannot run commands: {detail}")

    async def _start_exec(
        self, argv: Sequence[str], env: Mapping[str, str], stdin: bool, pid_file: str | None, user: str | None = None
    ) -> DockerProcess:
        api = self.api
        try:
            created = await api.call(
                api.api.exec_create,
                self.id,
                list(argv),
                stdout=True,
                stderr=True,
                stdin=stdin,
                tty=False,
                environment=_env_list(env),
                workdir="/",
                user=user or self.user,
            )
            raw = await api.call(api.api.exec_start, created["Id"], socket=True)
        except (api.errors.NotFound, api.errors.APIError) as exc:
            raise self._gone(exc) from exc
        return DockerProcess(self, created["Id"], raw, pid_file, stdin)

    async def _fast_exec(self, argv: Sequence[str], env: Mapping[str, str]) -> ExecResult | None:
        """``argv`` through the container's exec server; None when it cannot carry it (nothing ran)."""
        fast = self._fast
        if fast is None:
            return None
        try:
            return await fast.run(argv, env)
        except FastExecUnavailable as exc:
            self._fast = None
            self._warn("the container's fast exec server stopped answering; using docker exec", {"error": str(exc)})
            return None
        except FastExecLost as exc:
            raise SandboxNotFoundError(NAME, self.id, f"lost a command: {exc}") from exc

    async def _start_fast(self) -> None:
        """Start the exec server (in the background, after create); the handle uses it once it answers."""
        # Not alongside the first command: on a loaded engine its exec, and python starting, slowed the
        # create-to-first-exec path by ~0.1x of a `docker run` (measured); that command takes docker exec anyway.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_command.wait(), _FAST_START_AFTER)
        try:
            host = await self.address()
            token = FastExec.new_token()
            server = await self._start_exec(
                # The script travels in the env, popped at once: `ps` shows one short line.
                ["python3", "-c", 'import os; exec(os.environ.pop("BOXWRIGHT_EXEC_SERVER"))', host],
                {"BOXWRIGHT_EXEC_TOKEN": token, "BOXWRIGHT_EXEC_SERVER": _FAST_SERVER},
                True,
                None,
            )
            self._fast_server = server  # its open stdin is the server's life line
            line = await asyncio.wait_for(server.stdout.__anext__(), 20.0)
            port = int(line.strip().splitlines()[0])
        except (Exception, StopAsyncIteration):
            return  # no python3, no address (network deny), a slow start: docker exec it stays
        self._fast = FastExec(host, port, token)

    async def _set_up_by_keep_alive(self, attach: Any) -> bool:
        """Let root make ``/`` sticky; True once the keep-alive made the workspace (it then holds ``attach``).

        False when it could not (the caller sets up from the host, and closes ``attach``).
        """
        api = self.api
        lines = _AttachLines(attach)
        try:
            # Detached: the keep-alive's word says it took (it waits for `/` to be writable before it
            # makes the workspace), so no exec_inspect round trip stands on the create path.
            chmod = await api.call(
                api.api.exec_create, self.id, ["chmod", "1777", "/"], stdout=False, stderr=False, user="0:0"
            )
            await api.call(api.api.exec_start, chmod["Id"], detach=True)
            word = await asyncio.wait_for(lines.next(), _SERVE_WITHIN)
        except (TimeoutError, OSError) as exc:
            word = repr(exc)
        except BaseException:
            lines.close()
            raise
        if word not in ("boxwright-setup-ok", "boxwright-setup-ok-no-setsid"):
            self._warn("the keep-alive could not make the workspace; setting up from the host", {"said": word[:200]})
            lines.close()
            return False
        self._channel = lines
        self._channel_runs = word == "boxwright-setup-ok"
        self._fast_start = asyncio.get_running_loop().create_task(self._serve_from_keep_alive(lines))
        return True

    async def _channel_exec(self, command: str, env: Mapping[str, str], cwd: str) -> ExecResult | None:
        """``command`` run by the keep-alive itself (no docker exec); None when it cannot take it (nothing ran)."""
        lines = self._channel
        if lines is None or not self._channel_runs or self._channel_lock.locked():
            return None
        if not all(_ENV_NAME.match(k) for k in env):
            return None
        async with self._channel_lock:
            if self._channel is not lines:
                return None
            pid_file = f"/dev/shm/.boxwright-exec-{uuid.uuid4().hex}.pid"
            # Values reach the command's env through `export` in the keep-alive's subshell: never an argv.
            # setsid: not a group leader (a subshell), so it keeps the pid the wrapper records and leads a group.
            script = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()) + shlex.join(
                ["exec", "setsid", "sh", "-c", _WRAPPER, "boxwright", pid_file, cwd, command]
            )
            nonce = uuid.uuid4().hex
            try:
                return await lines.run(nonce, base64.b64encode(script.encode()).decode())
            except BaseException as exc:
                self._channel = None
                lines.close()
                if isinstance(exc, OSError | EOFError):
                    raise SandboxNotFoundError(NAME, self.id, f"lost a command: {exc!r}") from exc
                # Cancelled: the pid-file kill, owned by the handle (destroy awaits it).
                self._channel_kill = asyncio.ensure_future(
                    self._bare_exec(["sh", "-c", _KILL, "kill", pid_file, "TERM"])
                )
                raise

    async def _serve_from_keep_alive(self, lines: _AttachLines) -> None:
        """Start the keep-alive's exec server (after the first command, as ``_start_fast``); use it once it answers."""
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first_command.wait(), _FAST_START_AFTER)
            async with self._channel_lock:  # a command on the channel ends first; those queued then see None
                if self._channel is not lines:
                    return  # a cancelled command closed it
                self._channel = None
            token = FastExec.new_token()
            await lines.send(go_lines(token))
            host = asyncio.ensure_future(self.address())
            try:
                word = await asyncio.wait_for(lines.next(), _SERVE_WITHIN)
                address = await host
            finally:
                host.cancel()
            kind, _, port = word.partition(" ")
            if kind == "boxwright-ready":
                self._fast = FastExec(address, int(port), token)
            elif kind != "boxwright-no-python":
                self._warn("the keep-alive exec server did not start; docker exec it stays", {"said": word[:200]})
        except (Exception, StopAsyncIteration) as exc:  # no address, a slow start: docker exec it stays
            self._warn("the keep-alive exec server did not answer; docker exec it stays", {"error": repr(exc)})
        finally:
            # Its stdin closes with this (StdinOnce): the server read its one line, nobody else may write.
            lines.close()

    async def _bare_exec(self, argv: Sequence[str], user: str | None = None) -> ExecResult:
        """An exec with no wrapper and no stdin, for fs ops and kill scripts; the handle env is not needed."""
        if user is None:
            result = await self._fast_exec(argv, {})
            if result is not None:
                return result
        process = await self._start_exec(argv, {}, False, None, user)
        out, err, code = await asyncio.gather(_collect(process.stdout), _collect(process.stderr), process.wait())
        return ExecResult(stdout=out, stderr=err, exit_code=code)

    async def _check_alive(self, settle: float = 0.0) -> None:
        """Raise ``SandboxNotFoundError`` when the container was removed or stopped (from outside)."""
        api = self.api
        deadline = time.monotonic() + settle
        while True:
            try:
                info = await api.call(api.api.inspect_container, self.id)
            except api.errors.NotFound as exc:
                raise SandboxNotFoundError(NAME, self.id, "was removed while a command ran") from exc
            if not (info.get("State") or {}).get("Running"):
                raise SandboxNotFoundError(NAME, self.id, "was stopped or removed while a command ran")
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    async def address(self) -> str:
        """The container's address on its Docker network, as the host reaches it (the runner binds it)."""
        api = self.api
        try:
            info = await api.call(api.api.inspect_container, self.id)
        except api.errors.NotFound as exc:
            raise self._gone(exc) from exc
        settings = info.get("NetworkSettings") or {}
        found = settings.get("IPAddress") or next(
            (n.get("IPAddress") for n in (settings.get("Networks") or {}).values() if n.get("IPAddress")), None
        )
        if not found:
            raise UnsupportedCapabilityError(NAME, "network", "the container has no network address (network deny)")
        return str(found)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        tag = f"{self.id[:12]}-{_tag(label or 'snap')}"
        await self._commit(SNAPSHOT_REPOSITORY, tag, "snapshot", self._provider.snapshot_lease_seconds)
        return SnapshotRef(id=f"{SNAPSHOT_REPOSITORY}:{tag}", label=label)

    async def _commit(self, repository: str, tag: str, kind: str, lease: float) -> None:
        api = self.api
        now = time.time()
        # The image keeps the container's labels (owner, sandbox key, run); these say what it is and
        # how long it may live, so the reaper can tell a leaked image from one a sandbox still needs.
        changes = [f"LABEL {LABEL_KIND}={kind} {LABEL_CREATED}={now:.0f} {LABEL_LEASE}={now + lease:.0f}"]
        try:
            # No pause: the cgroup freezer left a container paused for good here once (unpause hung), and
            # a commit after setup has nothing running to catch mid-write.
            await api.call(api.api.commit, self.id, repository=repository, tag=tag, pause=False, changes=changes)
        except (api.errors.NotFound, api.errors.APIError) as exc:
            raise self._gone(exc) from exc

    async def fork(self) -> DockerHandle:
        tag = f"{self.id[:12]}-{int(time.time() * 1000)}"
        image = f"{FORK_REPOSITORY}:{tag}"
        await self._commit(FORK_REPOSITORY, tag, "fork", self._provider.lease_seconds)
        try:
            return await self._provider._create_from(
                image, env=self.env.get(), network=self.network, key=None, run=None
            )
        except BaseException:
            # The image serves this fork alone: with no fork, nothing will ever use it.
            with contextlib.suppress(Exception):
                await self.api.call(self.api.api.remove_image, image)
            raise

    async def destroy(self) -> None:
        if self._channel_kill is not None:
            with contextlib.suppress(BaseException):
                await self._channel_kill
        if self._fast_start is not None:
            self._fast_start.cancel()
            with contextlib.suppress(BaseException):
                await self._fast_start
        self._fast = None
        await self.process.kill_all()
        await self._provider.destroy(DestroyInput(id=self.id))
        if self._fast_server is not None:
            self._fast_server._close_socket()


def _tag(label: str) -> str:
    """A label reduced to Docker's tag grammar (``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``)."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).lstrip(".-") or "snap"
    return text[:100]


class DockerProvider:
    name = NAME

    def __init__(
        self,
        image: str,
        *,
        workdir: str = WORKSPACE,
        user: str = DEFAULT_USER,
        keep_alive_command: Sequence[str] = DEFAULT_KEEP_ALIVE,
        publish_ports: Sequence[int] = (),
        host_gateway: bool = True,
        network: Literal["allow", "deny"] = "allow",
        limits: DockerLimits | None = None,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        snapshot_lease_seconds: float = DEFAULT_SNAPSHOT_LEASE,
        base_url: str | None = None,
        logger: Logger | None = None,
        fast_exec: bool = True,
    ) -> None:
        self.fast_exec = fast_exec
        self.snapshot_lease_seconds = snapshot_lease_seconds
        self.image = image
        self.workdir = workdir.rstrip("/") or "/"
        self.user = user
        self.keep_alive = list(keep_alive_command)
        self.publish_ports = tuple(int(p) for p in publish_ports)
        self.host_gateway = host_gateway
        self.network = network
        self.limits = limits or DockerLimits()
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self._base_url = base_url
        self._api: DockerApi | None = None
        self._api_lock = threading.Lock()
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.docker")
        self.restore_snapshot = self._restore

    @property
    def api(self) -> DockerApi:
        with self._api_lock:
            if self._api is None:
                self._api = DockerApi(self._base_url)
            return self._api

    async def _connected(self) -> DockerApi:
        """The client, made off the loop: its version handshake is a blocking call to the daemon."""
        if self._api is not None:
            return self._api
        return await asyncio.to_thread(lambda: self.api)

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"image": self.image, "workdir": self.workdir, "user": self.user, "network": self.network}

    async def create(self, input: CreateInput | None = None) -> DockerHandle:
        input = input or CreateInput()
        if input.signal is not None:
            input.signal.throw_if_aborted()
        network = self.network
        if input.network is not None:
            if input.network.mode == "deny" and input.network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "docker can deny all egress (network none), not allow a list of hosts"
                )
            network = input.network.mode
        return await self._create_from(self.image, env=input.env, network=network, key=input.id, run=self.run_id)

    @staticmethod
    def _missing_image(image: str) -> ProviderUnavailableError:
        """The error naming a missing image (never pulled)."""
        return ProviderUnavailableError(
            NAME,
            f"image {image!r} is not on this Docker engine (boxwright never pulls implicitly)",
            f"build it (deploy/runner/build.sh builds boxwright's runner image) or `docker pull {image}` first",
        )

    def _labels(self, key: str | None, run: str | None) -> dict[str, str]:
        labels = {
            **env_labels(),
            **self.labels,
            LABEL_MANAGED: "1",
            LABEL_OWNER: owner_id(),
            LABEL_LEASE: f"{time.time() + self.lease_seconds:.0f}",
        }
        if key:
            labels[LABEL_SANDBOX] = key
        if run:
            labels[LABEL_RUN] = run
        return labels

    async def _create_from(
        self,
        image: str,
        *,
        env: Mapping[str, str] | None,
        network: Literal["allow", "deny"],
        key: str | None,
        run: str | None,
    ) -> DockerHandle:
        api = await self._connected()
        limits = self.limits
        # The default keep-alive becomes the fast exec server itself (``_docker_fast.KEEP_ALIVE``): it makes
        # the workspace and serves the first command, so create pays neither an archive nor a docker exec.
        serve = self.fast_exec and network == "allow" and self.keep_alive == list(DEFAULT_KEEP_ALIVE)
        host_config = api.api.create_host_config(
            # Its stdout carries the first command's output: no log driver keeps it on the host.
            log_config={"type": "none"} if serve else None,
            init=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=limits.pids,
            mem_limit=limits.memory,
            nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
            network_mode="none" if network == "deny" else None,
            extra_hosts={"host.docker.internal": "host-gateway"} if self.host_gateway and network == "allow" else None,
            port_bindings={p: ("127.0.0.1", None) for p in self.publish_ports} if network == "allow" else None,
        )
        try:
            created = await api.call(
                api.api.create_container,
                image,
                command=keep_alive_command(self.workdir) if serve else self.keep_alive,
                user=self.user,
                working_dir="/",
                labels=self._labels(key, run),
                host_config=host_config,
                ports=list(self.publish_ports) or None,
                tty=False,
                # With attach, StdinOnce: the token's one-shot channel closes when the host hangs up.
                stdin_open=serve,
            )
        except api.errors.NotFound:
            # No image inspect first: the create's own 404 says it, one round trip fewer on the create path.
            raise self._missing_image(image) from None
        except api.errors.APIError as exc:
            raise ProviderUnavailableError(NAME, f"could not create a container from {image!r}: {exc}") from exc
        cid = str(created["Id"])
        try:
            handle = DockerHandle(self, cid, env, network)
            if serve:
                # Side by side: nothing reaches the server's stdout before it read the boot line, sent on
                # this socket once it is up, so an attach that lands after the start loses nothing.
                attach, _ = await asyncio.gather(
                    api.call(api.api.attach_socket, cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}),
                    api.call(api.api.start, cid),
                )
                served = await handle._set_up_by_keep_alive(attach)
            else:
                await api.call(api.api.start, cid)
                served = False
            if not served:
                await self._setup(handle)
        except BaseException:
            with contextlib.suppress(Exception):
                await api.call(api.api.remove_container, cid, force=True, v=True)
            raise
        handle.start_fast_exec()
        return handle

    async def _setup(self, handle: DockerHandle) -> None:
        """The workspace owned by the user and ``/`` sticky, from the host (the keep-alive could not)."""
        api = handle.api
        # Root without capabilities still owns `/`: it makes it sticky and world-writable (as
        # /tmp), so the user may remove its own workspace as on a host, and a command in a
        # deleted workspace fails instead of running in a directory nobody can remove.
        # (Neither `docker import` nor a build layer keeps a mode on `/` itself: measured.)
        # Both after start and side by side: an archive into a created container mounts its
        # rootfs just for that, and each step costs an engine round trip (measured: ~250 ms
        # each on a loaded engine, so side by side saves one of them on every create).
        _, made = await asyncio.gather(
            api.call(api.api.put_archive, handle.id, "/", _workspace_tar(self.workdir, self.user)),
            handle._bare_exec(["chmod", "1777", "/"], user="0:0"),
        )
        if made.exit_code != 0:
            raise SandboxCommandError("create", made.exit_code, made.stderr.strip())

    async def _restore(self, input: RestoreInput) -> DockerHandle:
        network = input.network.mode if input.network is not None else self.network
        return await self._create_from(input.snapshot_id, env=input.env, network=network, key=None, run=self.run_id)

    async def resume(self, input: ResumeInput) -> DockerHandle | None:
        api = await self._connected()
        try:
            info = await api.call(api.api.inspect_container, input.id)
        except api.errors.NotFound:
            return None
        state = info.get("State") or {}
        if state.get("Dead") or state.get("Status") == "removing":
            return None
        if not state.get("Running"):
            try:
                await api.call(api.api.start, info["Id"])
            except api.errors.APIError:
                return None
        network: Literal["allow", "deny"] = (
            "deny" if (info.get("HostConfig") or {}).get("NetworkMode") == "none" else "allow"
        )
        handle = DockerHandle(self, str(info["Id"]), None, network)
        handle.start_fast_exec()
        return handle

    async def list_for_key(self, key: str) -> list[str]:
        """The containers labelled with sandbox ``key``, any owner, stopped ones too, none being removed.

        A stopped one still holds its disk; a removing one is already someone's destroy.
        """
        api = await self._connected()
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_SANDBOX}={key}"]
        found = await api.call(api.api.containers, all=True, filters={"label": labels})
        return [str(c["Id"]) for c in found if str(c.get("State") or "") not in ("removing", "dead")]

    async def destroy(self, input: DestroyInput) -> None:
        api = await self._connected()
        try:
            info = await api.call(api.api.inspect_container, input.id)
        except api.errors.NotFound:
            return
        image = str((info.get("Config") or {}).get("Image") or "")
        try:
            await api.call(api.api.remove_container, input.id, force=True, v=True)
        except api.errors.NotFound:
            return
        except api.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc):
                return  # another caller is removing it
            raise
        if image.startswith(f"{FORK_REPOSITORY}:"):
            # A fork's image serves that fork alone. Not forced: a container someone else made from it keeps it.
            with contextlib.suppress(Exception):
                await api.call(api.api.remove_image, image)


def _workspace_tar(workdir: str, user: str) -> bytes:
    """A tar that makes the workdir (and its parents) owned by the non-root user, before start.

    The container runs with no capabilities, so not even its root could chown later. The
    tar cannot change the mode of ``/`` itself (the daemon keeps it): see ``_ROOT_STICKY``.
    """
    uid, _, gid = user.partition(":")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        parts = [p for p in workdir.strip("/").split("/") if p]
        for i in range(len(parts)):
            info = tarfile.TarInfo("/".join(parts[: i + 1]))
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.uid = int(uid or 0) if uid.isdigit() else 0
            info.gid = int(gid or uid or 0) if (gid or uid).isdigit() else 0
            info.mtime = int(time.time())
            tar.addfile(info)
    return buffer.getvalue()


def docker_sandbox(
    image: str,
    *,
    workdir: str = WORKSPACE,
    user: str = DEFAULT_USER,
    publish_ports: Sequence[int] = (),
    host_gateway: bool = True,
    network: Literal["allow", "deny"] = "allow",
    limits: DockerLimits | None = None,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    snapshot_lease_seconds: float = DEFAULT_SNAPSHOT_LEASE,
    base_url: str | None = None,
    logger: Logger | None = None,
    fast_exec: bool = True,
) -> DockerProvider:
    """A provider whose sandboxes are containers of ``image`` (a local image: never pulled).

    Commands run as ``user`` (non-root by default) with no capabilities, no new
    privileges and the ``limits``; ``network="deny"`` gives the container no network.
    ``publish_ports`` are bound to 127.0.0.1 on daemon-chosen host ports. ``fast_exec`` runs
    plain commands through a small server in the container (``_docker_fast``) once it answers.
    ``lease_seconds`` and ``snapshot_lease_seconds`` bound how long a container and a committed
    snapshot image may live before any host's reaper removes them (``boxwright.docker_reap``);
    ``BOXWRIGHT_DOCKER_LABELS`` (``k=v,...``) adds labels to every container and image.
    """
    return DockerProvider(
        image,
        workdir=workdir,
        user=user,
        publish_ports=publish_ports,
        host_gateway=host_gateway,
        network=network,
        limits=limits,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        snapshot_lease_seconds=snapshot_lease_seconds,
        base_url=base_url,
        logger=logger,
        fast_exec=fast_exec,
    )
