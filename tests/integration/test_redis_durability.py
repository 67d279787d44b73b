"""A Redis server killed mid-append-stream and restarted: no acknowledged event is lost, the store reconnects.

The module owns its server (tests/support/redis_server.py): ``appendonly yes`` with
``appendfsync always``, so every write is in the AOF and fsynced before Redis replies. That is
the setting under which "acknowledged" means "durable" even if the host itself goes down;
``everysec`` survives a Redis crash like this SIGKILL too, but may lose the last second on a
host crash, and when an fsync lags Redis may answer before it has written at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from boxwright import events as ev
from boxwright.errors import LeaseLostError, StoreUnavailableError
from boxwright.runs import RunPatch, format_offset
from boxwright.stores.redis import RedisLockStore, open_redis, redis_run_backend
from tests.support.redis_server import RedisServer, redis_server

# While the server is down every call must fail this fast (a refused connection), never hang.
DOWN_CALL_BOUND_S = 2.0
BATCH = 8


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server(fsync="always") as started:
        yield started


def _batch(writer: int, n: int) -> list[ev.Event]:
    return [ev.TextMessageContentEvent(message_id=f"w{writer}", delta=f"{n}.{i}") for i in range(BATCH)]


def test_a_killed_server_loses_no_acknowledged_event_and_the_store_reconnects(server: RedisServer) -> None:
    url = server.url(prefix=server.fresh_prefix())

    async def scenario() -> None:
        async with open_redis(url) as db:
            runs, log = redis_run_backend(db)
            await runs.create_or_resume("r", "t")
            await runs.update("r", RunPatch(driver_epoch=1))
            acked: dict[str, ev.Event] = {}  # offset -> event, for every append that returned
            unknown: list[list[ev.Event]] = []  # batches whose append raised: landed or not, we cannot know
            failures: list[tuple[str, float]] = []
            enough = asyncio.Event()  # set once 200 events are acknowledged: time to kill the server
            refused = asyncio.Event()  # set once 6 appends were refused while it is down
            back = asyncio.Event()

            async def writer(w: int) -> None:
                n = 0
                while not back.is_set() or n < 60:
                    batch = _batch(w, n)
                    started = time.monotonic()
                    try:
                        offsets = await log.append("r", batch, epoch=1)
                    except StoreUnavailableError as exc:
                        failures.append((str(exc), time.monotonic() - started))
                        unknown.append(batch)
                        if len(failures) >= 6:
                            refused.set()
                        await asyncio.sleep(0.02)  # the test's writer paces its retries; the store never retries
                    else:
                        acked.update(zip(offsets, batch, strict=True))
                        if len(acked) >= 200:
                            enough.set()
                    n += 1
                    await asyncio.sleep(0)

            # A live reader blocked in XREAD when the server dies gets a clear error, not a hang.
            reader_seen: list[str] = []

            async def reader() -> BaseException | None:
                try:
                    async for offset, _ in log.read("r", "-1"):
                        reader_seen.append(offset)
                except StoreUnavailableError as exc:
                    return exc
                return None

            reading = asyncio.create_task(reader())
            writers = [asyncio.create_task(writer(w)) for w in range(2)]
            await asyncio.wait_for(enough.wait(), 30)
            await asyncio.to_thread(server.kill)
            killed_at = time.monotonic()
            reader_error = await asyncio.wait_for(reading, 10)
            await asyncio.wait_for(refused.wait(), 30)
            # Other calls fail as clearly while it is down.
            for call in (runs.get("r"), log.snapshot("r"), RedisLockStore(db).lock("k").__aenter__()):
                started = time.monotonic()
                with pytest.raises(StoreUnavailableError, match="unreachable"):
                    await call
                assert time.monotonic() - started < DOWN_CALL_BOUND_S
            await asyncio.to_thread(server.start)
            back.set()
            print(f"\nserver down {time.monotonic() - killed_at:.2f} s; {len(failures)} appends refused meanwhile")
            await asyncio.wait_for(asyncio.gather(*writers), 60)

            assert isinstance(reader_error, StoreUnavailableError), reader_error
            assert "127.0.0.1" in str(reader_error)
            assert all(elapsed < DOWN_CALL_BOUND_S for _, elapsed in failures), failures
            # The same store objects work again: the pool reconnected (and reloaded its scripts).
            stored = [entry async for entry in log.read("r", "-1", live=False)]
            offsets = [offset for offset, _ in stored]
            assert offsets == [format_offset("r", seq) for seq in range(1, len(stored) + 1)], "gap or reuse"
            by_offset = dict(stored)
            lost = [offset for offset, event in acked.items() if by_offset.get(offset) != event]
            assert lost == [], f"{len(lost)} acknowledged events lost or changed across the restart: {lost[:5]}"
            # Anything stored but never acknowledged came from a batch whose append raised (whole batches only).
            extra = [event for offset, event in stored if offset not in acked]
            unknown_events = [event for batch in unknown for event in batch]
            assert all(event in unknown_events for event in extra) and len(extra) % BATCH == 0
            # A reader that had to stop resumes from its last offset and gets the rest exactly once.
            resumed = [o async for o, _ in log.read("r", reader_seen[-1], live=False)]
            assert reader_seen + resumed == offsets
            print(
                f"acknowledged {len(acked)}, stored {len(stored)} (of which {len(extra)} from refused appends "
                f"that had landed), reader saw {len(reader_seen)} before the kill"
            )

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_lock_whose_server_dies_signals_its_loss_and_frees_nothing_it_does_not_hold(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder cannot renew while the server is down: its lease is lost (it must stop), the release is
    a logged warning, and after the restart the key is free again once the lease ran out."""
    caplog.set_level("WARNING", logger="boxwright.stores")
    url = server.url(prefix=server.fresh_prefix())
    ttl_ms = 300

    async def scenario() -> None:
        async with open_redis(url) as db:
            locks = RedisLockStore(db)
            async with locks.lock("k", ttl_ms=ttl_ms) as lease:
                await asyncio.to_thread(server.kill)
                await asyncio.wait_for(lease.wait(), 2 * ttl_ms / 1000 + 1)
                with pytest.raises(LeaseLostError, match="renewal failed"):
                    lease.raise_if_lost()
            await asyncio.to_thread(server.start)
            # The AOF kept the key with its expiry; it lapses within the ttl and another holder gets in.
            async with asyncio.timeout(5), locks.lock("k", ttl_ms=ttl_ms) as again:
                assert not again.lost
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())  # every wait in it is bounded
    assert any("could not release lock 'k'" in r.getMessage() for r in caplog.records)
