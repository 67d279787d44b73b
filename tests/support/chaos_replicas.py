"""Pieces of the multi-replica chaos tests (tests/e2e/test_coordinator_chaos*.py): kill rounds over two replicas.

A round starts a run on replica A (``boxwright serve`` over one Redis, the real ``claude`` against
the fake model), tails it through A up to a kill point, SIGKILLs A, and reconnects through replica
B with the last offset it got; ``check_exactly_once`` then holds the client's two tails against the
whole stored log (offsets, fingerprints, the run's shape) and its completed status. ``Pair`` keeps
two live replicas, starting the killed one's replacement in a thread while the round goes on.
``ModuleBudget`` bounds a module's rounds (each also has its own timeout) and reports their time.

The modules' fixtures live here too, each module importing the ones it uses: ``redis`` (the module's
own redis-server), ``model`` (the fake model on the host's loopback, for host-driven rounds) or
``bridge_model`` (on the Docker bridge, for co-located rounds), and ``budget_bound(BUDGET)``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.events import chunk_fingerprint, decode_event
from boxwright.runs import RunRecord
from boxwright.stores.open import open_store
from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
from tests.support.coordinator import CoordinatorProcess, trigger
from tests.support.docker import RUNNER_IMAGE, bridge_address, require_image
from tests.support.redis_server import RedisServer, redis_server
from tests.support.require import agent_cli
from tests.support.sse import Frame, SseParser

# Renewed every second: a replica whose loop stalls under the load of CI (two cores, claude starting) keeps it.
LEASE_MS = 3000
INTRO = "Let me wait for the tool first."
FINAL = "Waited, and all done now."
# The Bash call is long enough that a kill after its start lands while the agent is in it.
TOOL = "sleep 1.5; echo tool-done"
SCRIPT: list[Step] = [ToolCall("Bash", {"command": TOOL, "description": "wait a little"}, text=INTRO), Text(FINAL)]
PROMPT = "[[script:chaos]] wait for the tool, then finish"
ROUND_TIMEOUT_S = 150.0

KillPoint = Callable[[list[str]], bool]


def after(kind: str, nth: int = 1) -> KillPoint:
    """A kill point: once the client got ``nth`` events of type ``kind`` through A."""
    return lambda seen: seen.count(kind) >= nth


# (name, predicate on the event types the client got through A so far); "at-trigger" (A killed right
# after the 202, before any event) is a round of its own: ``kill_round(..., stop=None)``.
KILL_POINTS: list[tuple[str, KillPoint]] = [
    ("first-event", lambda seen: len(seen) >= 1),
    ("mid-text", after("TEXT_MESSAGE_CONTENT")),
    ("text-end", after("TEXT_MESSAGE_END")),
    ("tool-start", after("TOOL_CALL_START")),
    ("tool-args-end", after("TOOL_CALL_END")),
    ("tool-result", after("TOOL_CALL_RESULT")),
    ("final-text", after("TEXT_MESSAGE_START", 2)),
    ("final-text-end", after("TEXT_MESSAGE_END", 2)),
    ("after-last", after("RUN_FINISHED")),
]


@dataclass
class Round:
    name: str
    before: list[Frame] = field(default_factory=list)  # what the client got through A
    after: list[Frame] = field(default_factory=list)  # what it got through B, from its last offset
    record_at_kill: RunRecord | None = None
    record: RunRecord | None = None


def tail(
    url: str,
    run_id: str,
    thread_id: str,
    *,
    last_event_id: str | None = None,
    stop: KillPoint | None = None,
    timeout: float = ROUND_TIMEOUT_S,
) -> list[Frame]:
    """SSE frames ``(event, id, data)`` until the status frame or until ``stop(types seen)`` holds."""
    headers = CoordinatorProcess.headers({"Last-Event-ID": last_event_id} if last_event_id else None)
    out: list[Frame] = []
    types: list[str] = []
    parser = SseParser()
    # Pings (every 15 s) keep a read timeout from ever firing on a run nobody drives: bound the whole tail.
    deadline = time.monotonic() + timeout
    with httpx.stream(
        "GET",
        f"{url}/runs/{run_id}/events",
        params={"threadId": thread_id},
        headers=headers,
        timeout=httpx.Timeout(10, read=timeout),
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id}: no end of its tail after {timeout} s ({len(out)} frames)")
            if (frame := parser.feed(line)) is None:
                continue
            out.append(frame)
            if frame.event == "status":
                return out
            if frame.event is None:
                types.append(json.loads(frame.data)["type"])
                if stop is not None and stop(types):
                    return out
    return out


def stored_record(store_url: str, run_id: str) -> RunRecord | None:
    async def read() -> RunRecord | None:
        async with open_store(store_url) as stores:
            return await stores.runs.get(run_id)

    return asyncio.run(read())


def stored_events(store_url: str, run_id: str) -> list[tuple[str, Any]]:
    """``(offset, event)`` of the run's whole stored log."""

    async def read() -> list[tuple[str, Any]]:
        async with open_store(store_url) as stores:
            return [(offset, event) async for offset, event in stores.events.read(run_id, live=False)]

    return asyncio.run(read())


def frame_events(frames: list[Frame]) -> list[tuple[str, Any]]:
    return [(ident or "", decode_event(data)) for event, ident, data in frames if event is None]


def check_exactly_once(rnd: Round, full: list[Frame], failures: str) -> None:
    """The client's two tails together are the whole log, each event once, in order, and the run completed."""
    got = frame_events(rnd.before) + frame_events(rnd.after)
    whole = frame_events(full)
    offsets = [offset for offset, _ in got]
    prints = [chunk_fingerprint(event) for _, event in got]
    assert rnd.after and rnd.after[-1][0] == "status", (rnd.name, rnd.after[-3:], failures)
    status = json.loads(rnd.after[-1][2])
    assert status["status"] == "completed", (rnd.name, status, failures)
    assert all(offsets) and len(offsets) == len(set(offsets)), (rnd.name, "an offset was delivered twice", offsets)
    assert len(prints) == len(set(prints)), (rnd.name, "an event was delivered twice", [e.type for _, e in got])
    assert offsets == [o for o, _ in whole], (rnd.name, "the client missed or reordered an event", failures)
    assert prints == [chunk_fingerprint(e) for _, e in whole], rnd.name
    types = [event.type for _, event in got]
    assert types[0] == "RUN_STARTED" and types.count("RUN_STARTED") == 1, (rnd.name, types)
    assert types[-1] == "RUN_FINISHED" and types.count("RUN_FINISHED") == 1, (rnd.name, types)
    starts = [e for _, e in got if e.type == "TOOL_CALL_START"]
    results = [e for _, e in got if e.type == "TOOL_CALL_RESULT"]
    text_seen = "".join(e.delta for _, e in got if e.type == "TEXT_MESSAGE_CONTENT")
    assert [s.tool_call_name for s in starts] == ["Bash"], (
        rnd.name,
        types,
        text_seen,
        [e for _, e in got if e.type == "CUSTOM"],
    )
    assert [r.tool_call_id for r in results] == [starts[0].tool_call_id], (rnd.name, types)
    assert "tool-done" in str(results[0].content), (rnd.name, results[0].content)
    text = "".join(e.delta for _, e in got if e.type == "TEXT_MESSAGE_CONTENT")
    assert text.count(INTRO) == 1 and text.count(FINAL) == 1, (rnd.name, text)


class ModuleBudget:
    """A module's bound: ``check()`` fails a case that starts once ``seconds`` are spent; ``timed`` reports rounds.

    Started by the module's first case, not at import: pytest-xdist imports every module when its
    worker starts, and may run a given file only many minutes later.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.durations: list[tuple[str, float]] = []
        self._started: float | None = None

    def check(self) -> None:
        if self._started is None:
            self._started = time.monotonic()
        spent = time.monotonic() - self._started
        assert spent < self.seconds, f"the chaos module ran past its budget of {self.seconds} s ({spent:.0f} s)"

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.durations.append((name, time.monotonic() - started))
            print(f"\nchaos {name}: {time.monotonic() - started:.1f} s")

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.durations)

    def report(self, what: str) -> None:
        """Print the rounds' time; the module's last case, so a module that ran past its budget fails."""
        print(f"\n{what} rounds: {len(self.durations)}, {self.total:.1f} s in all")
        assert self.total < self.seconds


def budget_bound(budget: ModuleBudget) -> Any:
    """The autouse fixture a module binds to a name of its own (``_bound = budget_bound(BUDGET)``): a case that
    starts once the module's budget is spent fails instead of growing the CI time."""

    @pytest.fixture(autouse=True)
    def _module_bound() -> Iterator[None]:
        budget.check()
        yield

    return _module_bound


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    agent_cli("claude")
    with FakeModelServer({"chaos": SCRIPT}) as server:
        yield server


@pytest.fixture(scope="module")
def bridge_model() -> Iterator[FakeModelServer]:
    agent_cli("claude")
    require_image(RUNNER_IMAGE)
    # On the Docker bridge: the agents in the runner's containers reach it there.
    with FakeModelServer({"chaos": SCRIPT}, host=bridge_address()) as server:
        yield server


class Pair:
    """Two replicas over one store; ``replace(dead)`` starts a fresh one in the dead one's place.

    The replacement starts in a thread while the round goes on (a process start is a second or two
    of imports), and joins the pair when the next round asks for it.
    """

    def __init__(self, tmp: Path, store: str, env: dict[str, str]) -> None:
        self.tmp, self.store, self.env = tmp, store, env
        self.count = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._live = [self._start(), self._start()]
        self._coming: concurrent.futures.Future[CoordinatorProcess] | None = None

    def _start(self) -> CoordinatorProcess:
        self.count += 1
        name, tmp, store = f"r{self.count}", self.tmp, self.store
        return CoordinatorProcess(name, tmp, "true", store=store, lease_ms=LEASE_MS, env=self.env, startup_s=90)

    @property
    def live(self) -> list[CoordinatorProcess]:
        if self._coming is not None:
            self._live.append(self._coming.result(timeout=60))
            self._coming = None
        return self._live

    def replace(self, dead: CoordinatorProcess) -> None:
        self._live = [p for p in self.live if p is not dead]
        self._coming = self._pool.submit(self._start)
        dead.close()

    def failures(self) -> str:
        return "\n".join(f"{p.name}: {p.stderr()[-1500:]}" for p in self.live)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.live  # noqa: B018 - joins a replacement still starting, so it is closed too
        self._pool.shutdown(wait=True)
        for process in self._live:
            process.close()


def kill_round(
    pair: Pair,
    name: str,
    stop: KillPoint | None,
    harness: str,
    sandbox: str | None,
    tail_s: float = ROUND_TIMEOUT_S,
) -> Round:
    """One round: trigger on A, tail it to ``stop`` (``None``: not at all), SIGKILL A, read the rest through B.

    Checks exactly-once delivery, the completed record, and the epoch: 2 for a run A had not
    finished (B's under a new claim), 1 for one A had already finished.
    """
    a, b = pair.live
    rnd = Round(name)
    thread, run = f"t-{secrets.token_hex(4)}", f"r-chaos-{name}-{secrets.token_hex(4)}"
    meta: dict[str, Any] = {"harness": harness} | ({"sandbox": sandbox} if sandbox else {})
    started = a.post("/runs", trigger(thread, PROMPT, run, **meta))
    assert started.status_code == 202, started.text
    if stop is not None:
        rnd.before = tail(a.url, run, thread, stop=stop)
        assert rnd.before and rnd.before[-1][0] != "status", (name, "the run ended before its kill point")
    a.kill()
    rnd.record_at_kill = stored_record(pair.store, run)
    failures = f"A ({a.name}): {a.stderr()[-2500:]}\nB ({b.name}): {b.stderr()[-2500:]}"
    pair.replace(a)
    last = rnd.before[-1][1] if rnd.before else None
    try:
        rnd.after = tail(b.url, run, thread, last_event_id=last, timeout=tail_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{failures}\nB now: {b.stderr()[-2500:]}") from None
    full = tail(b.url, run, thread)
    rnd.record = stored_record(pair.store, run)
    check_exactly_once(rnd, full, f"{failures}\nB now: {b.stderr()[-2500:]}")
    assert rnd.record is not None and rnd.record.status == "completed", (name, rnd.record, failures)
    finished_by_a = rnd.record_at_kill is not None and rnd.record_at_kill.status == "completed"
    assert rnd.record.driver_epoch == (1 if finished_by_a else 2), (name, rnd.record_at_kill, rnd.record, failures)
    if stop is None:
        assert rnd.before == [] and rnd.record_at_kill is not None, "the 202 came after the record was stored"
    return rnd
