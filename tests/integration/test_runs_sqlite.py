"""SQLite run store and event log on real files (spec §F-H: R35-R50, decisions 3 and 7), across real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from boxwright import events as ev
from boxwright.errors import EpochFencedError
from boxwright.runs import EventLog, RunController, RunListing, RunPatch, RunStore, format_offset, pipe_to_run_log
from boxwright.stores.sqlite import (
    RUN_LOG_READ_PAGE,
    SqliteEventLog,
    SqliteRunStore,
    _notifier,
    open_database,
    sqlite_run_backend,
)
from boxwright.testkit.runs import event_log_suite, run_store_suite

REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def _fresh_runs():
    with tempfile.TemporaryDirectory() as tmp:
        async with open_database(Path(tmp) / "runs.db") as db:
            yield SqliteRunStore(db)


@contextlib.asynccontextmanager
async def _fresh_backend():
    with tempfile.TemporaryDirectory() as tmp:
        async with open_database(Path(tmp) / "runs.db") as db:
            yield sqlite_run_backend(db)


@contextlib.asynccontextmanager
async def _two_connections():
    # Records written through one connection, the log through another: the fence and the offsets
    # must hold across connections, as they do across processes.
    with tempfile.TemporaryDirectory() as tmp:
        async with open_database(Path(tmp) / "runs.db") as one, open_database(Path(tmp) / "runs.db") as two:
            yield SqliteRunStore(one), SqliteEventLog(two)


# A34-A36, R41-R46, decisions 3 and 7
TestSqliteRunStore = run_store_suite("sqlite", _fresh_runs)
# A32, R35-R36, decisions 3 and 7, concurrency
TestSqliteEventLog = event_log_suite("sqlite", _fresh_backend)
TestSqliteEventLogTwoConnections = event_log_suite("sqlite, two connections", _two_connections)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def text(i: int, message_id: str = "m") -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id=message_id, delta=str(i))


# -- one process ----------------------------------------------------------------------------------


def test_schema_one_database_wal_and_types(tmp_path):
    path = tmp_path / "runs.db"

    async def scenario():
        async with open_database(path) as db:
            runs, log = sqlite_run_backend(db)
            assert isinstance(runs, RunStore) and isinstance(runs, RunListing) and isinstance(log, EventLog)
            await runs.create_or_resume("r", "t")
            await log.append("r", [text(0)])

    run(scenario())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"runs", "run_logs", "run_log_events"} <= tables
        ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'run_log_events'").fetchone()[0]
        assert "WITHOUT ROWID" in ddl
        (stored,) = conn.execute("SELECT event FROM run_log_events").fetchone()
        assert json.loads(stored) == {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "0"}
        columns = {row[1]: row for row in conn.execute("PRAGMA table_info(runs)")}
        assert columns["cancel_requested"][2] == "INTEGER" and columns["cancel_requested"][3] == 0


def test_records_and_logs_survive_reopening(tmp_path):
    path = tmp_path / "runs.db"

    async def write():
        async with open_database(path) as db:
            runs, log = sqlite_run_backend(db)
            await runs.create_or_resume("r", "t", started_at=5)
            await runs.update("r", RunPatch(driver_epoch=3, cancel_requested=False, sandbox_key="k"))
            return await log.append("r", [text(i) for i in range(5)], epoch=3)

    async def read(offset):
        async with open_database(path) as db:
            runs, log = sqlite_run_backend(db)
            later = await log.append("r", [text(5)], epoch=3)
            return await runs.get("r"), [e async for e in log.read("r", offset, live=False)], later

    offsets = run(write())
    record, entries, later = run(read(offsets[1]))
    assert (record.started_at, record.driver_epoch, record.cancel_requested, record.sandbox_key) == (5, 3, False, "k")
    assert [o for o, _ in entries] == [*offsets[2:], *later]
    assert later == [format_offset("r", 6)]  # offsets continue across reopening


def test_a_read_pages_through_a_long_log(tmp_path):
    count = RUN_LOG_READ_PAGE * 2 + 100

    async def scenario():
        async with open_database(tmp_path / "runs.db") as db:
            _, log = sqlite_run_backend(db)
            offsets = []
            for start in range(0, count, 500):
                offsets += await log.append("r", [text(i) for i in range(start, min(start + 500, count))])
            await log.close("r")
            everything = [e async for e in log.read("r", "-1")]
            from_middle = [e async for e in log.read("r", offsets[999])]
            return offsets, everything, from_middle

    offsets, everything, from_middle = run(scenario())
    assert [o for o, _ in everything] == offsets and [e.delta for _, e in everything] == [str(i) for i in range(count)]
    assert [o for o, _ in from_middle] == offsets[1000:]


def test_watcher_runs_only_while_someone_waits(tmp_path):
    async def scenario():
        async with open_database(tmp_path / "runs.db") as db:
            _, log = sqlite_run_backend(db)
            notifier = _notifier(db)
            assert notifier._watcher is None
            reader = asyncio.create_task(anext(aiter(log.read("r", "-1"))))
            await _until(lambda: notifier._watcher is not None, "the watcher to start for a waiting reader")
            await log.append("r", [text(0)])
            first = await reader
            # Within a few poll intervals of nobody waiting, the watcher ends.
            await _until(lambda: notifier._watcher is None, "the watcher to stop")
            return first

    assert run(scenario())[1] == text(0)


def test_pipe_and_controller_on_sqlite(tmp_path):
    async def scenario():
        async with open_database(tmp_path / "runs.db") as db:
            runs, log = sqlite_run_backend(db)
            controller = RunController(runs, log)

            async def producer(run_id):
                yield ev.RunStartedEvent(thread_id="t", run_id=run_id)
                for i in range(40):
                    yield text(i, run_id)
                    if i % 7 == 0:
                        await asyncio.sleep(0.001)
                yield ev.RunFinishedEvent(thread_id="t", run_id=run_id, usage=[ev.TokenUsage(output_tokens=40)])

            handles = [controller.start(producer(f"run-{i}"), f"run-{i}", "t") for i in range(8)]
            tails = [asyncio.create_task(_collect(log, f"run-{i}")) for i in range(8)]
            await controller.drain()
            records = [h.done.result() for h in handles]
            seen = [await asyncio.wait_for(t, 10) for t in tails]
            stored = [await runs.get(f"run-{i}") for i in range(8)]
            return records, seen, stored

    records, seen, stored = run(scenario())
    assert records == stored
    for i, (record, events) in enumerate(zip(records, seen, strict=True)):
        assert record.status == "completed" and record.usage == ev.TokenUsage(output_tokens=40)
        assert [e.type for e in events][:2] == ["RUN_STARTED", "CUSTOM"] and len(events) == 43
        assert [e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT"] == [str(n) for n in range(40)]
        assert {e.message_id for e in events if e.type == "TEXT_MESSAGE_CONTENT"} == {f"run-{i}"}


async def _until(condition, what, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _until_async(condition, what, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _has_events(log, run_id, count):
    return len(await log.snapshot(run_id)) >= count


async def _collect(log, run_id, after="-1"):
    return [event async for _, event in log.read(run_id, after)]


def test_d3_pipe_fenced_across_connections(tmp_path):
    """A driver on one connection is superseded through another: its next batch and its status never land."""
    path = tmp_path / "runs.db"

    async def scenario():
        async with open_database(path) as driver_db, open_database(path) as successor_db:
            driver_runs, driver_log = sqlite_run_backend(driver_db)
            successor_runs, _ = sqlite_run_backend(successor_db)
            await successor_runs.create_or_resume("r", "t")
            await successor_runs.update("r", RunPatch(driver_epoch=1))
            gate = asyncio.Event()

            async def producer():
                yield ev.RunStartedEvent(thread_id="t", run_id="r")
                await gate.wait()
                yield text(0)
                yield ev.RunFinishedEvent(thread_id="t", run_id="r")

            task = asyncio.create_task(pipe_to_run_log(producer(), driver_runs, driver_log, "r", "t", epoch=1))
            await _until_async(lambda: _has_events(driver_log, "r", 2), "RUN_STARTED to land")
            await successor_runs.update("r", RunPatch(driver_epoch=2))
            gate.set()
            record = await task
            return record, await driver_log.snapshot("r"), await driver_log.is_closed("r")

    record, stored, closed = run(scenario())
    assert [e.type for e in stored] == ["RUN_STARTED", "CUSTOM"]
    assert record.status == "running" and record.driver_epoch == 2 and not closed


# -- across processes -----------------------------------------------------------------------------

WORKER = r"""
import asyncio, json, sys, time
from boxwright import events as ev
from boxwright.errors import EpochFencedError
from boxwright.stores.sqlite import open_database, sqlite_run_backend

async def main(mode, db_path, run_id, cfg):
    cfg = json.loads(cfg)
    async with open_database(db_path) as db:
        runs, log = sqlite_run_backend(db)
        if mode == "paced":
            for k in range(cfg["count"]):
                await asyncio.sleep(cfg["gap"])
                sent = time.time_ns()
                await log.append(run_id, [ev.CustomEvent(name="probe", value={"k": k, "sentNs": sent})], epoch=1)
            await log.close(run_id)
        elif mode == "batches":
            mine = []
            for b in range(cfg["batches"]):
                batch = [ev.TextMessageContentEvent(message_id=cfg["name"], delta=str(b * 32 + i)) for i in range(32)]
                mine += await log.append(run_id, batch, epoch=1)
                await asyncio.sleep(0)
            print(json.dumps(mine), flush=True)
        elif mode == "until-fenced":
            n = 0
            while True:
                try:
                    await log.append(run_id, [ev.TextMessageContentEvent(message_id="w", delta=str(n))], epoch=1)
                except EpochFencedError as exc:
                    print(f"fenced {n} {exc.stored_epoch}", flush=True)
                    return
                n += 1
                print(f"ok {n}", flush=True)
                await asyncio.sleep(0.005)

asyncio.run(main(*sys.argv[1:5]))
"""


def _worker(mode, db_path, run_id, **cfg):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, mode, str(db_path), run_id, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


async def _prepared(path, run_id):
    async with open_database(path) as db:
        runs, _ = sqlite_run_backend(db)
        await runs.create_or_resume(run_id, "t")
        await runs.update(run_id, RunPatch(driver_epoch=1))


def test_reader_in_another_process_sees_each_append_promptly(tmp_path):
    """A writer process appends one event every 200 ms; a reader here measures when each arrives.

    The reader is idle between appends (its watcher has backed off to its slowest poll), which is
    the worst case. Delivery must happen; the latency is reported, and only bounded generously.
    """
    path, count = tmp_path / "shared.db", 8
    run(_prepared(path, "r"))

    async def scenario():
        async with open_database(path) as db:
            _, log = sqlite_run_backend(db)
            received = []

            async def tail():
                async for _, event in log.read("r", "-1"):
                    received.append((event.value["k"], time.time_ns() - event.value["sentNs"]))

            reader = asyncio.create_task(tail())
            writer = _worker("paced", path, "r", count=count, gap=0.2)
            try:
                await asyncio.wait_for(reader, 30)  # ends when the writer closes the log
                assert await asyncio.to_thread(writer.wait, 30) == 0
            finally:
                writer.kill()
                writer.wait()
                writer.stdout.close()
            return received

    received = run(scenario())
    assert [k for k, _ in received] == list(range(count))
    latencies_ms = sorted(ns / 1e6 for _, ns in received)
    print(
        f"\ncross-process delivery latency over {count} appends: min {latencies_ms[0]:.1f} ms, "
        f"median {latencies_ms[count // 2]:.1f} ms, max {latencies_ms[-1]:.1f} ms"
    )
    assert latencies_ms[-1] < 5_000, "an append took more than 5 s to reach a reader in another process"


def test_offsets_strictly_increase_across_writer_processes(tmp_path):
    path, batches = tmp_path / "shared.db", 25
    run(_prepared(path, "r"))

    async def scenario():
        async with open_database(path) as db:
            _, log = sqlite_run_backend(db)
            reader = asyncio.create_task(_collect_entries(log, "r"))
            writers = [_worker("batches", path, "r", batches=batches, name=f"w{i}") for i in range(2)]
            try:
                outputs = [json.loads(await asyncio.to_thread(w.stdout.readline)) for w in writers]
                assert [await asyncio.to_thread(w.wait, 30) for w in writers] == [0, 0]
            finally:
                for w in writers:
                    w.kill()
                    w.wait()
                    w.stdout.close()
            await log.close("r")
            return outputs, await asyncio.wait_for(reader, 30)

    outputs, seen = run(scenario())
    total = 2 * batches * 32
    for mine in outputs:
        assert mine == sorted(mine) and len(mine) == batches * 32
    union = sorted(outputs[0] + outputs[1])
    assert union == [format_offset("r", seq) for seq in range(1, total + 1)]  # unique and dense: nothing lost
    assert [o for o, _ in seen] == union  # the live reader here saw every entry, in offset order
    for i in range(2):
        deltas = [e.delta for _, e in seen if e.message_id == f"w{i}"]
        assert deltas == [str(n) for n in range(batches * 32)]  # each writer's events in its own order


async def _collect_entries(log, run_id):
    return [entry async for entry in log.read(run_id, "-1")]


def test_d3_superseded_writer_process_never_lands_another_batch(tmp_path):
    path = tmp_path / "shared.db"
    run(_prepared(path, "r"))
    writer = _worker("until-fenced", path, "r")
    try:
        for _ in range(5):
            assert writer.stdout.readline().startswith("ok ")

        async def supersede():
            async with open_database(path) as db:
                runs, log = sqlite_run_backend(db)
                await runs.update("r", RunPatch(driver_epoch=2))
                at_bump = len(await log.snapshot("r"))
                await log.append("r", [text(-1, "successor")], epoch=2)
                return at_bump

        at_bump = run(supersede())
        rest = writer.stdout.read()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()

    assert rest.strip().splitlines()[-1].startswith("fenced ") and rest.strip().endswith(" 2")

    async def final():
        async with open_database(path) as db:
            _, log = sqlite_run_backend(db)
            return await log.snapshot("r")

    stored = run(final())
    # Everything after the bump is the successor's: the old writer landed nothing more.
    assert len(stored) == at_bump + 1 and stored[-1] == text(-1, "successor")
    assert all(e.message_id == "w" for e in stored[:at_bump])


def test_fence_error_is_raised_in_the_writer_transaction(tmp_path):
    async def scenario():
        async with open_database(tmp_path / "runs.db") as db:
            runs, log = sqlite_run_backend(db)
            await runs.create_or_resume("r", "t")
            await runs.update("r", RunPatch(driver_epoch=4))
            try:
                await log.append("r", [text(0)], epoch=3)
            except EpochFencedError as exc:
                fenced = exc
            # The refused transaction was rolled back: the connection is usable and nothing landed.
            landed = await log.append("r", [text(1)], epoch=4)
            return fenced, landed, await log.snapshot("r")

    fenced, landed, stored = run(scenario())
    assert (fenced.held_epoch, fenced.stored_epoch, fenced.action) == (3, 4, "append")
    assert landed == [format_offset("r", 1)] and stored == [text(1)]
