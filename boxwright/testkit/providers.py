"""The provider conformance suite (spec/providers.md §3), for boxwright's providers and yours.

Describe how to get a fresh sandbox, then let the suite build a pytest class::

    provider = my_provider()
    logger = RecordingLogger()          # handed to the provider, so cases can check its warnings

    async def create():
        handle = await provider.create()
        return handle, handle.destroy

    TestMyProvider = provider_contract_suite(
        ProviderSuiteConfig(name="mine", create_handle=create, provider=provider, logger=logger)
    )

Every case is a plain ``async def case_...(config) -> None`` that creates its own
sandbox and disposes of it in ``finally``; the generated class wraps each one in a
sync ``test_...`` method running ``asyncio.run``, so no pytest async plugin is needed.
A case gated by a capability the provider does not declare asserts the unsupported
path instead (``snapshot()`` raising ``UnsupportedCapabilityError``, ...), so every
case checks something. An environment that cannot run the provider at all (no
daemon, CLI, login or credential) sets ``unsupported``: the class then holds one
test, ``test_unavailable_<reason>``, skipped with that reason, or failed when
``BOXWRIGHT_REQUIRE_INTEGRATION=1``.

Assertions raise ``AssertionError`` with a message of their own (they do not rely on
pytest's assert rewriting, which skips installed packages).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal as signals
import stat as st
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from ..abort import AbortController
from ..errors import (
    AbortError,
    BoxwrightError,
    ProcessExitedError,
    SandboxCommandError,
    SandboxNotFoundError,
    SandboxPathError,
    UnsupportedCapabilityError,
)
from ..sandbox import (
    Capabilities,
    CreateInput,
    ExecResult,
    FsEntry,
    NetworkPolicy,
    ProcessOptions,
    RestoreInput,
    ResumeInput,
    SandboxHandle,
    SandboxProvider,
    SpawnHandle,
)
from ..shell import quote

REQUIRE_INTEGRATION_ENV = "BOXWRIGHT_REQUIRE_INTEGRATION"
CASE_TIMEOUT = 180.0
# How long the suite waits for one stream or process that should already be moving.
_STEP = 30.0

Dispose = Callable[[], Awaitable[None]]
CreateHandle = Callable[[], Awaitable[tuple[SandboxHandle, Dispose]]]
Case = Callable[["ProviderSuiteConfig"], Awaitable[None]]
_E = TypeVar("_E", bound=BaseException)


class RecordingLogger:
    """A provider ``Logger`` that keeps every warning, so a case can assert there was none."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warn(self, message: str, meta: Mapping[str, Any] | None = None) -> None:
        self.warnings.append((message, dict(meta or {})))


@dataclass(frozen=True, kw_only=True)
class ProviderSuiteConfig:
    """How the suite gets sandboxes of one provider, and what it may assume about them.

    ``create_handle`` returns a fresh sandbox and the coroutine that disposes of it
    (usually ``handle.destroy``; it must tolerate a sandbox already destroyed).
    ``provider`` enables the resume/destroy/create cases (C9, C10, C19).
    ``unsupported`` names why this environment cannot run the provider at all;
    ``follow_unsupported`` why its journal cannot ``follow`` (it must then declare
    ``poll``: not both ``background_processes`` and ``killable_processes``).
    ``logger`` is the ``RecordingLogger`` the provider was built with, if any.
    ``host_workspace`` is true when ``workspace_root`` is a host directory and the fs
    maps sandbox paths onto host paths (local-process, bubblewrap): escapes must then
    raise ``SandboxPathError`` and a deleted root ``SandboxNotFoundError``.
    ``port`` is a port ``ports.connect`` must accept (Docker: one of ``publish_ports``).
    """

    name: str
    create_handle: CreateHandle
    provider: SandboxProvider | None = None
    unsupported: str | None = None
    follow_unsupported: str | None = None
    logger: RecordingLogger | None = None
    host_workspace: bool = False
    port: int = 8080


class CaseNotApplicable(Exception):
    """Raised by a case that cannot run with this config (say, no ``provider`` given); reported as a skip."""


# -- assertions -----------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        _fail(message)


def _equal(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        _fail(f"{what}: expected {expected!r}, got {actual!r}")


async def _raises(kind: type[_E], awaitable: Awaitable[object], what: str) -> _E:
    try:
        result = await awaitable
    except kind as exc:
        return exc
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        _fail(f"{what}: expected {kind.__name__}, got {type(exc).__name__}: {exc}")
    _fail(f"{what}: expected {kind.__name__}, but it returned {result!r}")


def _check_unsupported(exc: UnsupportedCapabilityError, handle_provider: str, what: str) -> None:
    _equal(exc.provider, handle_provider, f"{what}: UnsupportedCapabilityError.provider")
    _expect(isinstance(exc.capability, str) and bool(exc.capability), f"{what}: .capability is empty")
    text = str(exc)
    _expect(
        exc.provider in text and exc.capability in text,
        f"{what}: the message must name provider and capability: {text!r}",
    )


async def _unsupported(handle: SandboxHandle, awaitable: Awaitable[object], what: str) -> None:
    exc = await _raises(UnsupportedCapabilityError, awaitable, what)
    _check_unsupported(exc, handle.provider, what)


# -- sandboxes, streams, processes ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_sandbox(config: ProviderSuiteConfig) -> AsyncIterator[SandboxHandle]:
    """A new sandbox from ``config.create_handle``, disposed of when the block ends."""
    handle, dispose = await config.create_handle()
    try:
        yield handle
    finally:
        await dispose()


def _require_provider(config: ProviderSuiteConfig) -> SandboxProvider:
    if config.provider is None:
        raise CaseNotApplicable("needs ProviderSuiteConfig.provider (resume/destroy by id)")
    return config.provider


class _Reader:
    """Reads a single-consumer text stream incrementally, keeping what it saw."""

    def __init__(self, stream: AsyncIterator[str], what: str) -> None:
        self._it = stream.__aiter__()
        self._what = what
        self.text = ""
        self.eof = False

    async def _next(self) -> bool:
        try:
            self.text += await self._it.__anext__()
        except StopAsyncIteration:
            self.eof = True
            return False
        return True

    async def until(self, needle: str, timeout: float = _STEP) -> str:
        async def read() -> None:
            while needle not in self.text:
                if not await self._next():
                    _fail(f"{self._what}: the stream ended before {needle!r}; got {self.text!r}")

        try:
            await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            _fail(f"{self._what}: no {needle!r} within {timeout:g} s; got {self.text!r}")
        return self.text

    async def rest(self, timeout: float = _STEP, pause: float = 0.0) -> str:
        async def read() -> None:
            while await self._next():
                if pause:
                    await asyncio.sleep(pause)

        try:
            await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            _fail(f"{self._what}: the stream did not end within {timeout:g} s; got {self.text!r}")
        return self.text


async def _wait(process: SpawnHandle, what: str, timeout: float = _STEP) -> int:
    try:
        return await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        _fail(f"{what}: wait() did not resolve within {timeout:g} s")


async def _exec(handle: SandboxHandle, command: str, opts: ProcessOptions | None = None) -> ExecResult:
    try:
        return await asyncio.wait_for(handle.process.exec(command, opts), _STEP)
    except TimeoutError:
        _fail(f"exec {command!r} did not finish within {_STEP:g} s")


async def _ok(handle: SandboxHandle, command: str, opts: ProcessOptions | None = None) -> str:
    result = await _exec(handle, command, opts)
    if result.exit_code != 0:
        _fail(f"exec {command!r} exited {result.exit_code}: stdout={result.stdout!r} stderr={result.stderr!r}")
    return result.stdout


def _token() -> str:
    """A sleep duration no other process uses, so scans find only our probe."""
    return f"98765{secrets.randbelow(90000) + 10000}"


@contextlib.contextmanager
def _probe_tokens(count: int = 1) -> Iterator[list[str]]:
    """Fresh probe tokens; any host process still sleeping on one is SIGKILLed afterwards, so a
    provider that fails a kill case does not leave week-long sleeps behind."""
    tokens = [_token() for _ in range(count)]
    try:
        yield tokens
    finally:
        for token in tokens:
            for pid in host_pids(["sleep", token]):
                with contextlib.suppress(OSError):
                    os.kill(pid, signals.SIGKILL)


def host_pids(argv: Sequence[str]) -> list[int]:
    """Live host pids whose argv is exactly ``argv`` (empty where the host has no ``/proc``)."""
    needle = b"\x00".join(a.encode() for a in argv) + b"\x00"
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == needle:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _sandbox_scan(argv: str) -> str:
    # pgrep -x matches the whole command line, so neither it nor this sh matches itself.
    pattern = quote(argv)
    return (
        "if command -v pgrep >/dev/null 2>&1; then "
        f"if pgrep -fx {pattern} >/dev/null; then echo alive; else echo gone; fi; "
        "else r=gone; for d in /proc/[0-9]*; do "
        "c=$(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null) || continue; "
        f'case "$c" in {quote(argv + " ")}) r=alive; break;; esac; done; echo $r; fi'
    )


async def _alive(handle: SandboxHandle, token: str) -> tuple[bool, bool]:
    """Whether ``sleep <token>`` runs, as seen (inside the sandbox, on this host).

    A sandbox whose commands each get their own pid namespace (bubblewrap) cannot see
    another command's processes from inside; the host scan covers those.
    """
    inside = (await _ok(handle, _sandbox_scan(f"sleep {token}"))).strip() == "alive"
    return inside, bool(host_pids(["sleep", token]))


async def _expect_gone(handle: SandboxHandle, token: str, what: str, within: float = 0.0) -> None:
    deadline = time.monotonic() + within
    while True:
        inside, host = await _alive(handle, token)
        if not inside and not host:
            return
        if time.monotonic() >= deadline:
            where = " and ".join(w for w, seen in (("inside the sandbox", inside), ("on the host", host)) if seen)
            _fail(f"{what}: `sleep {token}` still runs {where}")
        await asyncio.sleep(0.1)


def _expect_gone_from_host(token: str, what: str) -> None:
    pids = host_pids(["sleep", token])
    _expect(not pids, f"{what}: `sleep {token}` still runs on the host (pids {pids})")


async def _start_probe(handle: SandboxHandle, token: str) -> tuple[SpawnHandle, _Reader]:
    """Spawn ``echo up; sleep <token>`` and return once it printed ``up`` and is observable."""
    process = await handle.process.spawn(f"echo up; sleep {token}")
    out = _Reader(process.stdout, "probe stdout")
    await out.until("up\n")
    inside, host = await _alive(handle, token)
    deadline = time.monotonic() + 5
    while not (inside or host) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        inside, host = await _alive(handle, token)
    _expect(inside or host, f"`sleep {token}` is visible neither inside the sandbox nor on the host")
    return process, out


def _warnings_since(config: ProviderSuiteConfig, mark: int) -> list[tuple[str, dict[str, Any]]]:
    return config.logger.warnings[mark:] if config.logger is not None else []


def _mark(config: ProviderSuiteConfig) -> int:
    return len(config.logger.warnings) if config.logger is not None else 0


# -- contract cases C1..C19 -----------------------------------------------------------------------


async def case_c01_fs_round_trip(config: ProviderSuiteConfig) -> None:
    """write/read/exists/list/rename/remove/mkdir under /workspace, and the shell sees the same files."""
    async with fresh_sandbox(config) as handle:
        fs = handle.fs
        await fs.write("/workspace/c1/a/b.txt", "héllo wörld")
        _equal(await fs.read("/workspace/c1/a/b.txt"), "héllo wörld", "read after write (parents created)")
        await fs.write("/workspace/c1/a/b.txt", "hi")
        _equal(await fs.read("/workspace/c1/a/b.txt"), "hi", "write truncates")
        _expect(await fs.exists("/workspace/c1/a/b.txt"), "exists(file) is False")
        _expect(await fs.exists("/workspace/c1/a"), "exists(dir) is False")
        _expect(not await fs.exists("/workspace/c1/missing"), "exists(missing) is True")
        await fs.mkdir("/workspace/c1/d/e/f")
        await fs.mkdir("/workspace/c1/d/e/f")
        _expect(await fs.exists("/workspace/c1/d/e/f"), "mkdir is not recursive")
        expected = [FsEntry("a", "/workspace/c1/a", "dir"), FsEntry("d", "/workspace/c1/d", "dir")]
        await fs.write("/workspace/c1/z.txt", "")
        expected.append(FsEntry("z.txt", "/workspace/c1/z.txt", "file"))
        for listed in ("/workspace/c1", "/workspace/c1/"):
            entries = sorted(await fs.list(listed), key=lambda e: e.name)
            _equal(entries, expected, f"list({listed!r})")
        await fs.rename("/workspace/c1/a/b.txt", "/workspace/c1/d/moved.txt")
        _expect(not await fs.exists("/workspace/c1/a/b.txt"), "rename left the source")
        _equal(await fs.read("/workspace/c1/d/moved.txt"), "hi", "read after rename")
        await fs.remove("/workspace/c1/d")
        _expect(not await fs.exists("/workspace/c1/d/moved.txt"), "remove is not recursive")
        _expect(not await fs.exists("/workspace/c1/d"), "remove left the directory")
        await fs.remove("/workspace/c1/d")
        await fs.remove("/workspace/c1/z.txt")
        _expect(not await fs.exists("/workspace/c1/z.txt"), "remove(file) left it")
        # The fs and the shell agree on where /workspace is.
        await fs.write("/workspace/c1/from-fs.txt", "from fs")
        _equal(await _ok(handle, "cat c1/from-fs.txt"), "from fs", "the shell reads what fs wrote")
        await _ok(handle, "printf from-shell > c1/from-shell.txt")
        _equal(await fs.read("/workspace/c1/from-shell.txt"), "from-shell", "fs reads what the shell wrote")


async def case_c02_bytes(config: ProviderSuiteConfig) -> None:
    """Bytes with 0x00 and 0xFA, and a 180 000-byte file, round-trip exactly."""
    async with fresh_sandbox(config) as handle:
        small = bytes(range(256)) + b"\x00\xfa\x00"
        await handle.fs.write("/workspace/c2/small.bin", small)
        _equal(await handle.fs.read_bytes("/workspace/c2/small.bin"), small, "small binary round trip")
        big = bytes((i * 7 + i // 251) % 256 for i in range(180_000))
        await handle.fs.write("/workspace/c2/big.bin", big)
        back = await handle.fs.read_bytes("/workspace/c2/big.bin")
        _expect(back == big, f"180 000-byte round trip differs (got {len(back)} bytes)")
        _equal((await _ok(handle, "wc -c < c2/big.bin")).strip(), "180000", "size the shell sees")


async def case_c03_lstat(config: ProviderSuiteConfig) -> None:
    """lstat: missing => None; file (size, also 0), dir, symlink unfollowed, fifo => other; bad input raises."""
    async with fresh_sandbox(config) as handle:
        fs = handle.fs
        _equal(await fs.lstat("/workspace/c3/missing"), None, "lstat(missing)")
        await fs.write("/workspace/c3/file.txt", "12345")
        await fs.write("/workspace/c3/empty.txt", "")
        await fs.mkdir("/workspace/c3/dir")
        await _ok(handle, "cd c3 && ln -s file.txt link && ln -s nowhere dangling && mkfifo fifo")
        found = await fs.lstat("/workspace/c3/file.txt")
        _expect(found is not None and found.type == "file" and found.size == 5, f"lstat(file) = {found!r}")
        _expect(found is not None and st.S_ISREG(found.mode), f"lstat(file).mode is not a full st_mode: {found!r}")
        found = await fs.lstat("/workspace/c3/empty.txt")
        _expect(found is not None and found.type == "file" and found.size == 0, f"lstat(empty) = {found!r}")
        found = await fs.lstat("/workspace/c3/dir")
        _expect(found is not None and found.type == "dir" and st.S_ISDIR(found.mode), f"lstat(dir) = {found!r}")
        for name in ("link", "dangling"):
            found = await fs.lstat(f"/workspace/c3/{name}")
            _expect(
                found is not None and found.type == "symlink" and st.S_ISLNK(found.mode),
                f"lstat({name}) must not follow the link: {found!r}",
            )
        found = await fs.lstat("/workspace/c3/fifo")
        _expect(found is not None and found.type == "other" and st.S_ISFIFO(found.mode), f"lstat(fifo) = {found!r}")
        try:
            bad = await fs.lstat("/workspace/c3/nul\x00byte")
        except Exception:
            pass
        else:
            _fail(f"lstat of a path with a NUL byte must raise, not report {bad!r}")


async def case_c04_path_escape(config: ProviderSuiteConfig) -> None:
    """/workspace/../../../etc/hosts raises SandboxPathError where the workspace is a host dir."""
    async with fresh_sandbox(config) as handle:
        escape = "/workspace/../../../etc/hosts"
        if not config.host_workspace:
            # The path names the sandbox's own /etc/hosts: it resolves inside, like the plain path.
            _equal(await handle.fs.read(escape), await handle.fs.read("/etc/hosts"), "read of a ..-path")
            return
        fs = handle.fs
        ops: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("read", lambda: fs.read(escape)),
            ("read_bytes", lambda: fs.read_bytes(escape)),
            ("exists", lambda: fs.exists(escape)),
            ("lstat", lambda: fs.lstat(escape)),
            ("list", lambda: fs.list("/workspace/../../../etc")),
        ]
        for what, op in ops:
            exc = await _raises(SandboxPathError, op(), f"{what}({escape!r})")
            _expect("workspace" in str(exc) or handle.workspace_root in str(exc), f"unclear message: {exc}")


async def case_c05_exec_exit_codes(config: ProviderSuiteConfig) -> None:
    """exec returns stdout, stderr and the code; `exit 7` => 7; a signal death => 128 + N."""
    async with fresh_sandbox(config) as handle:
        result = await _exec(handle, "echo out; echo err >&2")
        _equal((result.stdout, result.stderr, result.exit_code), ("out\n", "err\n", 0), "exec result")
        _equal((await _exec(handle, "echo before; exit 7")).exit_code, 7, "exit 7")
        _equal((await _exec(handle, "kill -TERM $$")).exit_code, 128 + signals.SIGTERM, "death by SIGTERM")
        _equal((await _exec(handle, "kill -KILL $$")).exit_code, 128 + signals.SIGKILL, "death by SIGKILL")


async def case_c06_spawn_streams(config: ProviderSuiteConfig) -> None:
    """spawn streams to EOF; wait() => 0; 20 lines read slowly after an early exit stay in order."""
    async with fresh_sandbox(config) as handle:
        caps = handle.capabilities
        process = await handle.process.spawn(
            'i=1; while [ "$i" -le 20 ]; do echo "line$i"; i=$((i+1)); done; echo done >&2'
        )
        _equal(await _wait(process, "20 lines"), 0, "wait() after the lines")
        out = await _Reader(process.stdout, "stdout").rest(pause=0.01)
        _equal(out.splitlines(), [f"line{i}" for i in range(1, 21)], "lines read slowly after exit")
        _equal(await _Reader(process.stderr, "stderr").rest(), "done\n", "stderr")
        _equal(list(await asyncio.gather(process.wait(), process.wait(), process.wait())), [0, 0, 0], "waits")
        _equal(await process.wait(), 0, "wait() once more")
        if not caps.background_processes:
            return
        # Streaming is causal: the command only ends once we saw its first line and opened the gate.
        process = await handle.process.spawn(
            "echo first; n=0; while [ ! -e c6-gate ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; "
            "echo second; exit 3"
        )
        out_reader = _Reader(process.stdout, "streaming stdout")
        await out_reader.until("first\n")
        _expect("second" not in out_reader.text, "saw `second` before opening the gate")
        await handle.fs.write("/workspace/c6-gate", "")
        _equal(await out_reader.rest(), "first\nsecond\n", "stdout after the gate")
        _equal(await _wait(process, "gated"), 3, "exit code of the gated command")


async def case_c07_utf8_split(config: ProviderSuiteConfig) -> None:
    """A `€` split across writes arrives whole; a lone lead byte at EOF is exactly U+FFFD."""
    split = r"printf '\342\202'; sleep 0.1; printf '\254lo'"
    lone = r"printf '\342'"
    async with fresh_sandbox(config) as handle:
        process = await handle.process.spawn(split)
        _equal(await _Reader(process.stdout, "stdout").rest(), "€lo", "spawn stdout of a split €")
        _equal(await _wait(process, "split"), 0, "exit code")
        process = await handle.process.spawn(lone)
        _equal(await _Reader(process.stdout, "stdout").rest(), "\ufffd", "spawn stdout of a lone lead byte")
        await _wait(process, "lone")
        _equal((await _exec(handle, split)).stdout, "€lo", "exec stdout of a split €")
        _equal((await _exec(handle, lone)).stdout, "\ufffd", "exec stdout of a lone lead byte")
        err = await _exec(handle, r"printf '\342\202' >&2; sleep 0.1; printf '\254' >&2; printf '\342' >&2")
        _equal(err.stderr, "€\ufffd", "exec stderr")


async def case_c08_env_and_cwd(config: ProviderSuiteConfig) -> None:
    """env.set reaches the next exec; per-command env overrides it; cwd is honoured (default: workspace)."""
    async with fresh_sandbox(config) as handle:
        if handle.capabilities.env:
            handle.env.set({"BW_C8": "from-set", "BW_C8_OTHER": "kept"})
            _equal(await _ok(handle, 'printf %s "$BW_C8"'), "from-set", "env.set reaches exec")
            opts = ProcessOptions(env={"BW_C8": "override"})
            _equal(await _ok(handle, 'printf %s "$BW_C8/$BW_C8_OTHER"', opts), "override/kept", "per-command env")
            _equal(await _ok(handle, 'printf %s "$BW_C8"'), "from-set", "a per-command env must not stick")
            _equal(handle.env.get().get("BW_C8"), "from-set", "env.get()")
            process = await handle.process.spawn('printf %s "$BW_C8"')
            _equal(await _Reader(process.stdout, "stdout").rest(), "from-set", "env.set reaches spawn")
            await _wait(process, "spawn env")
        await handle.fs.mkdir("/workspace/c8/sub")
        await _ok(handle, "printf x > here.txt", ProcessOptions(cwd="/workspace/c8/sub"))
        _equal(await handle.fs.read("/workspace/c8/sub/here.txt"), "x", "exec cwd=/workspace/c8/sub")
        pwd = (await _ok(handle, "pwd", ProcessOptions(cwd="/workspace/c8/sub"))).strip()
        _expect(pwd.endswith("/c8/sub"), f"pwd in /workspace/c8/sub printed {pwd!r}")
        await _ok(handle, "printf y > rel.txt", ProcessOptions(cwd="c8/sub"))
        _equal(await handle.fs.read("/workspace/c8/sub/rel.txt"), "y", "relative cwd is under /workspace")
        await _ok(handle, "printf z > c8-root.txt")
        _equal(await handle.fs.read("/workspace/c8-root.txt"), "z", "default cwd is the workspace root")
        process = await handle.process.spawn("pwd", ProcessOptions(cwd="/workspace/c8/sub"))
        spawned = (await _Reader(process.stdout, "stdout").rest()).strip()
        _equal(spawned, pwd, "spawn honours cwd")
        await _wait(process, "spawn cwd")


async def case_c09_resume(config: ProviderSuiteConfig) -> None:
    """resume of a live id keeps the id and files; of a destroyed id => None."""
    provider = _require_provider(config)
    async with fresh_sandbox(config) as handle:
        await handle.fs.write("/workspace/c9.txt", "still here")
        resumed = await provider.resume(ResumeInput(id=handle.id))
        _expect(resumed is not None, f"resume({handle.id!r}) of a live sandbox returned None")
        assert resumed is not None
        _equal(resumed.id, handle.id, "resumed id")
        _equal(await resumed.fs.read("/workspace/c9.txt"), "still here", "file after resume")
        _equal(await _ok(resumed, "cat c9.txt"), "still here", "exec after resume")
        await handle.destroy()
        _equal(await provider.resume(ResumeInput(id=handle.id)), None, "resume of a destroyed sandbox")


async def case_c10_unsupported_ops(config: ProviderSuiteConfig) -> None:
    """Every op outside the capabilities raises UnsupportedCapabilityError naming provider and capability."""
    async with fresh_sandbox(config) as handle:
        caps = handle.capabilities
        _expect(isinstance(caps, Capabilities), f"capabilities is {type(caps).__name__}, not Capabilities")
        _expect(caps.fs and caps.exec, "fs and exec are always true")
        if config.provider is not None:
            _equal(config.provider.capabilities(), caps, "provider.capabilities() vs handle.capabilities")
            _equal(config.provider.name, handle.provider, "provider.name vs handle.provider")
        if not caps.snapshots:
            await _unsupported(handle, handle.snapshot("c10"), "snapshot() without `snapshots`")
        if not caps.fork:
            await _unsupported(handle, handle.fork(), "fork() without `fork`")
        if not caps.ports:
            await _unsupported(handle, handle.ports.connect(config.port), "ports.connect() without `ports`")
        if not caps.writable_stdin:
            process = await handle.process.spawn("cat")
            try:
                await _unsupported(handle, process.stdin.write("x"), "stdin.write() without `writable_stdin`")
                await process.stdin.end()
            finally:
                await process.kill()
        if not caps.network_policy and config.provider is not None:
            deny = CreateInput(network=NetworkPolicy(mode="deny"))
            try:
                created = await config.provider.create(deny)
            except UnsupportedCapabilityError as exc:
                _check_unsupported(exc, handle.provider, "create(network=deny) without `network_policy`")
            else:
                await created.destroy()
                _fail("create(network=deny) without `network_policy` must raise, not drop the policy")


async def case_c11_destroy_ends_processes(config: ProviderSuiteConfig) -> None:
    """destroy() ends every process the handle started, and a second destroy() is fine."""
    with _probe_tokens() as (token,):
        async with fresh_sandbox(config) as handle:
            process, out = await _start_probe(handle, token)
            await asyncio.wait_for(handle.destroy(), 60)
            await _wait(process, "process of a destroyed sandbox", 15)
            await out.rest(15)
            _expect_gone_from_host(token, "after destroy()")
            await asyncio.wait_for(handle.destroy(), 60)


async def case_c12_stdin(config: ProviderSuiteConfig) -> None:
    """stdin reaches `sh` incrementally (a persistent shell keeps state); `cat` echoes after end() and exits 0."""
    async with fresh_sandbox(config) as handle:
        if not handle.capabilities.writable_stdin:
            process = await handle.process.spawn("cat")
            try:
                await _unsupported(handle, process.stdin.write("hi\n"), "stdin.write() without `writable_stdin`")
                await process.stdin.end()
            finally:
                await process.kill()
            return
        shell = await handle.process.spawn("sh")
        out = _Reader(shell.stdout, "sh stdout")
        await shell.stdin.write("echo hi\n")
        await out.until("hi\n")
        _expect(not out.eof, "stdout ended before stdin did")
        await shell.stdin.write("mkdir -p c12 && cd c12 && X=42\n")
        await shell.stdin.write(b'echo "x=$X in ${PWD##*/}"\n')
        await out.until("x=42 in c12\n")
        await shell.stdin.end()
        _equal(await out.rest(), "hi\nx=42 in c12\n", "sh stdout at EOF")
        _equal(await _wait(shell, "sh after end()"), 0, "sh exit code")

        cat = await handle.process.spawn("cat")
        out = _Reader(cat.stdout, "cat stdout")
        await cat.stdin.write("one\n")
        await out.until("one\n")
        await cat.stdin.write("two ")
        await cat.stdin.write(b"\xe2\x82")
        await cat.stdin.write(b"\xac")
        await cat.stdin.end()
        _equal(await out.rest(), "one\ntwo €", "cat echoes everything after end()")
        _equal(await _wait(cat, "cat after end()"), 0, "cat exit code")


async def case_c13_kill_ends_process(config: ProviderSuiteConfig) -> None:
    """A killed `echo up; sleep N` is gone from the sandbox."""
    with _probe_tokens() as (token,):
        async with fresh_sandbox(config) as handle:
            process, out = await _start_probe(handle, token)
            await asyncio.wait_for(process.kill(), _STEP)
            if not handle.capabilities.killable_processes:
                return
            await _expect_gone(handle, token, "after kill()", within=2.0)
            code = await _wait(process, "killed probe", 15)
            _expect(code > 128, f"a killed process reports 128 + signal, got {code}")
            await out.rest(15)


async def case_c14_kill_timing(config: ProviderSuiteConfig) -> None:
    """kill() returns once the process is gone; kill right after spawn kills; kill after exit is fast and quiet."""
    with _probe_tokens(2) as (probe, early):
        async with fresh_sandbox(config) as handle:
            if handle.capabilities.killable_processes:
                process, _ = await _start_probe(handle, probe)
                await asyncio.wait_for(process.kill(), _STEP)
                await _expect_gone(handle, probe, "right after kill() returned")
                process = await handle.process.spawn(f"sleep {early}")
                await asyncio.wait_for(process.kill(), _STEP)
                code = await _wait(process, "process killed right after spawn", 15)
                _expect(code != 0, f"a process killed right after spawn exited 0 (exit {code})")
                await _expect_gone(handle, early, "kill right after spawn", within=2.0)
            await _kill_after_exit_is_quiet(config, handle)


async def _kill_after_exit_is_quiet(config: ProviderSuiteConfig, handle: SandboxHandle) -> None:
    process = await handle.process.spawn("true")
    _equal(await _wait(process, "true"), 0, "exit code of `true`")
    mark = _mark(config)
    started = time.monotonic()
    await asyncio.wait_for(process.kill(), _STEP)
    await asyncio.wait_for(process.kill(signals.SIGKILL), _STEP)
    elapsed = time.monotonic() - started
    _expect(elapsed < 1.0, f"kill() after a clean exit took {elapsed:.2f} s (must be < 1 s)")
    _equal(_warnings_since(config, mark), [], "logger warnings from kill() after a clean exit")
    _equal(await process.wait(), 0, "wait() after a late kill keeps the exit code")


async def case_c15_ports(config: ProviderSuiteConfig) -> None:
    """ports.connect gives a URL of the right shape; an invalid port raises."""
    async with fresh_sandbox(config) as handle:
        if not handle.capabilities.ports:
            await _unsupported(handle, handle.ports.connect(config.port), "ports.connect() without `ports`")
            return
        channel = await handle.ports.connect(config.port)
        url = urllib.parse.urlsplit(channel.url)
        _expect(url.scheme in ("http", "https", "ws", "wss"), f"channel URL scheme: {channel.url!r}")
        _expect(bool(url.hostname) and not re.search(r"\s", channel.url), f"channel URL host: {channel.url!r}")
        _expect(
            channel.headers is None
            or all(isinstance(k, str) and isinstance(v, str) for k, v in channel.headers.items()),
            f"channel headers must be str -> str: {channel.headers!r}",
        )
        for bad in (0, -1, 65536):
            await _raises(Exception, handle.ports.connect(bad), f"ports.connect({bad})")


async def case_c16_snapshots(config: ProviderSuiteConfig) -> None:
    """With `snapshots`: the artifact restores with the files. Without: snapshot() raises."""
    async with fresh_sandbox(config) as handle:
        if not handle.capabilities.snapshots:
            await _unsupported(handle, handle.snapshot("c16"), "snapshot() without `snapshots`")
            return
        await handle.fs.write("/workspace/c16.txt", "snapshotted")
        ref = await handle.snapshot("c16")
        _expect(isinstance(ref.id, str) and bool(ref.id), f"snapshot id: {ref!r}")
        restore = config.provider.restore_snapshot if config.provider is not None else None
        if restore is None:
            return
        restored = await restore(RestoreInput(snapshot_id=ref.id))
        try:
            _expect(restored.id != handle.id, "a restored sandbox is a new sandbox")
            _equal(await restored.fs.read("/workspace/c16.txt"), "snapshotted", "file in the restored sandbox")
        finally:
            await restored.destroy()


async def case_c17_fork(config: ProviderSuiteConfig) -> None:
    """With `fork`: files copied, new id, independent, env kept, independent destroy. Without: fork() raises."""
    async with fresh_sandbox(config) as handle:
        if not handle.capabilities.fork:
            await _unsupported(handle, handle.fork(), "fork() without `fork`")
            return
        await handle.fs.write("/workspace/c17/a.txt", "parent")
        handle.env.set({"BW_C17": "env-kept"})
        child = await handle.fork()
        try:
            _expect(child.id != handle.id, "a fork has a new id")
            _equal(await child.fs.read("/workspace/c17/a.txt"), "parent", "file copied into the fork")
            await child.fs.write("/workspace/c17/a.txt", "child")
            _equal(await handle.fs.read("/workspace/c17/a.txt"), "parent", "a fork's write reaches the parent")
            await handle.fs.write("/workspace/c17/b.txt", "parent only")
            _expect(not await child.fs.exists("/workspace/c17/b.txt"), "a parent's write reaches the fork")
            _equal(await _ok(child, 'printf %s "$BW_C17"'), "env-kept", "the fork keeps the handle env")
            await child.destroy()
            _equal(await _ok(handle, "cat c17/a.txt"), "parent", "the parent works after the fork's destroy")
        finally:
            await child.destroy()


async def _listing(handle: SandboxHandle) -> tuple[set[str], set[str]]:
    workspace = set((await _ok(handle, "find . -print")).splitlines())
    tmp = set((await _ok(handle, "ls -A /tmp")).splitlines())
    return workspace, tmp


def _helper_like(name: str) -> bool:
    return name.endswith(".pid") or (name.startswith(".") and "boxwright" in name.lower())


async def case_c18_no_helper_files(config: ProviderSuiteConfig) -> None:
    """No helper or pid files stay in the workspace or /tmp after clean spawns and signalled execs."""
    async with fresh_sandbox(config) as handle:
        workspace_before, tmp_before = await _listing(handle)
        for _ in range(3):
            process = await handle.process.spawn("echo hi")
            await _Reader(process.stdout, "stdout").rest()
            _equal(await _wait(process, "echo"), 0, "clean spawn")
        await _ok(handle, "true")
        _equal((await _exec(handle, "kill -TERM $$")).exit_code, 143, "self-signalled exec")
        controller = AbortController()
        asyncio.get_running_loop().call_later(0.5, controller.abort, "c18")
        aborted = await _exec(handle, "sleep 30", ProcessOptions(signal=controller.signal))
        _expect(aborted.exit_code > 128, f"aborted exec exit code {aborted.exit_code}")
        process = await handle.process.spawn("sleep 30")
        await asyncio.sleep(0.3)
        await process.kill()
        await _wait(process, "killed spawn")
        workspace_after, tmp_after = await _listing(handle)
        _equal(sorted(workspace_after - workspace_before), [], "new files in the workspace")
        left = sorted(n for n in tmp_after - tmp_before if _helper_like(n))
        _equal(left, [], "helper/pid files left in /tmp")


async def _ensure(
    config: ProviderSuiteConfig, records: dict[str, str], key: str, setup: str
) -> tuple[SandboxHandle, Dispose | None, bool]:
    """Resume the recorded sandbox of ``key``, else create one and run ``setup`` in it.

    A stand-in for the framework's ``ensure()`` (spec §1), enough to check that a
    provider supports it. Returns the handle, a dispose for a new sandbox (None when
    resumed) and whether it was resumed.
    """
    provider = _require_provider(config)
    recorded = records.get(key)
    if recorded is not None:
        resumed = await provider.resume(ResumeInput(id=recorded))
        if resumed is not None:
            return resumed, None, True
    handle, dispose = await config.create_handle()
    try:
        result = await handle.process.exec(setup)
        if result.exit_code != 0:
            raise SandboxCommandError("setup", result.exit_code, result.stderr)
    except BaseException:
        await dispose()
        raise
    records[key] = handle.id
    return handle, dispose, False


async def case_c19_ensure_resumes(config: ProviderSuiteConfig) -> None:
    """ensure runs setup once; a second ensure resumes the same sandbox; after destroy it creates anew."""
    _require_provider(config)
    records: dict[str, str] = {}
    setup = "echo ran >> c19-setup.log"
    disposers: list[Dispose] = []
    try:
        first, dispose, resumed = await _ensure(config, records, "c19", setup)
        _expect(not resumed and dispose is not None, "the first ensure must create")
        assert dispose is not None
        disposers.append(dispose)
        await first.fs.write("/workspace/c19-state.txt", "kept")
        second, _, resumed = await _ensure(config, records, "c19", setup)
        _expect(resumed, "the second ensure must resume the recorded sandbox")
        _equal(second.id, first.id, "id of the resumed sandbox")
        _equal(await second.fs.read("/workspace/c19-setup.log"), "ran\n", "setup ran exactly once")
        _equal(await _ok(second, "cat c19-state.txt"), "kept", "state in the resumed sandbox")
        await first.destroy()
        third, dispose, resumed = await _ensure(config, records, "c19", setup)
        _expect(not resumed and dispose is not None, "ensure after destroy must create a new sandbox")
        assert dispose is not None
        disposers.append(dispose)
        _expect(
            not await third.fs.exists("/workspace/c19-state.txt"), "the new sandbox holds the destroyed one's files"
        )
        _equal(await third.fs.read("/workspace/c19-setup.log"), "ran\n", "setup of the new sandbox")
    finally:
        for dispose in disposers:
            await dispose()


# -- the seed's kill case and bad input -----------------------------------------------------------


async def case_kill_stops_delayed_writes(config: ProviderSuiteConfig) -> None:
    """`sleep 5 && touch M` and `( sleep 5 && touch M ) & wait`, stopped after ~1 s by kill(), an aborted
    spawn signal, an aborted exec signal (and a cancelled exec): after >= 7 s no marker exists."""
    async with fresh_sandbox(config) as handle:
        killable = handle.capabilities.killable_processes
        run = secrets.token_hex(4)
        shapes = {"plain": "sleep 5 && touch {m}", "background": "( sleep 5 && touch {m} ) & wait"}
        loop = asyncio.get_running_loop()
        problems: list[str] = []

        async def by_kill(marker: str, command: str) -> None:
            process = await handle.process.spawn(command)
            await asyncio.sleep(1)
            await asyncio.wait_for(process.kill(), _STEP)
            code = await _wait(process, f"killed {marker}", 15)
            if killable and code <= 128:
                problems.append(f"{marker}: a killed process exited {code}, not 128 + signal")

        async def by_abort_spawn(marker: str, command: str) -> None:
            controller = AbortController()
            process = await handle.process.spawn(command, ProcessOptions(signal=controller.signal))
            await asyncio.sleep(1)
            controller.abort("test: abort spawn")
            code = await _wait(process, f"aborted spawn {marker}", 15)
            if killable and code <= 128:
                problems.append(f"{marker}: an aborted spawn exited {code}, not 128 + signal")

        async def by_abort_exec(marker: str, command: str) -> None:
            controller = AbortController()
            up = f"/tmp/{marker}.up"

            async def abort_once_started() -> None:
                # Not at a fixed second: on a loaded machine a remote exec may not have printed yet,
                # and "the output so far" would be nothing. Up to 4 s, inside the command's 5 s sleep.
                deadline = loop.time() + 4
                while loop.time() < deadline:
                    if (await handle.process.exec(f"test -e {up}")).exit_code == 0:
                        break
                    await asyncio.sleep(0.1)
                controller.abort("test: abort exec")

            async with asyncio.TaskGroup() as group:
                group.create_task(abort_once_started())
                result = await _exec(
                    handle, f"echo started; : > {up}; {command}", ProcessOptions(signal=controller.signal)
                )
            if result.stdout != "started\n":
                problems.append(f"{marker}: an aborted exec must resolve with the output so far, got {result!r}")
            if killable and not 128 < result.exit_code <= 128 + 64:
                problems.append(f"{marker}: an aborted exec resolved with exit {result.exit_code}, not 128 + signal")

        async def by_cancel(marker: str, command: str) -> None:
            task = asyncio.ensure_future(handle.process.exec(command))
            await asyncio.sleep(1)
            task.cancel()
            try:
                await asyncio.wait_for(task, _STEP)
            except asyncio.CancelledError:
                return
            problems.append(f"{marker}: a cancelled exec must re-raise CancelledError")

        jobs: list[Awaitable[None]] = []
        markers: list[str] = []
        for how, stop in (("kill", by_kill), ("abort-spawn", by_abort_spawn), ("abort-exec", by_abort_exec)):
            for shape, template in shapes.items():
                marker = f"kill-{run}-{how}-{shape}"
                markers.append(marker)
                jobs.append(stop(marker, template.format(m=marker)))
        cancel_marker = f"kill-{run}-cancel-exec-plain"
        markers.append(cancel_marker)
        jobs.append(by_cancel(cancel_marker, shapes["plain"].format(m=cancel_marker)))
        control = f"kill-{run}-control"

        async def unstopped() -> None:
            await _ok(handle, f"sleep 1 && touch {control}")

        jobs.append(unstopped())
        started = loop.time()
        await asyncio.gather(*jobs)
        await asyncio.sleep(max(0.0, started + 7.5 - loop.time()))
        _equal((await _exec(handle, f"test -e {control}")).exit_code, 0, "the unkilled control wrote its marker")
        _equal(problems, [], "stopped commands")
        if not killable:
            return
        existing = [m for m in markers if (await _exec(handle, f"test -e {m}")).exit_code == 0]
        _equal(existing, [], "markers written by commands that were stopped after ~1 s")


async def case_bad_path_escape(config: ProviderSuiteConfig) -> None:
    """Paths out of the workspace (`..`, or a symlink to /etc or another host dir) raise SandboxPathError."""
    if not config.host_workspace:
        raise CaseNotApplicable("the workspace is not a host directory (host_workspace=False)")
    async with fresh_sandbox(config) as handle:
        fs = handle.fs
        outside = os.path.dirname(handle.workspace_root.rstrip("/"))
        name = f"boxwright-escape-{secrets.token_hex(4)}"
        checks: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("write ..", lambda: fs.write(f"/workspace/../{name}", "x")),
            ("mkdir ..", lambda: fs.mkdir(f"/workspace/../{name}")),
            ("list ..", lambda: fs.list("/workspace/..")),
            ("lstat ..", lambda: fs.lstat(f"/workspace/../{name}")),
            ("remove ..", lambda: fs.remove(f"/workspace/../{name}")),
            ("rename to ..", lambda: fs.rename("/workspace/in.txt", f"/workspace/../{name}")),
            ("relative ..", lambda: fs.read(f"../../{name}")),
            ("exec cwd ..", lambda: handle.process.exec("true", ProcessOptions(cwd="/workspace/../.."))),
        ]
        await fs.write("/workspace/in.txt", "inside")
        for what, op in checks:
            await _raises(SandboxPathError, op(), what)
            _expect(not os.path.exists(os.path.join(outside, name)), f"{what} created {name} outside the workspace")
        target = await asyncio.to_thread(_host_tempdir)
        try:
            await _ok(handle, f"ln -s /etc etc-link && ln -s {quote(target)} host-link")
            links: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("read via a link to /etc", lambda: fs.read("/workspace/etc-link/hosts")),
                ("list via a link to /etc", lambda: fs.list("/workspace/etc-link")),
                ("write via a link out", lambda: fs.write("/workspace/host-link/planted.txt", "x")),
                ("exec cwd via a link", lambda: handle.process.exec("true", ProcessOptions(cwd="/workspace/etc-link"))),
            ]
            for what, op in links:
                await _raises(SandboxPathError, op(), what)
            _equal(os.listdir(target), ["canary.txt"], "the host directory behind a symlink")
            # The link itself is inside: lstat and remove act on the link, never on its target.
            found = await fs.lstat("/workspace/host-link")
            _expect(found is not None and found.type == "symlink", f"lstat of the link itself: {found!r}")
            await fs.remove("/workspace/host-link")
            _expect(await fs.lstat("/workspace/host-link") is None, "remove left the link")
            _expect(os.path.isfile(os.path.join(target, "canary.txt")), "remove of a link deleted its target")
        finally:
            await asyncio.to_thread(shutil.rmtree, target, True)


def _host_tempdir() -> str:
    target = tempfile.mkdtemp(prefix="boxwright-outside-")
    with open(os.path.join(target, "canary.txt"), "w") as f:
        f.write("host only")
    return target


async def case_bad_missing_command(config: ProviderSuiteConfig) -> None:
    """A command that does not exist exits 127 with stderr naming it (exec and spawn)."""
    name = f"boxwright-no-such-command-{secrets.token_hex(3)}"
    async with fresh_sandbox(config) as handle:
        result = await _exec(handle, f"{name} --flag")
        _equal(result.exit_code, 127, "exit code of a missing command")
        _expect(name in result.stderr, f"stderr must name the missing command: {result.stderr!r}")
        process = await handle.process.spawn(name)
        err = await _Reader(process.stderr, "stderr").rest()
        _equal(await _wait(process, "missing command"), 127, "spawn exit code of a missing command")
        _expect(name in err, f"spawn stderr must name the missing command: {err!r}")


async def case_bad_stdin_after_exit(config: ProviderSuiteConfig) -> None:
    """stdin written after the process exited (or after end()) raises ProcessExitedError, clearly."""
    async with fresh_sandbox(config) as handle:
        if not handle.capabilities.writable_stdin:
            process = await handle.process.spawn("true")
            await _wait(process, "true")
            await _unsupported(handle, process.stdin.write("x"), "stdin.write() without `writable_stdin`")
            return
        process = await handle.process.spawn("true")
        _equal(await _wait(process, "true"), 0, "exit code")
        exc = await _raises(ProcessExitedError, process.stdin.write("late\n"), "stdin.write() after exit")
        _expect("exit" in str(exc) or "closed" in str(exc), f"unclear message: {exc}")
        await process.stdin.end()
        cat = await handle.process.spawn("cat")
        await cat.stdin.end()
        exc = await _raises(ProcessExitedError, cat.stdin.write("late\n"), "stdin.write() after end()")
        _expect("end" in str(exc) or "closed" in str(exc), f"unclear message: {exc}")
        _equal(await _wait(cat, "cat"), 0, "cat exit code after end()")


async def case_bad_kill_after_exit(config: ProviderSuiteConfig) -> None:
    """kill() of a process that already exited returns at once, without error or warning."""
    async with fresh_sandbox(config) as handle:
        for command, code in (("true", 0), ("exit 3", 3), ("kill -TERM $$", 143)):
            process = await handle.process.spawn(command)
            _equal(await _wait(process, command), code, f"exit code of {command!r}")
            mark = _mark(config)
            started = time.monotonic()
            await asyncio.wait_for(process.kill(), _STEP)
            await asyncio.wait_for(process.kill(signals.SIGKILL), _STEP)
            elapsed = time.monotonic() - started
            _expect(elapsed < 1.0, f"kill() after {command!r} exited took {elapsed:.2f} s")
            _equal(_warnings_since(config, mark), [], f"logger warnings from kill() after {command!r}")
            _equal(await process.wait(), code, f"exit code of {command!r} after a late kill()")


async def case_bad_workspace_deleted(config: ProviderSuiteConfig) -> None:
    """A workspace root deleted under a live handle makes exec raise SandboxNotFoundError (clear message)."""
    async with fresh_sandbox(config) as handle:
        if not config.host_workspace:
            await _exec(handle, f"rm -rf {quote(handle.workspace_root)}")
            try:
                result = await _exec(handle, "pwd")
            except BoxwrightError:
                return
            _expect(result.exit_code != 0, f"exec in a deleted workspace ran: {result!r}")
            return
        await asyncio.to_thread(shutil.rmtree, handle.workspace_root)
        exc = await _raises(SandboxNotFoundError, handle.process.exec("true"), "exec after the root was deleted")
        _expect(handle.id in str(exc) or "gone" in str(exc), f"unclear message: {exc}")
        await _raises(SandboxNotFoundError, handle.process.spawn("true"), "spawn after the root was deleted")


async def case_bad_aborted_signal(config: ProviderSuiteConfig) -> None:
    """A signal already aborted at call time raises AbortError before anything starts."""
    async with fresh_sandbox(config) as handle:
        controller = AbortController()
        controller.abort("already")
        opts = ProcessOptions(signal=controller.signal)
        exc = await _raises(AbortError, handle.process.exec("touch pre-exec", opts), "exec with an aborted signal")
        _equal(exc.reason, "already", "AbortError.reason")
        await _raises(AbortError, handle.process.spawn("touch pre-spawn", opts), "spawn with an aborted signal")
        if config.provider is not None:
            created: SandboxHandle | None = None
            try:
                created = await config.provider.create(CreateInput(signal=controller.signal))
            except AbortError:
                pass
            finally:
                if created is not None:
                    await created.destroy()
            _expect(created is None, "create() with an aborted signal must raise AbortError")
        await asyncio.sleep(0.3)
        ran = await _ok(handle, "for f in pre-exec pre-spawn; do test -e $f && echo $f; done; true")
        _equal(ran, "", "commands started despite an aborted signal")


CASES: tuple[tuple[str, Case], ...] = (
    ("test_c01_fs_round_trip", case_c01_fs_round_trip),
    ("test_c02_bytes", case_c02_bytes),
    ("test_c03_lstat", case_c03_lstat),
    ("test_c04_path_escape", case_c04_path_escape),
    ("test_c05_exec_exit_codes", case_c05_exec_exit_codes),
    ("test_c06_spawn_streams", case_c06_spawn_streams),
    ("test_c07_utf8_split", case_c07_utf8_split),
    ("test_c08_env_and_cwd", case_c08_env_and_cwd),
    ("test_c09_resume", case_c09_resume),
    ("test_c10_unsupported_ops", case_c10_unsupported_ops),
    ("test_c11_destroy_ends_processes", case_c11_destroy_ends_processes),
    ("test_c12_stdin", case_c12_stdin),
    ("test_c13_kill_ends_process", case_c13_kill_ends_process),
    ("test_c14_kill_timing", case_c14_kill_timing),
    ("test_c15_ports", case_c15_ports),
    ("test_c16_snapshots", case_c16_snapshots),
    ("test_c17_fork", case_c17_fork),
    ("test_c18_no_helper_files", case_c18_no_helper_files),
    ("test_c19_ensure_resumes", case_c19_ensure_resumes),
    ("test_kill_stops_delayed_writes", case_kill_stops_delayed_writes),
    ("test_bad_path_escape", case_bad_path_escape),
    ("test_bad_missing_command", case_bad_missing_command),
    ("test_bad_stdin_after_exit", case_bad_stdin_after_exit),
    ("test_bad_kill_after_exit", case_bad_kill_after_exit),
    ("test_bad_workspace_deleted", case_bad_workspace_deleted),
    ("test_bad_aborted_signal", case_bad_aborted_signal),
)


# -- pytest glue ----------------------------------------------------------------------------------


def _slug(text: str, limit: int = 60) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()[:limit].rstrip("_") or "unknown"


def integration_required() -> bool:
    """Under CI (``CI=true``) or with ``BOXWRIGHT_REQUIRE_INTEGRATION=1``, a missing component fails, never skips."""
    return os.environ.get(REQUIRE_INTEGRATION_ENV) == "1" or os.environ.get("CI", "").lower() == "true"


def skip_unavailable(name: str, reason: str) -> NoReturn:
    """Skip because ``name`` cannot run here, or fail when integration is required (see ``integration_required``)."""
    import pytest

    message = f"{name}: {reason}"
    if integration_required():
        pytest.fail(f"{message} ({REQUIRE_INTEGRATION_ENV}=1 requires it to run)")
    pytest.skip(message)


def run_case(config: ProviderSuiteConfig, case: Case, timeout: float = CASE_TIMEOUT) -> None:
    """Run one case to completion on a fresh event loop; the timeout only catches hangs."""
    import pytest

    async def bounded() -> None:
        try:
            await asyncio.wait_for(case(config), timeout)
        except TimeoutError:
            _fail(f"{config.name}: {case.__name__} hung for {timeout:g} s")

    try:
        asyncio.run(bounded())
    except CaseNotApplicable as exc:
        pytest.skip(f"{config.name}: {exc}")


def _test_method(config: ProviderSuiteConfig, name: str, case: Case) -> Callable[[object], None]:
    def test(self: object) -> None:
        run_case(config, case)

    test.__name__ = test.__qualname__ = name
    test.__doc__ = case.__doc__
    return test


def provider_contract_suite(config: ProviderSuiteConfig) -> type:
    """A pytest-collectable class with one sync test per conformance case for ``config``.

    Bind it to a module-level ``Test...`` name. With ``config.unsupported`` set, the
    class holds a single ``test_unavailable_<reason>`` that skips (or fails under
    ``BOXWRIGHT_REQUIRE_INTEGRATION=1``) naming the cause.
    """
    class_name = f"TestProviderContract_{_slug(config.name)}"
    namespace: dict[str, Any] = {"__doc__": f"Provider conformance suite for {config.name!r}.", "config": config}
    if config.unsupported is not None:
        reason = config.unsupported
        test_name = f"test_unavailable_{_slug(reason)}"

        def unavailable(self: object) -> None:
            skip_unavailable(config.name, reason)

        unavailable.__name__ = unavailable.__qualname__ = test_name
        namespace[test_name] = unavailable
    else:
        for test_name, case in CASES:
            namespace[test_name] = _test_method(config, test_name, case)
    caller = sys._getframe(1).f_globals.get("__name__")
    if isinstance(caller, str):
        namespace["__module__"] = caller
    return type(class_name, (), namespace)


__all__ = [
    "CASES",
    "CASE_TIMEOUT",
    "REQUIRE_INTEGRATION_ENV",
    "Case",
    "CaseNotApplicable",
    "CreateHandle",
    "Dispose",
    "ProviderSuiteConfig",
    "RecordingLogger",
    "case_bad_aborted_signal",
    "case_bad_kill_after_exit",
    "case_bad_missing_command",
    "case_bad_path_escape",
    "case_bad_stdin_after_exit",
    "case_bad_workspace_deleted",
    "case_c01_fs_round_trip",
    "case_c02_bytes",
    "case_c03_lstat",
    "case_c04_path_escape",
    "case_c05_exec_exit_codes",
    "case_c06_spawn_streams",
    "case_c07_utf8_split",
    "case_c08_env_and_cwd",
    "case_c09_resume",
    "case_c10_unsupported_ops",
    "case_c11_destroy_ends_processes",
    "case_c12_stdin",
    "case_c13_kill_ends_process",
    "case_c14_kill_timing",
    "case_c15_ports",
    "case_c16_snapshots",
    "case_c17_fork",
    "case_c18_no_helper_files",
    "case_c19_ensure_resumes",
    "case_kill_stops_delayed_writes",
    "fresh_sandbox",
    "host_pids",
    "integration_required",
    "provider_contract_suite",
    "run_case",
    "skip_unavailable",
]
