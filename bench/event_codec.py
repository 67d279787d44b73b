"""Encode + decode 100k AG-UI events: boxwright's msgspec structs vs the official pydantic models.

Run: .venv/bin/python bench/event_codec.py [count]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
from ag_ui.core import Event as OfficialEvent
from pydantic import TypeAdapter

from boxwright import events as ev


def run_like_stream(count: int) -> list[ev.Event]:
    """A run's worth of events in the proportions a coding agent produces them, repeated."""
    gen = ev.create_run_scoped_id_gen("run-bench")
    out: list[ev.Event] = [ev.RunStartedEvent(thread_id="thread-1", run_id="run-bench", timestamp=ev.now_ms())]
    while len(out) < count - 1:
        ts = ev.now_ms()
        msg, call, why = gen("msg"), gen("call"), gen("reasoning")
        out += [
            ev.ReasoningStartEvent(message_id=why, timestamp=ts),
            ev.ReasoningMessageStartEvent(message_id=why, timestamp=ts),
            *(ev.ReasoningMessageContentEvent(message_id=why, delta="considering the repo ", timestamp=ts),) * 5,
            ev.ReasoningMessageEndEvent(message_id=why, timestamp=ts),
            ev.ReasoningEndEvent(message_id=why, timestamp=ts),
            ev.TextMessageStartEvent(message_id=msg, role="assistant", timestamp=ts),
            *(ev.TextMessageContentEvent(message_id=msg, delta="Let me look at the file. ", timestamp=ts),) * 20,
            ev.TextMessageEndEvent(message_id=msg, timestamp=ts),
            ev.ToolCallStartEvent(tool_call_id=call, tool_call_name="Read", parent_message_id=msg, timestamp=ts),
            *(ev.ToolCallArgsEvent(tool_call_id=call, delta='{"path": "src/app.py"}', timestamp=ts),) * 3,
            ev.ToolCallEndEvent(tool_call_id=call, timestamp=ts),
            ev.ToolCallResultEvent(
                message_id=gen("msg"), tool_call_id=call, content="def main():\n    pass\n" * 10, timestamp=ts
            ),
            ev.StateDeltaEvent(delta=[ev.ReplaceOperation(path="/step", value=len(out))], timestamp=ts),
            ev.CustomEvent(name="sandbox.file", value={"path": "src/app.py", "kind": "change"}, timestamp=ts),
        ]
    del out[count - 1 :]
    out.append(ev.RunFinishedEvent(thread_id="thread-1", run_id="run-bench", timestamp=ev.now_ms()))
    return out


def best_of(repeats: int, work: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    repeats = 3
    ours = run_like_stream(count)
    union = TypeAdapter(OfficialEvent)
    official = [union.validate_json(ev.encode_event(e)) for e in ours]

    # Same events, same JSON: the comparison is like for like.
    for mine, theirs in zip(ours[:200], official[:200], strict=True):
        assert msgspec.json.decode(ev.encode_event(mine)) == msgspec.json.decode(theirs.model_dump_json(by_alias=True))

    our_blobs = [ev.encode_event(e) for e in ours]
    their_blobs = [m.model_dump_json(by_alias=True) for m in official]
    their_classes = [type(m) for m in official]
    ndjson = ev.encode_ndjson(ours)

    timings = {
        "boxwright encode_event": best_of(repeats, lambda: [ev.encode_event(e) for e in ours]),
        "boxwright decode_event": best_of(repeats, lambda: [ev.decode_event(b) for b in our_blobs]),
        "boxwright encode_ndjson (one batch)": best_of(repeats, lambda: ev.encode_ndjson(ours)),
        "boxwright decode_ndjson (one batch)": best_of(repeats, lambda: ev.decode_ndjson(ndjson)),
        "ag_ui model_dump_json": best_of(repeats, lambda: [m.model_dump_json(by_alias=True) for m in official]),
        "ag_ui model_validate_json (class known)": best_of(
            repeats, lambda: [c.model_validate_json(s) for c, s in zip(their_classes, their_blobs, strict=True)]
        ),
        "ag_ui TypeAdapter(Event).validate_json": best_of(
            repeats, lambda: [union.validate_json(s) for s in their_blobs]
        ),
    }

    print(f"{count:,} events, {len(ndjson) / count:.0f} bytes/event on average, best of {repeats} runs")
    for name, seconds in timings.items():
        print(f"  {name:42} {count / seconds:>13,.0f} events/s")
    ours_rt = timings["boxwright encode_event"] + timings["boxwright decode_event"]
    theirs_rt = timings["ag_ui model_dump_json"] + timings["ag_ui model_validate_json (class known)"]
    print(f"  {'boxwright encode+decode':42} {count / ours_rt:>13,.0f} events/s")
    print(f"  {'ag_ui encode+decode':42} {count / theirs_rt:>13,.0f} events/s")
    print(f"ratio (boxwright / ag_ui, encode+decode): {theirs_rt / ours_rt:.1f}x")


if __name__ == "__main__":
    main()
