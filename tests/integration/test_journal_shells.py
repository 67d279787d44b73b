"""The journal against real shells (local-process and bubblewrap): durable-runs.md R13-R28, R69, R72-R74.

Faults a real sandbox will not produce on demand (a failing ``rm``, a raising probe)
are injected by wrapping a real handle's ``process``; everything else runs for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time

import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.errors import AgentProcessExitError, JournalAttachUnavailableError, JournalTruncatedError
from boxwright.journal import (
    Finished,
    JournalLine,
    Producing,
    Unknown,
    await_attachable_journal,
    decode_journal_run_id,
    encode_run_id,
    exit_sentinel_line,
    journal_cleanup_command,
    journal_list_command,
    journal_paths,
    parse_exit_sentinel,
    probe_run_exit,
    prune_journals,
    read_journal,
    read_journal_ndjson,
    start_journaled_agent,
)
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import ExecResult
from boxwright.shell import quote
from boxwright.testkit import host_pids, skip_unavailable
from boxwright.testkit.journal import RecordingHandle, RecordingProcesses

PROVIDERS = ["local-process", "bubblewrap"]
STRATEGIES = ["follow", "poll"]


def _provider(name: str):
    if name == "bubblewrap":
        found = probe()
        if not found.available:
            skip_unavailable("bubblewrap", found.reason)
        return bubblewrap_sandbox()
    return local_process_sandbox()


@contextlib.asynccontextmanager
async def sandbox(name: str):
    handle = await _provider(name).create()
    try:
        yield handle
    finally:
        await handle.destroy()


def rid(tag: str) -> str:
    return f"it-{tag}-{secrets.token_hex(4)}"


async def ok(handle, command: str) -> str:
    result = await handle.process.exec(command)
    assert result.exit_code == 0, (command, result)
    return result.stdout


async def exists(handle, path: str) -> bool:
    return (await handle.process.exec(f"test -e {quote(path)}")).exit_code == 0


def tails(path: str) -> list[int]:
    return host_pids(["tail", "-c", "+1", "-f", path])


async def no_tail(path: str, within: float = 3.0) -> list[int]:
    found = tails(path)
    for _ in range(int(within / 0.05)):
        if not found:
            break
        await asyncio.sleep(0.05)
        found = tails(path)
    return found


class Record(msgspec.Struct):
    status: str
    detached_since: int | None = None


class Runs:
    """A dict-backed run lookup (the RunStore is another module's), counting every get."""

    def __init__(self, records: dict[str, Record] | None = None, failing: set[str] | None = None) -> None:
        self.records = records or {}
        self.failing = failing or set()
        self.gets: list[str] = []

    async def get(self, run_id: str) -> Record | None:
        self.gets.append(run_id)
        if run_id in self.failing:
            raise RuntimeError(f"store down for {run_id}")
        return self.records.get(run_id)


class Faulty(RecordingProcesses):
    """Real execs, except commands starting with a rigged prefix, which raise or return a canned result."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.rules: list[list] = []

    def rig(self, prefix: str, outcome: ExecResult | Exception, times: int | None = None) -> None:
        self.rules.append([prefix, outcome, times])

    async def exec(self, command, opts=None):
        self.executed.append(command)
        for rule in self.rules:
            prefix, outcome, times = rule
            if command.startswith(prefix) and times != 0:
                if times is not None:
                    rule[2] = times - 1
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
        return await self._inner.exec(command, opts)


class NoFs(RecordingHandle):
    @property
    def fs(self):
        raise AssertionError("the journal must never be touched through handle.fs")


def faulty(handle) -> tuple[RecordingHandle, Faulty]:
    spy = RecordingHandle(handle)
    spy.process = Faulty(handle.process)
    return spy, spy.process


async def events_of(handle, paths, **options) -> tuple[list, list[str]]:
    bad: list[str] = []
    events = [e async for e in read_journal_ndjson(handle, paths, on_non_json_line=bad.append, **options)]
    return events, bad


# -- a journaled agent, end to end ------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_journaled_agent_streams_events_and_cleans_up(provider: str, strategy: str) -> None:
    """R13, R14, R18-R20, R23, R24 (acceptance 10, 11, 14, 15): events in order, a partial line held back until
    complete, non-JSON to the callback, an agent's unnonced `{"__exit":0}` is an ordinary event, no handle.fs,
    both files removed at the sentinel."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            paths = journal_paths(rid("e2e"))
            command = (
                "printf '%s\\n' '{\"a\":1}' 'not json' '' '{\"__exit\":0}' '[1,2]' '{\"b\":\"€\"}'; "
                "printf '{\"c\":'; sleep 0.3; echo '3}'"
            )
            await start_journaled_agent(handle, command, paths)
            # The journal is shell-only: a handle whose fs refuses every call still reads it.
            events, bad = await events_of(NoFs(handle), paths, strategy=strategy, poll_interval_ms=50)
            assert events == [{"a": 1}, {"__exit": 0}, {"b": "€"}, {"c": 3}]
            assert bad == ["not json", "[1,2]"]
            assert not await exists(handle, paths.journal)
            assert not await exists(handle, paths.stderr)

    asyncio.run(main())


def test_exit_error_survives_failing_stderr_read_and_cleanup() -> None:
    """R24 (acceptance 15): a failing sidecar read and a failing or non-zero rm never replace the exit error."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            for rm_outcome in (RuntimeError("rm transport down"), ExecResult("", "rm: denied", 1)):
                paths = journal_paths(rid("rmfail"))
                spy, processes = faulty(handle)
                processes.rig("tail -c -4096", RuntimeError("sidecar transport down"))
                processes.rig("rm -f", rm_outcome)
                process = await start_journaled_agent(handle, "echo '{\"x\":1}'; echo why >&2; exit 5", paths)
                await process.wait()
                with pytest.raises(AgentProcessExitError) as caught:
                    await events_of(spy, paths, strategy="poll", poll_interval_ms=20)
                assert caught.value.exit_code == 5
                assert str(caught.value) == "Agent process exited with code 5"
                assert await exists(handle, paths.journal)  # the rm really did not run
                await ok(handle, journal_cleanup_command(paths))

    asyncio.run(main())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_journal_deleted_under_the_reader_ends_it(strategy: str) -> None:
    """Edge: the agent's shell dies before its sentinel and the journal is removed; the read ends (no hang)
    and, not aborted, raises JournalTruncatedError (R25)."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            paths = journal_paths(rid("gone"))
            agent = await start_journaled_agent(handle, "echo '{\"n\":1}'; exec sleep 600", paths)
            seen: list = []

            async def read() -> None:
                async for event in read_journal_ndjson(handle, paths, strategy=strategy, poll_interval_ms=50):
                    seen.append(event)
                    await agent.kill()
                    await ok(handle, journal_cleanup_command(paths))

            started = time.monotonic()
            with pytest.raises(JournalTruncatedError, match="without its exit sentinel"):
                await asyncio.wait_for(read(), 10)
            assert seen == [{"n": 1}]
            assert time.monotonic() - started < 5
            assert await no_tail(paths.journal) == []

    asyncio.run(main())


# -- first byte, abort, early stop ------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_first_byte_timeout_raises_stalled_and_kills_the_tail(provider: str, strategy: str) -> None:
    """R21 (acceptance 12): an existing journal that gives no byte → `journal-stalled` naming the run id."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            run_id = rid("stall")
            paths = journal_paths(run_id)
            await ok(handle, f"mkdir -p {quote(paths.dir)} && : > {quote(paths.journal)}")
            started = time.monotonic()
            with pytest.raises(JournalAttachUnavailableError) as caught:
                async for _ in read_journal(
                    handle, paths, strategy=strategy, first_byte_timeout_ms=300, run_id=run_id, poll_interval_ms=50
                ):
                    pass
            elapsed = time.monotonic() - started
            assert (caught.value.target, caught.value.reason) == (run_id, "journal-stalled")
            assert "300ms" in str(caught.value)
            assert 0.25 <= elapsed < 3, elapsed
            assert await no_tail(paths.journal) == []
            await ok(handle, journal_cleanup_command(paths))

    asyncio.run(main())


def test_first_byte_bound_spares_slow_agents_zero_disables_and_abort_is_quiet() -> None:
    """R21: only the first byte is bounded; `0` disables the bound; an abort before the first byte is quiet."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            paths = journal_paths(rid("slow"))
            await start_journaled_agent(handle, "echo '{\"n\":1}'; sleep 0.6; echo '{\"n\":2}'", paths)
            events, _ = await events_of(handle, paths, first_byte_timeout_ms=300)
            assert events == [{"n": 1}, {"n": 2}]
            for strategy in STRATEGIES:
                empty = journal_paths(rid("quiet"))
                await ok(handle, f"mkdir -p {quote(empty.dir)} && : > {quote(empty.journal)}")
                for bound in (0, 200):
                    controller = AbortController()
                    asyncio.get_running_loop().call_later(0.4 if bound == 0 else 0.1, controller.abort)
                    lines = [
                        line
                        async for line in read_journal(
                            handle, empty, strategy=strategy, first_byte_timeout_ms=bound, signal=controller.signal
                        )
                    ]
                    assert lines == []
                    assert await no_tail(empty.journal) == []
                await ok(handle, journal_cleanup_command(empty))

    asyncio.run(main())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_abort_and_early_stop_leave_no_tail_on_the_host(provider: str) -> None:
    """R19, R25 (acceptance 10, 16): the follow `tail` is in the host process table while reading and gone
    after an abort (no break) or a break; an aborted NDJSON read returns and deletes nothing."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            paths = journal_paths(rid("stop"))
            agent = await start_journaled_agent(handle, "printf '%s\\n' '{\"n\":1}' '{\"n\":2}'; exec sleep 600", paths)
            try:
                controller = AbortController()
                lines: list[JournalLine] = []
                async for line in read_journal(handle, paths, strategy="follow", signal=controller.signal):
                    lines.append(line)
                    assert tails(paths.journal), "the follow tail should be visible on the host while reading"
                    controller.abort("done")
                assert [line.line for line in lines] == ['{"n":1}']
                assert await no_tail(paths.journal) == []

                reader = read_journal(handle, paths, strategy="follow")
                async with contextlib.aclosing(reader):
                    async for _line in reader:
                        break
                assert await no_tail(paths.journal) == []

                controller = AbortController()
                events = []
                async for event in read_journal_ndjson(handle, paths, signal=controller.signal):
                    events.append(event)
                    if len(events) == 2:
                        controller.abort("viewer left")
                assert events == [{"n": 1}, {"n": 2}]
                assert await exists(handle, paths.journal) and await exists(handle, paths.stderr)
                assert await no_tail(paths.journal) == []
            finally:
                await agent.kill()
                await ok(handle, journal_cleanup_command(paths))

    asyncio.run(main())


def test_a_pre_aborted_read_runs_no_command() -> None:
    """R20 (acceptance 11): a signal aborted before the read starts means zero execs and spawns."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            spy = RecordingHandle(handle)
            paths = journal_paths(rid("pre"))
            controller = AbortController()
            controller.abort("already")
            for strategy in STRATEGIES:
                assert [x async for x in read_journal(spy, paths, strategy=strategy, signal=controller.signal)] == []
            assert [x async for x in read_journal_ndjson(spy, paths, signal=controller.signal)] == []
            assert (spy.recorder.executed, spy.recorder.spawned) == ([], [])

    asyncio.run(main())


def test_start_journaled_agent_withholds_the_signal_and_returns_at_once() -> None:
    """R26 (acceptance 17): no signal, cwd/env kept, stdin written and closed, returns while wait() hangs."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            spy = RecordingHandle(handle)
            paths = journal_paths(rid("start"))
            await ok(handle, "mkdir -p sub")
            command = (
                "read -r line; "
                'printf \'{"in":"%s","env":"%s","dir":"%s"}\\n\' "$line" "$JV" "${PWD##*/}"; exec sleep 600'
            )
            agent = await start_journaled_agent(spy, command, paths, stdin="hello\n", env={"JV": "v1"}, cwd="sub")
            try:
                (options,) = spy.recorder.spawn_options
                assert options is not None and options.signal is None
                assert (options.cwd, dict(options.env or {})) == ("sub", {"JV": "v1"})
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(agent.wait(), 0.3)
                reader = read_journal(handle, paths, strategy="follow")
                async with contextlib.aclosing(reader):
                    first = await anext(reader)
                assert msgspec.json.decode(first.line) == {"in": "hello", "env": "v1", "dir": "sub"}
            finally:
                await agent.kill()
                await ok(handle, journal_cleanup_command(paths))

    asyncio.run(main())


# -- attach preflight ------------------------------------------------------------------------------


def test_attach_preflight_decides_from_journal_then_record() -> None:
    """R27, R28 (acceptance 18-21)."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            run_id = rid("attach")
            paths = journal_paths(run_id)
            fast = {"wait_ms": 400, "probe_interval_ms": 50}

            # An existing journal answers without the store.
            runs = Runs(failing={run_id})
            await ok(handle, f"mkdir -p {quote(paths.dir)} && : > {quote(paths.journal)}")
            await await_attachable_journal(handle, paths, run_id, runs=runs, **fast)
            assert runs.gets == []
            await ok(handle, journal_cleanup_command(paths))

            # Unknown and terminal fail after exactly one exec, also when that probe raised.
            cases = [(None, "unknown-run")] + [(Record(s), "terminal-run") for s in ("completed", "failed", "aborted")]
            for record, reason in cases:
                for probe_raises in (False, True):
                    spy, processes = faulty(handle)
                    if probe_raises:
                        processes.rig("test -f", RuntimeError("exec transport down"))
                    runs = Runs({run_id: record} if record else {})
                    with pytest.raises(JournalAttachUnavailableError) as caught:
                        await await_attachable_journal(spy, paths, run_id, runs=runs, **fast)
                    assert caught.value.reason == reason
                    assert len(processes.executed) == 1 and runs.gets == [run_id]

            # A running (or interrupted) run waits for a late journal.
            for status in ("running", "interrupted"):
                writer = await handle.process.spawn(
                    f"sleep 0.2; mkdir -p {quote(paths.dir)}; : > {quote(paths.journal)}"
                )
                await await_attachable_journal(handle, paths, run_id, runs=Runs({run_id: Record(status)}), **fast)
                await writer.wait()
                await ok(handle, journal_cleanup_command(paths))

            # Never appearing: a bounded wait naming the ms and the detach time; also without a store.
            detached = Record("running", detached_since=1_700_000_000_000)
            for runs_or_none in (Runs({run_id: detached}), None):
                started = time.monotonic()
                with pytest.raises(JournalAttachUnavailableError) as caught:
                    await await_attachable_journal(handle, paths, run_id, runs=runs_or_none, **fast)
                assert caught.value.reason == "journal-timeout" and "400ms" in str(caught.value)
                assert 0.35 < time.monotonic() - started < 3
                if runs_or_none is not None:
                    assert "detached since 2023-11-14T22:13:20" in str(caught.value)

            # A store error is no answer: bounded wait.
            with pytest.raises(JournalAttachUnavailableError, match="journal-timeout"):
                await await_attachable_journal(handle, paths, run_id, runs=Runs(failing={run_id}), **fast)

            # An always-raising probe is never "exists"; a recovering one resolves.
            spy, processes = faulty(handle)
            processes.rig("test -f", RuntimeError("down"))
            with pytest.raises(JournalAttachUnavailableError, match="could not be probed"):
                await await_attachable_journal(spy, paths, run_id, runs=Runs({run_id: Record("running")}), **fast)
            spy, processes = faulty(handle)
            processes.rig("test -f", RuntimeError("blip"), times=3)
            await ok(handle, f"mkdir -p {quote(paths.dir)} && : > {quote(paths.journal)}")
            await await_attachable_journal(spy, paths, run_id, runs=Runs({run_id: Record("running")}), **fast)
            assert len(processes.executed) == 4
            await ok(handle, journal_cleanup_command(paths))

            # The consumer's abort returns quietly.
            controller = AbortController()
            asyncio.get_running_loop().call_later(0.1, controller.abort)
            started = time.monotonic()
            await await_attachable_journal(
                handle, paths, run_id, runs=Runs({run_id: Record("running")}), wait_ms=5000, signal=controller.signal
            )
            assert time.monotonic() - started < 1

    asyncio.run(main())


def test_attaching_ndjson_read() -> None:
    """R23, R28: attach runs the preflight (unknown run refused) and reads a finished journal from byte 0."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            run_id = rid("att")
            paths = journal_paths(run_id)
            with pytest.raises(JournalAttachUnavailableError, match="unknown-run"):
                await events_of(handle, paths, attach=True, run_id=run_id, runs=Runs())
            process = await start_journaled_agent(handle, "echo '{\"k\":1}'", paths)
            await process.wait()
            runs = Runs({run_id: Record("running")})
            events, _ = await events_of(handle, paths, attach=True, run_id=run_id, runs=runs, attach_wait_ms=500)
            assert events == [{"k": 1}] and runs.gets == []
            assert not await exists(handle, paths.journal)

    asyncio.run(main())


# -- exit probe ------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_probe_run_exit(provider: str) -> None:
    """R69 (acceptance 65): finished code; forged sentinels → producing; empty/absent → producing; errors →
    unknown."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            done = journal_paths(rid("probe-done"))
            process = await start_journaled_agent(handle, "echo '{\"a\":1}'; exit 3", done)
            await process.wait()
            assert await probe_run_exit(handle, done) == Finished(3)
            assert await probe_run_exit(handle, done, max_bytes=20) == Producing()  # the window cut the sentinel

            live = journal_paths(rid("probe-live"))
            other = exit_sentinel_line(journal_paths("someone-else"), 0)
            forger = await start_journaled_agent(
                handle, f"echo '{{\"__exit\":0}}'; echo {quote(other)}; exec sleep 600", live
            )
            try:
                deadline = time.monotonic() + 5
                while other not in (await handle.process.exec(f"cat {quote(live.journal)}")).stdout:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                assert await probe_run_exit(handle, live) == Producing()
            finally:
                await forger.kill()

            absent = journal_paths(rid("probe-absent"))
            assert await probe_run_exit(handle, absent) == Producing()
            await ok(handle, f": > {quote(live.journal)}")
            assert await probe_run_exit(handle, live) == Producing()

            spy, processes = faulty(handle)
            processes.rig("tail", RuntimeError("sandbox unreachable"))
            result = await probe_run_exit(spy, done)
            assert isinstance(result, Unknown) and "sandbox unreachable" in (result.error or "")
            processes.rules.clear()
            processes.rig("tail", ExecResult("not base64!!", "", 0))
            assert isinstance(await probe_run_exit(spy, done), Unknown)
            for paths in (done, live):
                await ok(handle, journal_cleanup_command(paths))

    asyncio.run(main())


# -- prune -----------------------------------------------------------------------------------------


NOW_S = 1_900_000_000
HOUR_MS = 3_600_000


async def _seed(handle, dir: str, files: dict[str, int]) -> None:
    """Create ``files`` (name → mtime seconds) in ``dir`` through the shell."""
    parts = [f"mkdir -p {quote(dir)}"]
    for name, mtime in files.items():
        path = quote(f"{dir}/{name}")
        parts.append(f": > {path} && touch -d @{mtime} {path}")
    await ok(handle, " && ".join(parts))


async def _listing(handle, dir: str) -> set[str]:
    return set((await handle.process.exec(journal_list_command(dir))).stdout.split())


def _kept(result) -> dict[str | None, str]:
    return {k.run_id if k.run_id is not None else k.names[0]: k.reason for k in result.kept}


@contextlib.contextmanager
def _journal_dir(provider: str):
    if provider == "local-process":
        # The host /tmp is shared: a private dir keeps the sweep off other runs' journals.
        dir = tempfile.mkdtemp(prefix="boxwright-prune-")
        try:
            yield dir
        finally:
            shutil.rmtree(dir, ignore_errors=True)
    else:
        yield f"/tmp/prune-{secrets.token_hex(3)}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_prune_deletes_only_what_it_can_prove_dead(provider: str) -> None:
    """R72-R74 (acceptance 67-69, 74): terminal deleted (one get, one rm per run); running/interrupted and
    store errors kept; undecodable names kept without a store call; orphans split by the NEWEST mtime;
    idempotent; the empty dir still has its stat witness."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            with _journal_dir(provider) as dir:
                old, fresh = NOW_S - 2 * 3600, NOW_S - 60
                enc = encode_run_id
                truncated = enc("t" * 400) + ".ndjson"
                files = {
                    f"{enc('done ok')}.ndjson": fresh,
                    f"{enc('done ok')}.err": fresh,
                    f"{enc('done-fail')}.ndjson": fresh,
                    f"{enc('live')}.ndjson": old,
                    f"{enc('paused')}.ndjson": old,
                    f"{enc('broken')}.ndjson": old,
                    f"{enc('sibling')}.ndjson": old,
                    f"{enc('old-orphan')}.ndjson": old,
                    f"{enc('old-orphan')}.err": old,
                    f"{enc('new-orphan')}.ndjson": fresh,
                    f"{enc('mixed-orphan')}.ndjson": old,
                    f"{enc('mixed-orphan')}.err": fresh,
                    "bad_name.ndjson": old,
                    "d_4Fne-ok.ndjson": old,  # decodes to "dOne-ok", but not as encode_run_id spells it
                    truncated: old,
                    "notes.txt": old,
                }
                await _seed(handle, dir, files)
                runs = Runs(
                    {
                        "done ok": Record("completed"),
                        "done-fail": Record("failed"),
                        "live": Record("running"),
                        "paused": Record("interrupted"),
                        "sibling": Record("aborted"),
                    },
                    failing={"broken"},
                )
                result = await prune_journals(handle, runs, dir=dir, now_ms=NOW_S * 1000)
                assert result.age_gate == "listed"
                assert (result.listed, result.run_ids) == (16, 9)
                assert sorted(result.deleted) == ["done ok", "done-fail", "old-orphan", "sibling"]
                assert _kept(result) == {
                    "live": "non-terminal",
                    "paused": "non-terminal",
                    "broken": "store-error",
                    "new-orphan": "orphan-too-recent",
                    "mixed-orphan": "orphan-too-recent",
                    "bad_name.ndjson": "undecodable-name",
                    "d_4Fne-ok.ndjson": "undecodable-name",
                    truncated: "undecodable-name",
                    "notes.txt": "undecodable-name",
                }
                mixed = next(k for k in result.kept if k.run_id == "mixed-orphan")
                assert sorted(mixed.names) == ["mixed-orphan.err", "mixed-orphan.ndjson"]
                assert sorted(runs.gets) == sorted(
                    [
                        "done ok",
                        "done-fail",
                        "live",
                        "paused",
                        "broken",
                        "sibling",
                        "old-orphan",
                        "new-orphan",
                        "mixed-orphan",
                    ]
                )
                assert [(f.stage, f.run_id) for f in result.failures] == [("store", "broken")]
                left = await _listing(handle, dir)
                for gone in ("done ok", "done-fail", "old-orphan", "sibling"):
                    assert f"{enc(gone)}.ndjson" not in left and f"{enc(gone)}.err" not in left
                assert f"{enc('live')}.ndjson" in left and truncated in left and "notes.txt" in left

                # A custom TTL: an orphan 60 s old is kept at ttl 61 s and deleted at ttl 59 s.
                again = await prune_journals(handle, runs, dir=dir, now_ms=NOW_S * 1000, orphan_ttl_ms=61_000)
                assert again.deleted == [] and _kept(again)["new-orphan"] == "orphan-too-recent"
                again = await prune_journals(handle, runs, dir=dir, now_ms=NOW_S * 1000, orphan_ttl_ms=59_000)
                assert sorted(again.deleted) == ["mixed-orphan", "new-orphan"]
                # Idempotent: nothing more goes.
                again = await prune_journals(handle, runs, dir=dir, now_ms=NOW_S * 1000, orphan_ttl_ms=59_000)
                assert again.deleted == [] and again.failures[0].stage == "store"

                empty = f"{dir}/empty"
                await ok(handle, f"mkdir -p {quote(empty)}")
                result = await prune_journals(handle, runs, dir=empty)
                assert (result.age_gate, result.listed, result.kept, result.failures) == ("listed", 0, [], [])
                missing = await prune_journals(handle, runs, dir=f"{dir}/missing")
                assert (missing.age_gate, missing.listed, missing.failures) == ("unavailable", 0, [])

    asyncio.run(main())


def test_prune_fails_closed_on_broken_listings_and_removals() -> None:
    """R72-R74 (acceptance 70, 71): no witness or a raising stat keeps every orphan but still deletes terminal
    runs; the cap keeps the rest; a failing rm is `delete-failed` and later runs still go; a failing ls
    returns an empty result."""

    async def main() -> None:
        async with sandbox("local-process") as handle:
            with _journal_dir("local-process") as dir:
                old = NOW_S - 2 * 3600
                names = ["orphan", "t1", "t2", "t3"]
                runs = Runs({n: Record("completed") for n in names[1:]})

                async def seed() -> None:
                    await _seed(handle, dir, {f"{n}.ndjson": old for n in names})

                await seed()
                for outcome in (ExecResult("1900000000 /elsewhere\n", "", 1), RuntimeError("stat exploded")):
                    spy, processes = faulty(handle)
                    processes.rig("stat -c", outcome)
                    result = await prune_journals(spy, runs, dir=dir, now_ms=NOW_S * 1000)
                    assert result.age_gate == "unavailable"
                    assert sorted(result.deleted) == ["t1", "t2", "t3"]
                    assert _kept(result) == {"orphan": "age-gate-unavailable"}
                    stages = [f.stage for f in result.failures]
                    assert stages == ([] if isinstance(outcome, ExecResult) else ["mtime-list"])
                    await seed()

                result = await prune_journals(handle, runs, dir=dir, now_ms=NOW_S * 1000, max_deletes=2)
                assert len(result.deleted) == 2
                assert sorted(_kept(result).values()) == ["max-deletes", "max-deletes"]
                await seed()

                spy, processes = faulty(handle)
                processes.rig(f"rm -f {quote(dir + '/t1.ndjson')}", RuntimeError("rm transport down"))
                processes.rig(f"rm -f {quote(dir + '/t2.ndjson')}", ExecResult("", "rm: busy", 1))
                result = await prune_journals(spy, runs, dir=dir, now_ms=NOW_S * 1000)
                assert sorted(result.deleted) == ["orphan", "t3"]
                assert _kept(result) == {"t1": "delete-failed", "t2": "delete-failed"}
                assert sorted((f.stage, f.run_id) for f in result.failures) == [("delete", "t1"), ("delete", "t2")]

                spy, processes = faulty(handle)
                processes.rig("ls -1", RuntimeError("ls exploded"))
                result = await prune_journals(spy, runs, dir=dir)
                assert (result.listed, result.deleted, result.kept, result.age_gate) == (0, [], [], "unavailable")
                assert [f.stage for f in result.failures] == ["list"]
                assert len(processes.executed) == 1

    asyncio.run(main())


# -- a shell-hostile run id ------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_shell_hostile_run_id_round_trips(provider: str) -> None:
    """R9, R13 (acceptance 75): write, probe, follow, sidecar, list, decode and delete; the canary never
    appears."""

    async def main() -> None:
        async with sandbox(provider) as handle:
            # Relative: a run id holds no "/" (boxwright.ids), so the canary lands in the shell's cwd.
            canary = f"boxwright-canary-{secrets.token_hex(4)}"
            run_id = f"rp-a;touch {canary};b c|d$(touch {canary})-'q'`touch {canary}`-é-{secrets.token_hex(3)}"
            paths = journal_paths(run_id)
            process = await start_journaled_agent(handle, "echo '{\"h\":1}'; echo side >&2", paths)
            assert await process.wait() == 0
            assert await probe_run_exit(handle, paths) == Finished(0)
            names = await _listing(handle, paths.dir)
            mine = {n for n in names if n.startswith(encode_run_id(run_id))}
            assert mine == {os.path.basename(paths.journal), os.path.basename(paths.stderr)}
            assert {decode_journal_run_id(n).run_id for n in mine} == {run_id}  # type: ignore[union-attr]
            reader = read_journal(handle, paths, strategy="follow")
            async with contextlib.aclosing(reader):
                lines = [await anext(reader), await anext(reader)]
            assert lines[0].line == '{"h":1}' and parse_exit_sentinel(lines[1].line, paths) == 0
            assert (await ok(handle, f"cat {quote(paths.stderr)}")) == "side\n"
            events, _ = await events_of(handle, paths)
            assert events == [{"h": 1}]
            assert not await exists(handle, paths.journal) and not await exists(handle, paths.stderr)
            assert not await exists(handle, canary) and not os.path.exists(canary)
            assert not os.path.exists(os.path.join(handle.workspace_root, canary))

    asyncio.run(main())
