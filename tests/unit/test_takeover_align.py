"""align_to_stored_log: a successor forwards only what the log does not hold yet (R31-R34)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
)
from boxwright.takeover import (
    JournalReplayDivergedError,
    JournalReplayThreadIdMismatchError,
    align_to_stored_log,
    is_out_of_band,
)

RUN = [
    RunStartedEvent(thread_id="t1", run_id="r7", timestamp=1),
    TextMessageStartEvent(message_id="r7-0", role="assistant", timestamp=2),
    TextMessageContentEvent(message_id="r7-0", delta="Hel", timestamp=3),
    TextMessageContentEvent(message_id="r7-0", delta="lo", timestamp=4),
    TextMessageEndEvent(message_id="r7-0", timestamp=5),
    RunFinishedEvent(thread_id="t1", run_id="r7", finish_reason="stop", timestamp=6),
]
FILE = CustomEvent(name="sandbox.file", value={"type": "change", "path": "a.txt"})


def _later(events: Sequence[Event]) -> list[Event]:
    """The same events as a replay re-derives them: equal but for timestamps."""
    import msgspec

    return [msgspec.structs.replace(e, timestamp=(e.timestamp or 0) + 1000) for e in events]


async def _source(events: Sequence[Event], pulled: list[int] | None = None) -> AsyncIterator[Event]:
    for event in events:
        if pulled is not None:
            pulled.append(1)
        yield event


def _align(stored: Sequence[Event], replay: Sequence[Event], **kw: object) -> list[Event]:
    calls: list[int] = []
    pulled: list[int] = []

    async def snapshot() -> list[Event]:
        calls.append(len(pulled))
        return list(stored)

    async def main() -> list[Event]:
        return [e async for e in align_to_stored_log(_source(replay, pulled), snapshot, **kw)]  # type: ignore[arg-type]

    out = asyncio.run(main())
    assert calls == [0], "snapshot exactly once, before the first pull"
    return out


def test_empty_log_passes_everything_through() -> None:
    assert _align([], RUN) == RUN


def test_stored_prefix_is_suppressed_and_the_rest_forwarded() -> None:
    replay = _later(RUN)
    assert _align(RUN[:3], replay) == replay[3:]
    assert _align(RUN, replay) == []


def test_divergence_raises_with_the_index_and_forwards_nothing_for_it() -> None:
    replay = _later(RUN)
    replay[2] = TextMessageContentEvent(message_id="r7-0", delta="Jel")
    with pytest.raises(JournalReplayDivergedError) as err:
        _align(RUN[:4], replay)
    assert err.value.index == 2 and err.value.replayed == replay[2]
    with pytest.raises(JournalReplayDivergedError, match="at event 0"):
        _align(RUN, [TextMessageStartEvent(message_id="x")])


def test_a_replay_that_failed_forwards_its_error_as_the_runs_end() -> None:
    # A successor that cannot read the run (a co-located runner that cannot re-attach) says why, once.
    failed = RunErrorEvent(message="driver lost; runner cannot re-attach", code="colocated_runner_failed")
    assert _align(RUN[:4], [*_later(RUN[:1]), failed, *_later(RUN[1:2])]) == [failed]


def test_a_replay_shorter_than_the_log_raises() -> None:
    with pytest.raises(JournalReplayDivergedError, match="shorter"):
        _align(RUN, _later(RUN[:4]))
    with pytest.raises(JournalReplayDivergedError, match="shorter"):
        _align(RUN, [])


def test_stored_out_of_band_events_are_skipped_only_when_allowed() -> None:
    stored = [RUN[0], FILE, RUN[1], FILE, FILE, RUN[2]]
    replay = _later(RUN)
    with pytest.raises(JournalReplayDivergedError):
        _align(stored, replay)  # strict by default
    assert _align(stored, replay, out_of_band=is_out_of_band) == replay[3:]
    # trailing stored out-of-band entries are fine too
    assert _align([*RUN[:2], FILE], _later(RUN), out_of_band=is_out_of_band) == _later(RUN)[2:]
    # but a run of more than the bound is not
    many = [RUN[0], *[FILE] * 65, RUN[1]]
    with pytest.raises(JournalReplayDivergedError):
        _align(many, _later(RUN), out_of_band=is_out_of_band)
    assert _align([RUN[0], *[FILE] * 64, RUN[1]], _later(RUN), out_of_band=is_out_of_band) == _later(RUN)[2:]


def test_a_thread_id_only_mismatch_is_its_own_error() -> None:
    replay = _later(RUN)
    replay[0] = RunStartedEvent(thread_id="t-other", run_id="r7")
    with pytest.raises(JournalReplayThreadIdMismatchError) as err:
        _align(RUN[:2], replay)
    assert err.value.stored_thread_id == "t1" and err.value.replayed_thread_id == "t-other"
    assert isinstance(err.value, JournalReplayDivergedError)
    both = [RunStartedEvent(thread_id="t-other", run_id="r-other")]
    with pytest.raises(JournalReplayDivergedError) as err2:
        _align(RUN[:1], both)
    assert not isinstance(err2.value, JournalReplayThreadIdMismatchError)
