"""Run event log throughput: SQLite (boxwright.stores.sqlite) vs a plain NDJSON file, side by side.

Appends are fenced (``epoch=1``, so every batch also checks the run record in its
transaction) in batches of 32, by one writer and by 16 concurrent writers (16 runs). The
baseline writes the same bytes (each batch's events as NDJSON) to a plain file with one
fsync per batch, the schedule a durable append needs. SQLite is measured in WAL mode with
``synchronous=NORMAL`` (boxwright's default: a commit is safe from a process crash but the
last commits can be lost on power loss, as WAL syncs only at checkpoints) and with
``synchronous=FULL`` (the WAL is fsynced at every commit: the like-for-like comparison
with the fsync-per-batch file). The catch-up read is a closed 10,000-event log read from
``-1`` to its end, events decoded, vs reading and decoding the NDJSON file.

Run: .venv/bin/python bench/event_log.py [events]   (default 20,000 appended per figure)
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from boxwright import events as ev
from boxwright.runs import RunPatch
from boxwright.stores.memory import memory_run_backend
from boxwright.stores.sqlite import SqliteDatabase, open_database, sqlite_run_backend

BATCH = 32
WRITERS = 16
CATCH_UP = 10_000
REPEATS = 3


def run_like_events(count: int, run_id: str) -> list[ev.Event]:
    """A coding agent's mix: text and reasoning deltas, tool calls with results, state deltas."""
    out: list[ev.Event] = [ev.RunStartedEvent(thread_id="thread-1", run_id=run_id, timestamp=ev.now_ms())]
    n = 0
    while len(out) < count:
        ts = ev.now_ms()
        msg, call = f"{run_id}-msg-{n}", f"{run_id}-call-{n}"
        n += 1
        out += [
            ev.TextMessageStartEvent(message_id=msg, role="assistant", timestamp=ts),
            *(ev.TextMessageContentEvent(message_id=msg, delta="Let me look at the file. ", timestamp=ts),) * 20,
            ev.TextMessageEndEvent(message_id=msg, timestamp=ts),
            *(ev.ReasoningMessageContentEvent(message_id=msg, delta="considering the repo ", timestamp=ts),) * 5,
            ev.ToolCallStartEvent(tool_call_id=call, tool_call_name="Read", parent_message_id=msg, timestamp=ts),
            *(ev.ToolCallArgsEvent(tool_call_id=call, delta='{"path": "src/app.py"}', timestamp=ts),) * 3,
            ev.ToolCallEndEvent(tool_call_id=call, timestamp=ts),
            ev.ToolCallResultEvent(
                message_id=f"{msg}-r", tool_call_id=call, content="def main():\n    pass\n" * 10, timestamp=ts
            ),
            ev.StateDeltaEvent(delta=[ev.ReplaceOperation(path="/step", value=n)], timestamp=ts),
        ]
    return out[:count]


def batches(events: list[ev.Event]) -> list[list[ev.Event]]:
    return [events[i : i + BATCH] for i in range(0, len(events), BATCH)]


# -- SQLite ---------------------------------------------------------------------------------------


async def open_sqlite(path: Path, synchronous: str) -> SqliteDatabase:
    db = open_database(path)
    async with db.connection() as conn:
        await conn.execute(f"PRAGMA synchronous = {synchronous}")
    return db


async def sqlite_append(tmp: Path, synchronous: str, per_writer: list[list[ev.Event]]) -> float:
    """Seconds to append every writer's events, writers concurrent, one run each, batches of 32, fenced."""
    db = await open_sqlite(tmp / f"append-{synchronous}-{len(per_writer)}-{time.monotonic_ns()}.db", synchronous)
    try:
        runs, log = sqlite_run_backend(db)
        ids = [f"run-{i}" for i in range(len(per_writer))]
        for run_id in ids:
            await runs.create_or_resume(run_id, "thread-1")
            await runs.update(run_id, RunPatch(driver_epoch=1))

        async def writer(run_id: str, events: list[ev.Event]) -> None:
            for batch in batches(events):
                await log.append(run_id, batch, epoch=1)

        start = time.perf_counter()
        await asyncio.gather(*(writer(run_id, events) for run_id, events in zip(ids, per_writer, strict=True)))
        return time.perf_counter() - start
    finally:
        await db.close()


async def sqlite_catch_up(tmp: Path, events: list[ev.Event]) -> tuple[float, float]:
    """(seconds to read a closed log of ``events`` from -1, seconds for snapshot()) best of 5."""
    async with open_database(tmp / "catch-up.db") as db:
        runs, log = sqlite_run_backend(db)
        await runs.create_or_resume("run-c", "thread-1")
        for batch in batches(events):
            await log.append("run-c", batch)
        await log.close("run-c")
        reads, snaps = [], []
        for _ in range(5):
            start = time.perf_counter()
            got = [entry async for entry in log.read("run-c", "-1")]
            reads.append(time.perf_counter() - start)
            assert len(got) == len(events)
            start = time.perf_counter()
            assert len(await log.snapshot("run-c")) == len(events)
            snaps.append(time.perf_counter() - start)
        return min(reads), min(snaps)


# -- plain file baseline --------------------------------------------------------------------------


def file_append(tmp: Path, per_writer: list[list[ev.Event]]) -> float:
    """Seconds to write the same batches as NDJSON, one fsync per batch, writers round-robin."""
    paths = [tmp / f"file-{len(per_writer)}-{i}-{time.monotonic_ns()}.ndjson" for i in range(len(per_writer))]
    files = [open(path, "ab") for path in paths]
    try:
        queues = [batches(events) for events in per_writer]
        start = time.perf_counter()
        for round_ in range(max(len(q) for q in queues)):
            for f, queue in zip(files, queues, strict=True):
                if round_ < len(queue):
                    f.write(ev.encode_ndjson(queue[round_]))
                    f.flush()
                    os.fsync(f.fileno())
        return time.perf_counter() - start
    finally:
        for f in files:
            f.close()


def file_catch_up(tmp: Path, events: list[ev.Event]) -> float:
    path = tmp / "catch-up.ndjson"
    path.write_bytes(ev.encode_ndjson(events))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        got = ev.decode_ndjson(path.read_bytes())
        best = min(best, time.perf_counter() - start)
        assert len(got) == len(events)
    return best


async def memory_append(per_writer: list[list[ev.Event]]) -> float:
    runs, log = memory_run_backend()
    for i in range(len(per_writer)):
        await runs.create_or_resume(f"run-{i}", "thread-1")
        await runs.update(f"run-{i}", RunPatch(driver_epoch=1))

    async def writer(run_id: str, events: list[ev.Event]) -> None:
        for batch in batches(events):
            await log.append(run_id, batch, epoch=1)

    start = time.perf_counter()
    await asyncio.gather(*(writer(f"run-{i}", events) for i, events in enumerate(per_writer)))
    return time.perf_counter() - start


# -- report ---------------------------------------------------------------------------------------


async def median_of(repeats: int, work: Callable[[], Awaitable[float]]) -> float:
    return statistics.median([await work() for _ in range(repeats)])


def median_sync(repeats: int, work: Callable[[], float]) -> float:
    return statistics.median([work() for _ in range(repeats)])


async def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    one = [run_like_events(total, "run-0")]
    many = [run_like_events(total // WRITERS, f"run-{i}") for i in range(WRITERS)]
    count_many = sum(len(e) for e in many)
    payload = sum(len(ev.encode_event(e)) for e in one[0]) / len(one[0])
    print(
        f"event log bench: {total} events per figure, batches of {BATCH}, mean event {payload:.0f} B, "
        f"median of {REPEATS}; SQLite appends are fenced (epoch checked in the same transaction)"
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp_name:
        tmp = Path(tmp_name)
        rows: list[tuple[str, float, float]] = []
        for label, data, count in (("1 writer", one, total), (f"{WRITERS} writers", many, count_many)):
            file_s = median_sync(REPEATS, lambda data=data: file_append(tmp, data))  # type: ignore[misc]
            for sync in ("NORMAL", "FULL"):
                sqlite_s = await median_of(REPEATS, lambda data=data, sync=sync: sqlite_append(tmp, sync, data))  # type: ignore[misc]
                rows.append((f"append, {label}, sqlite synchronous={sync}", count / sqlite_s, count / file_s))
            mem_s = await median_of(REPEATS, lambda data=data: memory_append(data))  # type: ignore[misc]
            print(f"  (memory backend, {label}: {count / mem_s:,.0f} events/s)")
        print(f"\n{'figure':<46} {'sqlite ev/s':>12} {'file+fsync ev/s':>16} {'sqlite/file':>12}")
        for name, sqlite_rate, file_rate in rows:
            print(f"{name:<46} {sqlite_rate:>12,.0f} {file_rate:>16,.0f} {sqlite_rate / file_rate:>11.2f}x")
        catch = run_like_events(CATCH_UP, "run-c")
        read_s, snap_s = await sqlite_catch_up(tmp, catch)
        file_s = file_catch_up(tmp, catch)
        print(f"\ncatch-up of {CATCH_UP:,} events (best of 5):")
        print(f"  sqlite read('-1') to close : {read_s * 1000:7.1f} ms")
        print(f"  sqlite snapshot()          : {snap_s * 1000:7.1f} ms")
        print(f"  file read + decode_ndjson  : {file_s * 1000:7.1f} ms   (sqlite read / file = {read_s / file_s:.1f}x)")
        print("\ngoals: >= 20,000 events/s appended in batches; catch-up of 10,000 events < 50 ms")


if __name__ == "__main__":
    asyncio.run(main())
