"""Chaos on the shipped path: drivers of durable runs die or freeze at exact points; others take the runs over.

Every app process is tests/e2e/chaos_app.py: ``SandboxService`` + ``sandbox_routes`` under uvicorn,
default settings (default 5 s quiet window, default journal), over one SQLite file, driving the
real ``claude`` against tests/fixtures/fake_model.py. Only the lease TTL is shortened (3 s,
through ``SandboxService(lease_ttl_ms=...)``), so a dead driver's claim frees within a round.
A client tails the first driver over SSE, loses it, and comes back to another process with its
``Last-Event-ID``, which is what takes the run over (``take_over_if_orphaned``).

The first driver is killed or stopped from inside, at a named fault point (``BOXWRIGHT_FAULT``,
see boxwright/_faults.py), so each round is one exact interleaving, not a timer racing the run:

- ``kill-*``: SIGKILL at 10 points, from mid-append (inside the SQLite append transaction) to
  right after the agent's exit sentinel and right before the terminal record write, and one
  during the *successor's* quiet window (a third process finishes, epoch 3);
- ``stop-*``: SIGSTOP at 5 points, the lease expires, another process takes over, and the
  frozen driver gets SIGCONT once the successor has claimed, appended, or finished;
- ``successor-killed``: the successor dies after landing a batch; a third one finishes;
- ``race``: two processes take the run over at once; one drives, the other only serves.

Every round asserts, against one uninterrupted reference run (``project`` in tests/support/chaos.py
says which fields are made comparable and why): the client got every event exactly once and in
order, CUSTOM events included with their values; the log stores exactly those. The one exception
to "in order" is where a ``sandbox.file`` event lands among the agent's events: a watcher racing
the agent sees it, so a successor that inherits a file written while no driver lived reports it
after replaying the call that wrote it, later than the reference. Those are compared by the rule
every correct run keeps (``compare_runs``): each exactly once, with its values, in its path's
order, after the end of its tool call and before the diff and the end. The run ended
``completed`` at the expected epoch; and the SQLite write audit (triggers recording every append
and record write with the epoch in force, in the writer's transaction) shows one claim per
handover, no record stamp (``detached_since``, status) after a handover but the final one, and
nothing at all after the terminal write. The journal is gone once the run is terminal.

The rounds run four at a time (most of a round is the lease and the quiet window: waiting).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import find_claude
from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
from tests.support.chaos import (
    App,
    Message,
    Write,
    compare_runs,
    install_audit,
    journal_exists,
    project,
    stored,
    tail,
    writes,
)
from tests.support.require import missing

# Shortened through the public SandboxService option; the quiet window stays the default (5 s).
LEASE_MS = 3_000
PROMPT = "[[script:chaos]] run the steps"
STEPS = 3
WORKERS = 4
# Generous: a round waits out a lease (3 s) and a quiet window (5 s) or two on a loaded 2-core machine.
ROUND_TIMEOUT_S = 120.0
# How long a SIGCONTed driver is given to misbehave before the audit is read.
SETTLE_S = 3.0


def _script() -> list[Step]:
    # Files, so the watcher's CUSTOM file events are part of what must arrive exactly once. Each file
    # appears whole, by a rename from an ignored directory: `echo > f` is two states (created empty,
    # then written), and a watcher on a loaded machine may truly see both, so no run could promise
    # one event for it. The sleep keeps the file event (the watcher reports ~0.2 s after the write)
    # ahead of the tool's result in an uninterrupted run, loaded or not.
    calls: list[Step] = [
        ToolCall(
            "Bash",
            {
                "command": f"mkdir -p node_modules && echo step {i} > node_modules/s{i} && "
                f"mv node_modules/s{i} step{i}.txt; sleep 1",
                "description": f"step {i}",
            },
        )
        for i in range(STEPS)
    ]
    return [*calls, Text("All steps done.")]


@dataclass(frozen=True)
class Round:
    name: str
    first: str  # BOXWRIGHT_FAULT of the first driver
    successors: tuple[str, ...] = ()  # faults of successors that die in turn before the shared one finishes
    sigcont: str | None = None  # stop rounds: SIGCONT once the successor has "claimed", "appended" or "finished"
    race: bool = False

    @property
    def epoch(self) -> int:
        return 2 + len(self.successors)


ROUNDS = [
    # SIGKILL of the first driver at 9 points, plus one during the successor's quiet window.
    Round("kill-mid-append-3", "log.append:3"),
    Round("kill-journal-line-2", "agent.journal-line:2"),
    Round("kill-before-append-5", "run.append:5"),
    Round("kill-mid-append-7", "log.append:7"),
    Round("kill-journal-line-12", "agent.journal-line:12"),
    Round("kill-mid-append-10", "log.append:10"),
    Round("kill-before-append-13", "run.append:13"),
    Round("kill-after-exit-sentinel", "agent.exit-sentinel"),
    Round("kill-before-terminal-record", "run.finish"),
    Round("kill-in-successor-quiet-window", "agent.journal-line:6", successors=("takeover.quiet-window",)),
    # SIGSTOP, lease expiry, takeover, SIGCONT.
    Round("stop-journal-line-4", "agent.journal-line:4:stop", sigcont="claimed"),
    Round("stop-before-append-3", "run.append:3:stop", sigcont="appended"),
    Round("stop-after-exit-sentinel", "agent.exit-sentinel:stop", sigcont="finished"),
    Round("stop-before-terminal-record", "run.finish:stop", sigcont="claimed"),
    Round("stop-journal-line-20", "agent.journal-line:20:stop", sigcont="finished"),
    # The successor killed after it landed a batch; two successors racing.
    Round("successor-killed", "agent.journal-line:3", successors=("run.append:2",)),
    Round("race", "log.append:5", race=True),
]


@dataclass
class Chaos:
    tmp: Path
    claude: str
    model: FakeModelServer
    finisher: App  # the shared successor that finishes every round
    reference: list[Any]

    @property
    def db(self) -> Path:
        return self.tmp / "chaos.db"

    def app(self, name: str, fault: str | None = None) -> App:
        return App(name, self.tmp, self.claude, self.model, lease_ms=LEASE_MS, fault=fault)


def _where(fault: str) -> str:
    """``name pass n`` for a ``BOXWRIGHT_FAULT`` value, as the struck process reports it."""
    parts = fault.split(":")
    return f"{parts[0]} pass {next((p for p in parts[1:] if p.isdigit()), '1')}"


def _status(messages: list[Message]) -> dict[str, Any] | None:
    if messages and messages[-1].kind == "status":
        status: dict[str, Any] = json.loads(messages[-1].data)
        return status
    return None


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _claimed(db: Path, run_id: str, epoch: int) -> Callable[[], bool]:
    return lambda: any(w.kind == "record" and w.epoch == epoch for w in writes(db, run_id))


def _appended(db: Path, run_id: str, epoch: int) -> Callable[[], bool]:
    return lambda: any(w.kind == "append" and w.epoch == epoch for w in writes(db, run_id))


def _finished(db: Path, run_id: str) -> Callable[[], bool]:
    return lambda: stored(db, run_id).record["status"] != "running"


def _check_events(chaos: Chaos, r: Round, run_id: str, thread_id: str, messages: list[Message], who: str) -> None:
    status = _status(messages)
    assert status is not None and status["status"] == "completed", f"{who}: ended {status} after {len(messages)}"
    data = messages[:-1]
    ids = [m.id for m in data]
    assert all(i is not None for i in ids), f"{who}: a message without an offset"
    assert len(set(ids)) == len(ids), f"{who}: an offset delivered twice"
    assert ids == sorted(ids, key=str), f"{who}: offsets out of order"
    got = project([m.event for m in data], run_id, thread_id, str(chaos.tmp / "sandboxes"))
    difference = compare_runs(got, chaos.reference)
    assert difference is None, f"{who}: not the reference run: {difference}"


def _check_store(chaos: Chaos, r: Round, run_id: str, thread_id: str) -> None:
    st = stored(chaos.db, run_id)
    got = project(st.events, run_id, thread_id, str(chaos.tmp / "sandboxes"))
    difference = compare_runs(got, chaos.reference)
    assert difference is None, f"the stored log is not the reference run: {difference}"
    assert st.closed, "the log of a finished run is closed"
    record = st.record
    assert record["status"] == "completed", record
    assert record["error_message"] is None and record["finished_at"] is not None, record
    assert record["detached_since"] is None, f"a finished run carries a detach stamp: {record}"
    assert not record["cancel_requested"], record
    assert record["driver_epoch"] == r.epoch, f"epoch {record['driver_epoch']}, expected {r.epoch}: {record}"


def _completes_the_new_record(w: Write) -> bool:
    """The creating request's one write before any claim: the trigger's input and profile names.

    It touches none of the fields a driver fences (status, epoch, cancel, error, detach stamp), so it
    is no driver's write; the audit row shows exactly that.
    """
    detail = json.loads(w.detail or "{}")
    return (
        w.kind == "record"
        and w.epoch is None
        and detail.get("old_epoch") is None
        and w.status == "running"
        and detail.get("old_status") == "running"
        and w.detached_since is None
        and not detail.get("cancel")
        and detail.get("error") is None
    )


def _check_audit(chaos: Chaos, r: Round, run_id: str) -> list[Write]:
    audit = writes(chaos.db, run_id)
    claims = [w for w in audit if w.kind == "record" and w.epoch != w.old_epoch]
    assert [w.epoch for w in claims] == list(range(1, r.epoch + 1)), f"claims: {claims}"
    terminal = [i for i, w in enumerate(audit) if w.kind == "record" and w.status != "running"]
    assert len(terminal) == 1, f"one terminal record write, not {[audit[i] for i in terminal]}"
    assert audit[terminal[0]].epoch == r.epoch and audit[terminal[0]].status == "completed", audit[terminal[0]]
    after = audit[terminal[0] + 1 :]
    assert [w.kind for w in after] == ["close"], f"written after the terminal record: {after}"
    current = 0
    for w in audit:
        if w.kind == "record" and w.epoch != w.old_epoch:
            current = w.epoch or 0
            continue
        if current == 0 and _completes_the_new_record(w):
            continue
        # The epoch in force is the audit's; a write at an older one cannot happen through the stores' CAS.
        assert w.kind == "close" or w.epoch == current, f"a write at epoch {w.epoch} while {current} held: {w}"
        if w.kind == "record" and current > 1:
            # After a handover only the successor writes the record: clearing the stamp, then the terminal status.
            assert w.detached_since is None, f"a detach stamp after the handover to epoch {current}: {w}"
    if any(f.startswith("takeover.quiet-window") for f in r.successors):
        assert not any(w.kind == "append" and w.epoch == 2 for w in audit), "a successor killed in its quiet window"
    if any(f.startswith("run.append:2") for f in r.successors):
        assert any(w.kind == "append" and w.epoch == 2 for w in audit), "the killed successor landed one batch first"
    return audit


def _play(chaos: Chaos, r: Round) -> None:
    run_id = f"chaos-{r.name}-{uuid.uuid4().hex[:6]}"
    thread_id = f"t-{run_id}"
    apps: list[App] = []
    try:
        first = chaos.app(f"{r.name}-a", r.first)
        apps.append(first)
        first.trigger(run_id, thread_id, PROMPT)
        url = f"{first.url}/runs/{run_id}/events"
        delivered: list[Message] = []
        # A stopped server sends nothing and closes nothing: the client gives up on silence.
        reader = threading.Thread(target=lambda: delivered.extend(tail(url, read_timeout=3.0)))
        reader.start()
        if r.sigcont is None:
            code = first.wait_dead(ROUND_TIMEOUT_S)
            assert code == -signal.SIGKILL, f"the first driver ended {code}, not killed at {r.first}"
        else:
            first.wait_stopped(ROUND_TIMEOUT_S)
        reader.join(ROUND_TIMEOUT_S)
        assert first.faulted() == _where(r.first), f"the first driver was struck at {first.faulted()}"
        assert _status(delivered) is None, f"the run ended before its fault point {r.first}: {delivered[-1]}"
        for i, fault in enumerate(r.successors):
            successor = chaos.app(f"{r.name}-b{i}", fault)
            apps.append(successor)
            last = delivered[-1].id if delivered else None
            got = tail(f"{successor.url}/runs/{run_id}/events", last_id=last)
            code = successor.wait_dead(ROUND_TIMEOUT_S)
            assert code == -signal.SIGKILL, f"successor {i} ended {code}, not killed at {fault}"
            assert successor.faulted() == _where(fault), f"successor {i} was struck at {successor.faulted()}"
            assert _status(got) is None, f"successor {i} finished the run before its fault point {fault}"
            delivered += got
        last = delivered[-1].id if delivered else None
        finishers = [chaos.finisher]
        if r.race:
            racer = chaos.app(f"{r.name}-racer")
            apps.append(racer)
            finishers.append(racer)
        with ThreadPoolExecutor(len(finishers)) as pool:
            rests = [pool.submit(tail, f"{f.url}/runs/{run_id}/events", last_id=last) for f in finishers]
            if r.sigcont is not None:
                wait = {
                    "claimed": _claimed(chaos.db, run_id, 2),
                    "appended": _appended(chaos.db, run_id, 2),
                    "finished": _finished(chaos.db, run_id),
                }[r.sigcont]
                _wait_for(f"the successor to have {r.sigcont}", wait, ROUND_TIMEOUT_S)
                first.cont()
            results = [rest.result(ROUND_TIMEOUT_S) for rest in rests]
        for who, rest in zip(("client", "racing client"), results, strict=False):
            _check_events(chaos, r, run_id, thread_id, delivered + rest, who)
        if r.sigcont is not None:
            time.sleep(SETTLE_S)  # the thawed driver's chance to write what it must not
        _check_store(chaos, r, run_id, thread_id)
        _check_audit(chaos, r, run_id)
        _wait_for("the journal of the terminal run to be removed", lambda: not journal_exists(run_id), 15)
    finally:
        for app in apps:
            app.stop()


# The module fixture plays every round (four at a time) before the first round's test reports, so
# the per-test default (300 s) would bound all 17 rounds together; each round has its own waits.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def claude() -> str:
    found = find_claude()
    if found is None:
        missing("the `claude` CLI is not installed (npm install @anthropic-ai/claude-code)")
    return found


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, claude: str) -> Iterator[dict[str, BaseException | None]]:
    tmp = tmp_path_factory.mktemp("chaos")
    install_audit(tmp / "chaos.db")
    with FakeModelServer({"chaos": _script()}) as model:
        finisher = App("finisher", tmp, claude, model, lease_ms=LEASE_MS)
        try:
            run_id = f"ref-{uuid.uuid4().hex[:8]}"
            finisher.trigger(run_id, f"t-{run_id}", PROMPT)
            messages = tail(f"{finisher.url}/runs/{run_id}/events")
            assert _status(messages) == {"status": "completed"}, messages[-1:]
            events = [m.event for m in messages[:-1]]
            names = [getattr(e, "name", None) for e in events if e.type == "CUSTOM"]
            assert names == ["run.accepted", "claude-code.session-id", *["sandbox.file"] * STEPS], names
            # AG-UI order (issue 18): RUN_STARTED first, then the run.accepted announcement.
            assert events[0].type == "RUN_STARTED" and events[1].type == "CUSTOM" and events[-1].type == "RUN_FINISHED"
            reference = project(events, run_id, f"t-{run_id}", str(tmp / "sandboxes"))
            chaos = Chaos(tmp, claude, model, finisher, reference)
            results: dict[str, BaseException | None] = {}

            def play(r: Round) -> None:
                try:
                    _play(chaos, r)
                    results[r.name] = None
                except BaseException as exc:  # reported by the round's own test
                    results[r.name] = exc

            started = time.monotonic()
            with ThreadPoolExecutor(WORKERS) as pool:
                list(pool.map(play, ROUNDS))
            print(f"chaos: {len(ROUNDS)} rounds in {time.monotonic() - started:.1f} s")
            for name, failure in results.items():
                print(f"  {name}: {'ok' if failure is None else str(failure).splitlines()[0][:300]}")
            yield results
        finally:
            finisher.stop()


@pytest.mark.parametrize("name", [r.name for r in ROUNDS])
def test_round(outcomes: dict[str, BaseException | None], name: str) -> None:
    failure = outcomes[name]
    if failure is not None:
        raise failure
