"""Claim and fences on Redis (A46, decision 3): a lease lost to another client stops its holder, and the
successor's driver finishes the run at the next epoch, on a redis-server this module owns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

from boxwright import events as ev
from boxwright.errors import RunClaimLostError
from boxwright.runs import RunRecord
from boxwright.stores.redis import RedisLockStore, open_redis, redis_run_backend
from boxwright.takeover import (
    LEASE_LOST,
    RunClaim,
    pipe_claimed,
    run_driver_lock_key,
    sandbox_run_driver,
    with_run_claim,
)
from tests.support.redis_server import RedisServer, redis_server


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as started:
        yield started


async def _stream_of(events: Sequence[ev.Event]) -> AsyncIterator[ev.Event]:
    for event in events:
        yield event


def _deltas(events: Sequence[ev.Event]) -> list[str]:
    return [e.delta for e in events if isinstance(e, ev.TextMessageContentEvent)]


def test_a46_a_lease_lost_to_another_client_stops_its_holder(server: RedisServer) -> None:
    """A's lease key expires under it (a stall, as far as Redis can tell); B, on another client, takes the
    key over and finishes the run; A's renewal finds another token, its signal fires, it writes nothing more."""
    url = server.url(prefix=server.fresh_prefix())

    async def main() -> tuple[RunClaim, RunRecord, list[ev.Event], RunRecord | None, bool, list[int]]:
        async with open_redis(url) as db_a, open_redis(url) as db_b:
            runs_a, log_a = redis_run_backend(db_a)
            runs_b, log_b = redis_run_backend(db_b)
            await runs_a.create_or_resume("r", "t")
            a_holds = asyncio.Event()

            async def a_stream(claim: RunClaim) -> AsyncIterator[ev.Event]:
                yield ev.RunStartedEvent(thread_id="t", run_id="r")
                yield ev.TextMessageContentEvent(message_id="m", delta="a1")
                yield ev.ToolCallEndEvent(tool_call_id="c")
                a_holds.set()
                await claim.signal.wait()
                yield ev.TextMessageContentEvent(message_id="m", delta="a-late")

            async def host_a(claim: RunClaim) -> tuple[RunClaim, RunRecord]:
                return claim, await pipe_claimed(a_stream(claim), runs_a, log_a, claim, "t")

            locks_a, locks_b = RedisLockStore(db_a), RedisLockStore(db_b)
            a = asyncio.create_task(with_run_claim(runs_a, locks_a, "r", host_a, lease_ttl_ms=900))
            await a_holds.wait()
            fence_before = int(await db_b.client.get(db_b.key("fence", run_driver_lock_key("r"))) or 0)
            await db_b.client.pexpire(db_b.key("lock", run_driver_lock_key("r")), 1)
            driver_b = sandbox_run_driver(runs_b, locks_b, log_b, lambda *_: _stream_of([]), fence_quiet_ms=20)

            async def host_b(claim: RunClaim) -> RunRecord:
                done = [
                    ev.TextMessageContentEvent(message_id="m", delta="b1"),
                    ev.RunFinishedEvent(thread_id="t", run_id="r"),
                ]
                return await driver_b.pipe(_stream_of(done), "r", "t")

            b_final = await driver_b.claim("r", host_b)
            claim_a, a_final = await asyncio.wait_for(a, 10)
            fence_after = int(await db_b.client.get(db_b.key("fence", run_driver_lock_key("r"))) or 0)
            assert b_final.status == "completed" and b_final.driver_epoch == 2
            return (
                claim_a,
                a_final,
                await log_b.snapshot("r"),
                await runs_b.get("r"),
                await log_b.is_closed("r"),
                [fence_before, fence_after],
            )

    claim_a, a_final, stored, record, closed, fences = asyncio.run(asyncio.wait_for(main(), 30))
    assert claim_a.signal.aborted and isinstance(claim_a.signal.reason, RunClaimLostError)
    assert claim_a.superseded and claim_a.error is not None
    assert claim_a.error.observed_epoch in (LEASE_LOST, 2)
    assert a_final.status == "completed" and a_final.driver_epoch == 2  # B's record, re-read
    assert _deltas(stored) == ["a1", "b1"] and not any(e.type == "RUN_ERROR" for e in stored)
    assert record is not None and record.status == "completed" and record.driver_epoch == 2 and closed
    assert fences[1] > fences[0] >= 1, f"B's fencing token must be above A's: {fences}"
