"""Taking a run over from a driver that died: align the replay with the log, claim, fence, drive.

A successor re-reads the agent's journal from byte 0 and translates it again;
translation is deterministic (ids from the run-scoped generator), so its
events repeat what the log already holds, timestamps aside. ``align_to_stored_log``
drops that stored prefix (compared by fingerprint) and forwards only the rest;
a mismatch means the replay is not the same run, and nothing is forwarded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import msgspec

from .errors import BoxwrightError
from .events import CustomEvent, Event, chunk_fingerprint

DEFAULT_MAX_OUT_OF_BAND_SKIP = 64


class JournalReplayDivergedError(BoxwrightError):
    """The replayed run differs from what the event log stores: it is not safe to go on appending."""

    def __init__(self, index: int, stored: Event | None, replayed: Event | None, detail: str = "") -> None:
        self.index = index
        self.stored = stored
        self.replayed = replayed
        stored_fp = chunk_fingerprint(stored) if stored is not None else None
        replayed_fp = chunk_fingerprint(replayed) if replayed is not None else None
        super().__init__(
            f"journal replay diverged from the stored log at event {index}"
            + (f": {detail}" if detail else "")
            + f" (stored {stored.type if stored else 'nothing'} {stored_fp}, "
            f"replayed {replayed.type if replayed else 'nothing'} {replayed_fp})"
        )


class JournalReplayThreadIdMismatchError(JournalReplayDivergedError):
    """Only the thread id differs: the successor drives the run under another thread."""

    def __init__(self, index: int, stored: Event, replayed: Event, stored_thread_id: str, replayed_thread_id: str):
        self.stored_thread_id = stored_thread_id
        self.replayed_thread_id = replayed_thread_id
        super().__init__(
            index, stored, replayed, f"thread id {replayed_thread_id!r} where the log has {stored_thread_id!r}"
        )


def is_out_of_band(event: Event) -> bool:
    """Events not derived from the journal (file and tool-bridge events) may be missing from a replay."""
    return isinstance(event, CustomEvent)


def chunk_thread_id(event: Event) -> str | None:
    thread = getattr(event, "thread_id", None)
    if isinstance(thread, str):
        return thread
    metadata = event.metadata or {}
    value = metadata.get("threadId")
    return value if isinstance(value, str) else None


def _fingerprint_ignoring_thread(event: Event) -> str:
    if getattr(event, "thread_id", None) is None:
        return chunk_fingerprint(event)
    return chunk_fingerprint(msgspec.structs.replace(event, thread_id=""))


async def align_to_stored_log(
    replay: AsyncIterator[Event],
    snapshot: Callable[[], Awaitable[Sequence[Event]]],
    *,
    out_of_band: Callable[[Event], bool] | None = None,
    max_out_of_band_skip: int = DEFAULT_MAX_OUT_OF_BAND_SKIP,
) -> AsyncIterator[Event]:
    """Forward what ``replay`` yields beyond the stored log (R31-R33).

    ``snapshot`` is called once, before the first pull. Stored entries are
    matched in order; a stored out-of-band entry with no counterpart is skipped
    (at most ``max_out_of_band_skip`` in a row); any other mismatch raises
    ``JournalReplayDivergedError`` and forwards nothing for it. A replay that
    ends before the stored log does raises too.
    """
    stored = list(await snapshot())
    skippable = out_of_band or (lambda _event: False)
    position = 0
    skipped_in_a_row = 0
    async for event in replay:
        if position >= len(stored):
            yield event
            continue
        fingerprint = chunk_fingerprint(event)
        while position < len(stored):
            expected = stored[position]
            if chunk_fingerprint(expected) == fingerprint:
                position += 1
                skipped_in_a_row = 0
                break
            if skippable(expected) and skipped_in_a_row < max_out_of_band_skip:
                position += 1
                skipped_in_a_row += 1
                continue
            if skippable(event):
                break  # a replayed out-of-band event the log does not hold here: dropped, not forwarded
            stored_thread, replayed_thread = chunk_thread_id(expected), chunk_thread_id(event)
            if (
                stored_thread != replayed_thread
                and stored_thread is not None
                and replayed_thread is not None
                and _fingerprint_ignoring_thread(expected) == _fingerprint_ignoring_thread(event)
            ):
                raise JournalReplayThreadIdMismatchError(position, expected, event, stored_thread, replayed_thread)
            raise JournalReplayDivergedError(position, expected, event)
        else:
            # Every remaining stored entry was out of band and skipped: this one is new.
            yield event
    while position < len(stored) and skippable(stored[position]):
        position += 1
    if position < len(stored):
        raise JournalReplayDivergedError(position, stored[position], None, "replay shorter than stored log")
