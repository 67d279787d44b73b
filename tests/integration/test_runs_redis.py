"""Redis run store and event log (spec A32-A36, R35-R46, decisions 3 and 7) on a real redis-server, across
processes and clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from boxwright import events as ev
from boxwright.errors import EpochFencedError
from boxwright.runs import EventLog, RunController, RunListing, RunPatch, RunStore, format_offset
from boxwright.stores.redis import RedisDatabase, RedisEventLog, RedisRunStore, open_redis, redis_run_backend
from boxwright.testkit.runs import event_log_suite, run_store_suite
from tests.support.redis_server import RedisServer, redis_server

REPO = Path(__file__).resolve().parents[2]
_server: RedisServer | None = None


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[RedisServer]:
    global _server
    with redis_server() as started:
        _server = started
        yield started
        _server = None


@contextlib.asynccontextmanager
async def _fresh_db() -> AsyncIterator[RedisDatabase]:
    assert _server is not None
    prefix = _server.fresh_prefix()
    try:
        async with open_redis(_server.url(prefix=prefix)) as db:
            yield db
    finally:
        _server.delete_prefix(prefix)


@contextlib.asynccontextmanager
async def _fresh_runs() -> AsyncIterator[RedisRunStore]:
    async with _fresh_db() as db:
        yield RedisRunStore(db)


@contextlib.asynccontextmanager
async def _fresh_backend() -> AsyncIterator[tuple[RedisRunStore, RedisEventLog]]:
    async with _fresh_db() as db:
        yield redis_run_backend(db)


@contextlib.asynccontextmanager
async def _two_connections() -> AsyncIterator[tuple[RedisRunStore, RedisEventLog]]:
    # Records through one client, the log through another: the fence and the wake-ups must hold
    # across connections, as they do across processes.
    assert _server is not None
    prefix = _server.fresh_prefix()
    try:
        async with open_redis(_server.url(prefix=prefix)) as one, open_redis(_server.url(prefix=prefix)) as two:
            yield RedisRunStore(one), RedisEventLog(two)
    finally:
        _server.delete_prefix(prefix)


# A34-A36, R41-R46, decisions 3 and 7
TestRedisRunStore = run_store_suite("redis", _fresh_runs)
# A32, R35-R36, decisions 3 and 7, concurrency
TestRedisEventLog = event_log_suite("redis", _fresh_backend)
TestRedisEventLogTwoConnections = event_log_suite("redis, two connections", _two_connections)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def text(i: int, message_id: str = "m") -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id=message_id, delta=str(i))


def test_layout_types_and_the_close_marker(server: RedisServer) -> None:
    async def scenario() -> None:
        async with _fresh_db() as db:
            runs, log = redis_run_backend(db)
            assert isinstance(runs, RunStore) and isinstance(runs, RunListing) and isinstance(log, EventLog)
            await runs.create_or_resume("r", "t")
            await log.append("r", [text(0), text(1)])
            await log.close("r")
            entries = await db.client.xrange(db.key("events", "r"))
            # Event n is the entry "<n>-0"; the close marker "<last>-1" is what wakes blocked readers.
            assert [entry_id for entry_id, _ in entries] == [b"1-0", b"2-0", b"2-1"]
            assert await db.client.hgetall(db.key("log", "r")) == {b"seq": b"2", b"closed": b"1"}

    run(scenario())


def test_pipe_and_controller_on_redis(server: RedisServer) -> None:
    async def scenario() -> None:
        async with _fresh_db() as db:
            runs, log = redis_run_backend(db)
            controller = RunController(runs, log)

            async def stream() -> AsyncIterator[ev.Event]:
                yield ev.RunStartedEvent(thread_id="t", run_id="r")
                for i in range(40):
                    yield text(i)
                yield ev.RunFinishedEvent(thread_id="t", run_id="r")

            handle = controller.start(stream(), "r", "t")
            tail = [e async for _, e in controller.attach("r")]
            record = await handle.done
            assert record.status == "completed" and await log.is_closed("r")
            assert len(tail) == 43 and {"CustomEvent", "RunStartedEvent", "RunFinishedEvent"} <= {
                type(e).__name__ for e in tail
            }
            assert [e.delta for e in tail if isinstance(e, ev.TextMessageContentEvent)] == [str(i) for i in range(40)]

    run(scenario())


WORKER = r"""
import asyncio, json, sys, time
from boxwright import events as ev
from boxwright.stores.redis import open_redis, redis_run_backend

async def main(mode, url, run_id, cfg):
    cfg = json.loads(cfg)
    async with open_redis(url) as db:
        runs, log = redis_run_backend(db)
        if mode == "paced":
            for k in range(cfg["count"]):
                await asyncio.sleep(cfg["gap"])
                sent = time.time_ns()
                await log.append(run_id, [ev.CustomEvent(name="probe", value={"k": k, "sentNs": sent})], epoch=1)
            await log.close(run_id)

asyncio.run(main(*sys.argv[1:5]))
"""


def _worker(mode: str, url: str, run_id: str, **cfg: object) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, mode, url, run_id, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def _prepared(url: str, run_id: str) -> None:
    async with open_redis(url) as db:
        runs, _ = redis_run_backend(db)
        await runs.create_or_resume(run_id, "t")
        await runs.update(run_id, RunPatch(driver_epoch=1))


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


@pytest.fixture
def url(server: RedisServer) -> Iterator[str]:
    prefix = server.fresh_prefix()
    yield server.url(prefix=prefix)
    server.delete_prefix(prefix)


def test_a_tail_in_this_process_wakes_on_each_append_of_another_process_without_polling(
    server: RedisServer, url: str
) -> None:
    """A writer process appends one event every 150 ms; a live reader here measures when each arrives.

    Between appends the reader is idle in XREAD BLOCK: the server counts how many commands it
    issued in a quiet second (a poll would show as XRANGE/HMGET calls), and each append must
    reach it within a bound (generous: the machine is shared; the figure is printed).
    """
    count = 6
    run(_prepared(url, "r"))

    async def scenario() -> tuple[list[tuple[int, int]], dict[str, int]]:
        async with open_redis(url) as db:
            _, log = redis_run_backend(db)
            received: list[tuple[int, int]] = []
            caught_up = asyncio.Event()

            async def tail() -> None:
                async for _, event in log.read("r", "-1"):
                    assert isinstance(event, ev.CustomEvent) and isinstance(event.value, dict)
                    received.append((event.value["k"], time.time_ns() - event.value["sentNs"]))
                    caught_up.set()

            reader = asyncio.create_task(tail())
            await asyncio.sleep(0.3)  # the reader found the empty log and is blocked now
            # One connection for both counts, so its own handshake falls before the first one.
            counter = redis.Redis(port=server.port)
            try:
                before = await asyncio.to_thread(_command_calls, counter)
                await asyncio.sleep(1.2)
                after = await asyncio.to_thread(_command_calls, counter)
            finally:
                counter.close()
            quiet = {name: after.get(name, 0) - before.get(name, 0) for name in after}
            quiet["info"] = quiet.get("info", 0) - 1
            writer = _worker("paced", url, "r", count=count, gap=0.15)
            try:
                await asyncio.wait_for(reader, 30)  # ends when the writer closes the log
                assert await asyncio.to_thread(writer.wait, 30) == 0
            finally:
                _stop(writer)
            return received, {name: calls for name, calls in quiet.items() if calls}

    received, quiet = run(scenario())
    # A blocked reader re-arms its XREAD once per WATCH_BLOCK_MS (1 s) and issues nothing else.
    assert set(quiet) <= {"xread"} and quiet.get("xread", 0) <= 3, f"commands of an idle reader in 1.2 s: {quiet}"
    assert [k for k, _ in received] == list(range(count))
    latencies_ms = sorted(ns / 1e6 for _, ns in received)
    print(
        f"\nredis cross-process delivery latency over {count} appends: min {latencies_ms[0]:.1f} ms, "
        f"median {latencies_ms[count // 2]:.1f} ms, max {latencies_ms[-1]:.1f} ms; idle reader commands: {quiet}"
    )
    assert latencies_ms[-1] < 2_000, "an append took more than 2 s to reach a reader in another process"


def test_offsets_strictly_increase_across_writer_clients(server: RedisServer, url: str) -> None:
    """Two writers, each on its own client (connection pool), as two hosts would be: offsets dense, none doubled."""
    batches = 10
    run(_prepared(url, "r"))

    async def writer(name: str) -> list[str]:
        async with open_redis(url) as db:
            log = RedisEventLog(db)
            mine: list[str] = []
            for b in range(batches):
                batch = [ev.TextMessageContentEvent(message_id=name, delta=str(b * 32 + i)) for i in range(32)]
                mine += await log.append("r", batch, epoch=1)
            return mine

    async def scenario() -> tuple[list[list[str]], list[tuple[str, ev.Event]]]:
        async with open_redis(url) as db:
            log = RedisEventLog(db)
            reader = asyncio.create_task(_collect_entries(log, "r"))
            outputs = list(await asyncio.gather(writer("w0"), writer("w1")))
            await log.close("r")
            return outputs, await asyncio.wait_for(reader, 30)

    outputs, seen = run(scenario())
    total = 2 * batches * 32
    for mine in outputs:
        assert mine == sorted(mine) and len(mine) == batches * 32
    union = sorted(outputs[0] + outputs[1])
    assert union == [format_offset("r", seq) for seq in range(1, total + 1)]  # unique and dense: nothing lost
    assert [o for o, _ in seen] == union  # the live reader on a third client saw every entry, in offset order
    for i in range(2):
        deltas = [e.delta for _, e in seen if isinstance(e, ev.TextMessageContentEvent) and e.message_id == f"w{i}"]
        assert deltas == [str(n) for n in range(batches * 32)]


async def _collect_entries(log: EventLog, run_id: str) -> list[tuple[str, ev.Event]]:
    return [entry async for entry in log.read(run_id, "-1")]


def test_d3_a_superseded_writer_never_lands_another_batch(server: RedisServer, url: str) -> None:
    """A writer on one client appends at epoch 1 until a successor on another client bumps the epoch."""
    run(_prepared(url, "r"))

    async def scenario() -> tuple[int, str, list[ev.Event]]:
        async with open_redis(url) as old_db, open_redis(url) as new_db:
            old_log = RedisEventLog(old_db)
            runs, new_log = redis_run_backend(new_db)
            landed = asyncio.Event()
            outcome: list[str] = []

            async def old_writer() -> None:
                n = 0
                while True:
                    try:
                        await old_log.append("r", [text(n, "w")], epoch=1)
                    except EpochFencedError as exc:
                        outcome.append(f"fenced {exc.stored_epoch}")
                        return
                    n += 1
                    if n == 5:
                        landed.set()
                    await asyncio.sleep(0.002)

            writing = asyncio.create_task(old_writer())
            await landed.wait()
            await runs.update("r", RunPatch(driver_epoch=2))
            at_bump = len(await new_log.snapshot("r"))
            await new_log.append("r", [text(-1, "successor")], epoch=2)
            await asyncio.wait_for(writing, 10)
            return at_bump, outcome[0], await new_log.snapshot("r")

    at_bump, outcome, stored = run(scenario())
    assert outcome == "fenced 2"
    # Everything after the bump is the successor's: the old writer landed nothing more.
    assert len(stored) == at_bump + 1 and stored[-1] == text(-1, "successor")
    assert all(isinstance(e, ev.TextMessageContentEvent) and e.message_id == "w" for e in stored[:at_bump])


def test_many_live_readers_in_one_process_cost_one_read_per_append(server: RedisServer, url: str) -> None:
    """300 caught-up readers of one run: each append is read from Redis once (by the run's watch) and
    every reader gets every event from it; the server counts no per-reader query while they tail."""
    readers, appends = 300, 20

    async def scenario() -> tuple[list[list[str]], list[str], dict[str, int]]:
        async with open_redis(url) as db:
            runs, log = redis_run_backend(db)
            await runs.create_or_resume("r", "t")
            first = await log.append("r", [text(-1)])
            tails = [asyncio.create_task(_collect_entries(log, "r")) for _ in range(readers)]
            counter = redis.Redis(port=server.port)
            try:
                # Counted once every reader has read the backlog and waits (the run's watch knows how many
                # wait: white-box, so that a loaded machine cannot make the count start too early).
                async with asyncio.timeout(30):
                    while (watch := db.watches.get(db.key("events", "r"))) is None or watch._waiters < readers:  # noqa: ASYNC110 - a counter, polled
                        await asyncio.sleep(0.02)
                before = await asyncio.to_thread(_command_calls, counter)
                offsets = list(first)
                for i in range(appends):
                    offsets += await log.append("r", [text(i)])
                    await asyncio.sleep(0.01)
                await log.close("r")
                seen = [[o for o, _ in await asyncio.wait_for(t, 30)] for t in tails]
                after = await asyncio.to_thread(_command_calls, counter)
            finally:
                counter.close()
            delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
            return seen, offsets, {name: calls for name, calls in delta.items() if calls}

    seen, offsets, calls = run(scenario())
    assert all(mine == offsets for mine in seen), "a reader missed or doubled an event"
    # Per append: the append script, and at most one XREAD of the watch; never a read per reader.
    assert calls.get("xrange", 0) <= 5, calls
    assert calls.get("xread", 0) <= appends + 5, calls
    print(f"\n{readers} readers x {appends + 1} appends: server commands {calls}")
