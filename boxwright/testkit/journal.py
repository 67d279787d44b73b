"""The journal conformance cases J0..J8 (spec/providers.md §3), for any provider.

Register them next to the contract suite, with the same config::

    TestMyJournal = journal_conformance_suite(ProviderSuiteConfig(name="mine", create_handle=create))

Each case is a plain ``async def case_j..(config) -> None`` with a fresh sandbox.
The journal is touched through the shell only (``test -e``, ``wc -c``, ``base64``,
``: >``), never ``handle.fs``: on local-process ``fs`` maps ``/tmp`` under the
sandbox root while the shell sees the host's. Gate, heartbeat and marker files
live under ``/tmp`` with per-run names. J5/J6 use the live strategy; J7 needs
``follow`` (a declared-killable provider) and is skipped, naming why, otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..abort import AbortController
from ..errors import AgentProcessExitError
from ..journal import (
    Finished,
    JournalLine,
    JournalPaths,
    Strategy,
    decode_base64_frame,
    exit_sentinel_line,
    journal_cleanup_command,
    journal_dir_of,
    journal_follow_command,
    journal_paths,
    journal_read_command,
    journal_read_strategy,
    parse_exit_sentinel,
    parse_journal_exit,
    probe_run_exit,
    read_journal,
    read_journal_ndjson,
    start_journaled_agent,
)
from ..sandbox import (
    Capabilities,
    ExecResult,
    ProcessOptions,
    SandboxEnv,
    SandboxFs,
    SandboxGit,
    SandboxHandle,
    SandboxPorts,
    SandboxProcesses,
    SnapshotRef,
    SpawnHandle,
)
from ..sandbox import journal_read_strategy as strategy_for_capabilities
from ..shell import quote
from .providers import (
    _STEP,
    CASE_TIMEOUT,
    Case,
    CaseNotApplicable,
    ProviderSuiteConfig,
    _equal,
    _exec,
    _expect,
    _fail,
    _ok,
    _slug,
    _wait,
    case_kill_stops_delayed_writes,
    fresh_sandbox,
    host_pids,
    run_case,
    skip_unavailable,
)

# The spec's J7 windows: after kill() the heartbeat gets 5 s to settle, then must not grow for 6 s.
HEARTBEAT_SETTLE_S = 5.0
HEARTBEAT_FREEZE_S = 6.0
_POLL_MS = 50


# -- helpers --------------------------------------------------------------------------------------


def _run_id(case: str) -> str:
    return f"jcase-{case}-{secrets.token_hex(4)}"


def _tmp(what: str) -> str:
    return f"/tmp/boxwright-{what}-{secrets.token_hex(4)}"


class RecordingProcesses:
    """Forwards to a real ``process`` and keeps every command, so a case can see which mechanism ran."""

    def __init__(self, inner: SandboxProcesses) -> None:
        self._inner = inner
        self.executed: list[str] = []
        self.spawned: list[str] = []
        self.spawn_options: list[ProcessOptions | None] = []

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        self.executed.append(command)
        return await self._inner.exec(command, opts)

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> SpawnHandle:
        self.spawned.append(command)
        self.spawn_options.append(opts)
        return await self._inner.spawn(command, opts)


class RecordingHandle:
    """A real handle whose ``process`` records commands (``process`` may be replaced for fault injection)."""

    def __init__(self, inner: SandboxHandle) -> None:
        self._inner = inner
        self.recorder = RecordingProcesses(inner.process)
        self.process: SandboxProcesses = self.recorder

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def workspace_root(self) -> str:
        return self._inner.workspace_root

    @property
    def journal_dir(self) -> str:
        return journal_dir_of(self._inner)

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    @property
    def fs(self) -> SandboxFs:
        return self._inner.fs

    @property
    def git(self) -> SandboxGit:
        return self._inner.git

    @property
    def ports(self) -> SandboxPorts:
        return self._inner.ports

    @property
    def env(self) -> SandboxEnv:
        return self._inner.env

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        return await self._inner.snapshot(label)

    async def fork(self) -> SandboxHandle:
        return await self._inner.fork()

    async def destroy(self) -> None:
        await self._inner.destroy()


async def _file_bytes(handle: SandboxHandle, path: str) -> bytes:
    return decode_base64_frame(await _ok(handle, f"base64 {quote(path)}"))


async def _size(handle: SandboxHandle, path: str, what: str) -> int:
    result = await _exec(handle, f"wc -c < {quote(path)}")
    text = result.stdout.strip()
    if result.exit_code != 0 or not text.isdigit():
        _fail(
            f"{what}: could not read the size of {path}: exit {result.exit_code}, {result.stdout!r} {result.stderr!r}"
        )
    return int(text)


async def _exists(handle: SandboxHandle, path: str) -> bool:
    return (await _exec(handle, f"test -e {quote(path)}")).exit_code == 0


async def _finished_agent(handle: SandboxHandle, command: str, paths: JournalPaths, what: str) -> int:
    process = await start_journaled_agent(handle, command, paths)
    return await _wait(process, what)


async def _lines_to_sentinel(
    handle: SandboxHandle, paths: JournalPaths, strategy: Strategy | None = None, from_byte: int = 0
) -> list[JournalLine]:
    """Lines of a finished journal up to and including its sentinel."""
    out: list[JournalLine] = []

    async def read() -> None:
        lines = read_journal(
            handle,
            paths,
            from_byte=from_byte,
            strategy=strategy,
            poll_interval_ms=_POLL_MS,
            first_byte_timeout_ms=_STEP * 1000,
        )
        async with contextlib.aclosing(lines):
            async for line in lines:
                out.append(line)
                if parse_exit_sentinel(line.line, paths) is not None:
                    return

    try:
        await asyncio.wait_for(read(), _STEP)
    except TimeoutError:
        _fail(f"no exit sentinel in {paths.journal} within {_STEP:g} s; lines so far: {out!r}")
    return out


def _proc_scan(argv: str) -> str:
    """`alive`/`gone` for a process whose whole argv is ``argv``, read from /proc (literal, no regex)."""
    return (
        "r=gone; for d in /proc/[0-9]*; do "
        "c=$(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null) || continue; "
        f'case "$c" in {quote(argv + " ")}) r=alive; break;; esac; done; echo $r'
    )


async def _expect_no_tail(handle: SandboxHandle, paths: JournalPaths, what: str, within: float = 3.0) -> None:
    argv = ["tail", "-c", "+1", "-f", paths.journal]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        inside = (await _ok(handle, _proc_scan(" ".join(argv)))).strip() == "alive"
        host = host_pids(argv)
        if not inside and not host:
            return
        if loop.time() >= deadline:
            _fail(f"{what}: `{' '.join(argv)}` still runs (inside the sandbox: {inside}, host pids: {host})")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _journal(handle: SandboxHandle, case: str) -> AsyncIterator[JournalPaths]:
    """Fresh journal paths in the handle's own journal dir (``journal_dir_of``), removed afterwards."""
    paths = journal_paths(_run_id(case), journal_dir_of(handle))
    try:
        yield paths
    finally:
        with contextlib.suppress(Exception):
            await handle.process.exec(journal_cleanup_command(paths))


def _live_strategy(config: ProviderSuiteConfig) -> Strategy:
    return "poll" if config.follow_unsupported else "follow"


# -- J0..J8 ---------------------------------------------------------------------------------------


async def case_j0_strategy_matches_declaration(config: ProviderSuiteConfig) -> None:
    """The strategy the capabilities give, and the mechanism a default read uses, equal the declaration:
    `follow` (a spawned `tail -f`) unless follow_unsupported, then `poll` (bounded execs only)."""
    expected = _live_strategy(config)
    why = f" (follow_unsupported={config.follow_unsupported!r})"
    async with fresh_sandbox(config) as handle:
        _equal(journal_read_strategy(handle), expected, f"journal_read_strategy(handle){why}")
        _equal(strategy_for_capabilities(handle.capabilities), expected, f"strategy of handle.capabilities{why}")
        if config.provider is not None:
            _equal(journal_read_strategy(config.provider.capabilities()), expected, f"provider.capabilities(){why}")
        spy = RecordingHandle(handle)
        async with _journal(handle, "j0") as paths:
            _equal(await _finished_agent(handle, "echo '{\"j\":0}'", paths, "j0 agent"), 0, "j0 agent exit")
            events = [e async for e in read_journal_ndjson(spy, paths, poll_interval_ms=_POLL_MS)]
            _equal(events, [{"j": 0}], "events of a default-strategy read")
            followed = journal_follow_command(paths, 0) in spy.recorder.spawned
            polled = journal_read_command(paths, 0) in spy.recorder.executed
            _equal(
                "follow" if followed and not polled else "poll" if polled and not followed else "mixed",
                expected,
                f"mechanism a default read used (spawned {spy.recorder.spawned!r}){why}",
            )


async def case_j1_lines_then_sentinel(config: ProviderSuiteConfig) -> None:
    """A journaled agent's lines land byte-exact, followed by the nonce'd `{"__exit":0,...}` sentinel."""
    async with fresh_sandbox(config) as handle, _journal(handle, "j1") as paths:
        command = "printf '%s\\n' '{\"a\":1}' '{\"b\":2}'"
        _equal(await _finished_agent(handle, command, paths, "j1 agent"), 0, "agent exit code")
        expected = b'{"a":1}\n{"b":2}\n' + exit_sentinel_line(paths, 0).encode() + b"\n"
        _equal(await _file_bytes(handle, paths.journal), expected, "journal bytes")
        lines = await _lines_to_sentinel(handle, paths)
        _equal([line.line for line in lines][:2], ['{"a":1}', '{"b":2}'], "lines read back")
        _equal(lines[-1].end_position, len(expected), "end position of the sentinel line")


async def case_j2_exit_code_sentinel(config: ProviderSuiteConfig) -> None:
    """`exit 7` writes sentinel 7; the NDJSON read raises AgentProcessExitError(7) and removes both files."""
    async with fresh_sandbox(config) as handle, _journal(handle, "j2") as paths:
        await _finished_agent(handle, "echo '{\"x\":1}'; echo boom >&2; exit 7", paths, "j2 agent")
        text = (await _file_bytes(handle, paths.journal)).decode()
        _equal(text.splitlines()[-1], exit_sentinel_line(paths, 7), "last journal line")
        _equal(parse_journal_exit(text, paths), 7, "parse_journal_exit")
        _equal(await probe_run_exit(handle, paths), Finished(7), "probe_run_exit")
        events: list[dict[str, Any]] = []
        try:
            async for event in read_journal_ndjson(handle, paths, poll_interval_ms=_POLL_MS):
                events.append(event)
        except AgentProcessExitError as exc:
            _equal(exc.exit_code, 7, "AgentProcessExitError.exit_code")
            _expect("boom" in str(exc), f"the error must carry the stderr tail: {exc}")
        else:
            _fail("a read of an `exit 7` journal must raise AgentProcessExitError")
        _equal(events, [{"x": 1}], "events before the sentinel")
        _equal(
            [await _exists(handle, p) for p in (paths.journal, paths.stderr)], [False, False], "files after the read"
        )


async def case_j3_stderr_only_in_sidecar(config: ProviderSuiteConfig) -> None:
    """stderr goes to the `.err` sidecar only, never into the journal."""
    token = secrets.token_hex(4)
    async with fresh_sandbox(config) as handle, _journal(handle, "j3") as paths:
        command = f"echo '{{\"o\":1}}'; echo oops-{token} >&2; echo '{{\"o\":2}}'"
        _equal(await _finished_agent(handle, command, paths, "j3 agent"), 0, "agent exit code")
        journal = await _file_bytes(handle, paths.journal)
        _expect(token.encode() not in journal, f"stderr leaked into the journal: {journal!r}")
        _equal(journal.split(b"\n")[:2], [b'{"o":1}', b'{"o":2}'], "journal lines")
        _equal(await _file_bytes(handle, paths.stderr), f"oops-{token}\n".encode(), "sidecar bytes")


async def case_j4_poll_positions(config: ProviderSuiteConfig) -> None:
    """A poll read from 0 and one from a line's end position give the same absolute byte positions."""
    async with fresh_sandbox(config) as handle, _journal(handle, "j4") as paths:
        command = "printf '%s\\n' '{\"s\":\"€uro\"}' '{\"n\":2}' '{\"n\":3}'"
        await _finished_agent(handle, command, paths, "j4 agent")
        data = await _file_bytes(handle, paths.journal)
        ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
        whole = await _lines_to_sentinel(handle, paths, "poll")
        _equal([line.end_position for line in whole], ends, "end positions from 0 (bytes, not characters)")
        _equal(whole[0].line, '{"s":"€uro"}', "first line")
        rest = await _lines_to_sentinel(handle, paths, "poll", from_byte=whole[0].end_position)
        _equal(rest, whole[1:], "lines read from the first line's end position")


async def case_j5_incremental_delivery(config: ProviderSuiteConfig) -> None:
    """Delivery is causal: the agent waits on a gate the reader creates only after it got line 1."""
    gate = _tmp("j5-gate")
    async with fresh_sandbox(config) as handle, _journal(handle, "j5") as paths:
        command = (
            "echo '{\"n\":1}'; i=0; "
            f"while ! test -e {quote(gate)}; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.05; done; "
            "echo '{\"n\":2}'"
        )
        try:
            await start_journaled_agent(handle, command, paths)
            events: list[dict[str, Any]] = []

            async def read() -> None:
                async for event in read_journal_ndjson(handle, paths, poll_interval_ms=_POLL_MS):
                    events.append(event)
                    if event == {"n": 1}:
                        _expect(not await _exists(handle, gate), "the gate existed before line 1 was read")
                        await _ok(handle, f": > {quote(gate)}")

            try:
                await asyncio.wait_for(read(), _STEP)
            except TimeoutError:
                _fail(f"the gated read did not finish within {_STEP:g} s; events {events!r}")
            _equal(events, [{"n": 1}, {"n": 2}], "events of the gated agent")
        finally:
            await _exec(handle, f"rm -f {quote(gate)}")


async def case_j6_read_stops_on_signal(config: ProviderSuiteConfig) -> None:
    """A read of a live journal ends when its own signal aborts, with no consumer `break`; no `tail` survives."""
    async with fresh_sandbox(config) as handle, _journal(handle, "j6") as paths:
        agent = await start_journaled_agent(handle, "echo '{\"n\":1}'; exec sleep 600", paths)
        try:
            controller = AbortController()
            seen: list[JournalLine] = []
            loop = asyncio.get_running_loop()
            aborted_at: list[float] = []

            async def read() -> None:
                async for line in read_journal(handle, paths, signal=controller.signal, poll_interval_ms=_POLL_MS):
                    seen.append(line)
                    if not aborted_at:
                        aborted_at.append(loop.time())
                        controller.abort("j6: stop reading")

            try:
                await asyncio.wait_for(read(), _STEP)
            except TimeoutError:
                _fail(f"the read ran on to the {_STEP:g} s backstop after its signal aborted; lines {seen!r}")
            _equal([line.line for line in seen], ['{"n":1}'], "lines before the abort")
            stopped_after = loop.time() - aborted_at[0]
            _expect(stopped_after < 5.0, f"the read took {stopped_after:.1f} s to stop after its signal")
            await _expect_no_tail(handle, paths, "after the aborted read")
        finally:
            await agent.kill()


async def case_j7_heartbeat_stops_after_kill(
    config: ProviderSuiteConfig, *, settle_s: float = HEARTBEAT_SETTLE_S, freeze_s: float = HEARTBEAT_FREEZE_S
) -> None:
    """A backgrounded heartbeat `( ... printf . >> HB; sleep 1 ... ) & wait` grows, then kill(); after the
    settle window its size stays frozen through the freeze window (a live grandchild would keep writing)."""
    if config.follow_unsupported:
        raise CaseNotApplicable(
            f"journal reads poll here, so kill() need not reach grandchildren: {config.follow_unsupported}"
        )
    heartbeat, stop = _tmp("j7-hb"), _tmp("j7-stop")
    passed = False
    async with fresh_sandbox(config) as handle:
        try:
            command = f"( while ! test -e {quote(stop)}; do printf . >> {quote(heartbeat)}; sleep 1; done ) & wait"
            process = await handle.process.spawn(command)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while not await _exists(handle, heartbeat) or await _size(handle, heartbeat, "heartbeat") < 2:
                if loop.time() > deadline:
                    _fail("the heartbeat did not grow to 2 bytes within 15 s")
                await asyncio.sleep(0.1)
            await asyncio.wait_for(process.kill(), _STEP)
            await asyncio.sleep(settle_s)
            settled = await _size(handle, heartbeat, "heartbeat after settling")
            await asyncio.sleep(freeze_s)
            later = await _size(handle, heartbeat, "heartbeat after the freeze window")
            _equal(later, settled, f"heartbeat size {freeze_s:g} s after it settled (kill() left a writer alive)")
            passed = True
        finally:
            if passed:
                await _exec(handle, f"rm -f {quote(heartbeat)} {quote(stop)}")
            else:
                await _exec(handle, f": > {quote(stop)}")  # stops a surviving heartbeat within a beat


async def case_j8_kill_stops_delayed_writes(config: ProviderSuiteConfig) -> None:
    """The seed's kill case: `sleep 5 && touch M` and `( sleep 5 && touch M ) & wait`, stopped after ~1 s by
    kill(), an aborted spawn signal and an aborted exec signal, write no marker within 7 s (run concurrently)."""
    await case_kill_stops_delayed_writes(config)


def _with_windows(case: Callable[..., Any], **windows: float) -> Case:
    bound = functools.partial(case, **windows)

    async def run(config: ProviderSuiteConfig) -> None:
        await bound(config)

    run.__name__ = run.__qualname__ = case.__name__
    run.__doc__ = case.__doc__
    return run


def journal_cases(
    *, heartbeat_settle_s: float = HEARTBEAT_SETTLE_S, heartbeat_freeze_s: float = HEARTBEAT_FREEZE_S
) -> tuple[tuple[str, Case], ...]:
    """``(test name, case)`` pairs J0..J8; the J7 windows are parameters (the spec's 5 s / 6 s by default)."""
    return (
        ("test_j0_strategy_matches_declaration", case_j0_strategy_matches_declaration),
        ("test_j1_lines_then_sentinel", case_j1_lines_then_sentinel),
        ("test_j2_exit_code_sentinel", case_j2_exit_code_sentinel),
        ("test_j3_stderr_only_in_sidecar", case_j3_stderr_only_in_sidecar),
        ("test_j4_poll_positions", case_j4_poll_positions),
        ("test_j5_incremental_delivery", case_j5_incremental_delivery),
        ("test_j6_read_stops_on_signal", case_j6_read_stops_on_signal),
        (
            "test_j7_heartbeat_stops_after_kill",
            _with_windows(case_j7_heartbeat_stops_after_kill, settle_s=heartbeat_settle_s, freeze_s=heartbeat_freeze_s),
        ),
        ("test_j8_kill_stops_delayed_writes", case_j8_kill_stops_delayed_writes),
    )


def _test_method(config: ProviderSuiteConfig, name: str, case: Case) -> Callable[[object], None]:
    def test(self: object) -> None:
        run_case(config, case, CASE_TIMEOUT)

    test.__name__ = test.__qualname__ = name
    test.__doc__ = case.__doc__
    return test


def journal_conformance_suite(
    config: ProviderSuiteConfig,
    *,
    heartbeat_settle_s: float = HEARTBEAT_SETTLE_S,
    heartbeat_freeze_s: float = HEARTBEAT_FREEZE_S,
) -> type:
    """A pytest-collectable class with one sync test per journal case J0..J8 for ``config``.

    Bind it to a module-level ``Test...`` name. With ``config.unsupported`` set, the
    class holds a single ``test_unavailable_<reason>`` that skips (or fails under
    ``BOXWRIGHT_REQUIRE_INTEGRATION=1``) naming the cause.
    """
    namespace: dict[str, Any] = {"__doc__": f"Journal conformance cases for {config.name!r}.", "config": config}
    if config.unsupported is not None:
        reason = config.unsupported
        test_name = f"test_unavailable_{_slug(reason)}"

        def unavailable(self: object) -> None:
            skip_unavailable(config.name, reason)

        unavailable.__name__ = unavailable.__qualname__ = test_name
        namespace[test_name] = unavailable
    else:
        cases = journal_cases(heartbeat_settle_s=heartbeat_settle_s, heartbeat_freeze_s=heartbeat_freeze_s)
        for test_name, case in cases:
            namespace[test_name] = _test_method(config, test_name, case)
    caller = sys._getframe(1).f_globals.get("__name__")
    if isinstance(caller, str):
        namespace["__module__"] = caller
    return type(f"TestJournalConformance_{_slug(config.name)}", (), namespace)


__all__ = [
    "HEARTBEAT_FREEZE_S",
    "HEARTBEAT_SETTLE_S",
    "RecordingHandle",
    "RecordingProcesses",
    "case_j0_strategy_matches_declaration",
    "case_j1_lines_then_sentinel",
    "case_j2_exit_code_sentinel",
    "case_j3_stderr_only_in_sidecar",
    "case_j4_poll_positions",
    "case_j5_incremental_delivery",
    "case_j6_read_stops_on_signal",
    "case_j7_heartbeat_stops_after_kill",
    "case_j8_kill_stops_delayed_writes",
    "journal_cases",
    "journal_conformance_suite",
]
