"""The in-sandbox run journal: an append-only NDJSON file the agent's stdout is redirected to.

A harness CLI writes into ``<dir>/<enc(run_id)>.ndjson`` (stderr into a ``.err``
sidecar) through a shell redirect, so no host holds a pipe the agent could die
on; the wrapper shell then appends one nonce'd exit sentinel. Any host with a
handle and the run id replays the file from byte 0: the driver, a takeover,
the reaper's probe, the prune sweep.

Three rules hold everywhere below:

* The agent is redirected, never piped (a vanished reader would SIGPIPE it).
* The journal is touched only through ``process.exec``/``spawn``, never
  ``handle.fs``: local-process maps ``/tmp`` in ``fs`` under its root while the
  shell sees the host ``/tmp``.
* Anything unsure keeps: an unreadable tail is "unknown", not "finished"; a
  name that does not decode, or a run the store cannot vouch for, is not deleted.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import datetime
import hashlib
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal, Protocol

import msgspec

from ._json import MAX_AGENT_LINE_BYTES, decode_json
from ._pull import Ended, Failed, Puller
from .abort import AbortSignal, sleep_unless_aborted
from .errors import (
    AbortError,
    AgentProcessExitError,
    JournalAttachUnavailableError,
    JournalFrameError,
    JournalTruncatedError,
    SandboxCommandError,
)
from .ids import check_encodable_run_id, check_run_id, id_problem
from .sandbox import Capabilities, ProcessOptions, SandboxHandle, SpawnHandle
from .sandbox import journal_read_strategy as _strategy_for_caps
from .shell import quote

DEFAULT_JOURNAL_DIR = "/tmp/boxwright-runs"
NONCE_DOMAIN = "boxwright/journal-exit-sentinel/v1"
EXIT_SENTINEL_KEY = "__exit"
EXIT_SENTINEL_NONCE_KEY = "__nonce"
NONCE_LENGTH = 32
MAX_ENCODED_NAME_LENGTH = 200
TRUNCATION_HASH_LENGTH = 16
DEFAULT_JOURNAL_POLL_MS = 250
DEFAULT_FIRST_BYTE_TIMEOUT_MS = 10_000
DEFAULT_ATTACH_JOURNAL_WAIT_MS = 10_000
DEFAULT_ATTACH_PROBE_INTERVAL_MS = 100
DEFAULT_STDERR_TAIL_BYTES = 4096
DEFAULT_EXIT_PROBE_BYTES = 4096
STDERR_MESSAGE_CHARS = 1000
# A silent reader asks whether its journal still exists this often: GNU `tail -f` keeps
# following a deleted file forever, and a poll of a deleted file looks like a quiet run.
DEFAULT_GONE_PROBE_MS = 1000
DEFAULT_ORPHAN_TTL_MS = 3_600_000
DEFAULT_MAX_DELETES = 200
TERMINAL_RUN_STATUSES = frozenset({"completed", "failed", "aborted"})

# The journal, its stderr sidecar, the workspace listing taken before the agent started (see
# ``journal_files_path``), an interactive agent's inbox and FIFO (``harnesses/relay.py``) and an
# agent's stdin (``journal_stdin_path``): one run's files, pruned and removed together.
JOURNAL_SUFFIXES = (".ndjson", ".err", ".files", ".in", ".fifo", ".stdin")
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_RESERVED = re.compile(r"(?:CON|PRN|AUX|NUL|COM[1-9]|LPT[1-9])", re.IGNORECASE)
_HASHED_TAIL = re.compile(rf"-[0-9a-f]{{{TRUNCATION_HASH_LENGTH}}}")
_HEX2 = re.compile(r"[0-9a-fA-F]{2}")
# Only the exact bytes the wrapper's printf writes count: no spaces, no reordering, no
# `7.0`/`true`/`"7"`. Looser parsing once let an agent's own line end a live run.
_SENTINEL = re.compile(r'\{"__exit":(-?(?:0|[1-9][0-9]*)),"__nonce":"([0-9a-f]{32})"\}')
_WHITESPACE = re.compile(r"\s+")

_log = logging.getLogger("boxwright.journal")

Strategy = Literal["follow", "poll"]
AttachUnavailableReason = Literal["unknown-run", "terminal-run", "journal-timeout", "journal-stalled"]


# -- values ---------------------------------------------------------------------------------------


class JournalPaths(msgspec.Struct, frozen=True):
    """Where one run's journal and stderr sidecar live, and the nonce its sentinel carries."""

    dir: str
    journal: str
    stderr: str
    nonce: str


class JournalLine(msgspec.Struct, frozen=True):
    """One complete journal line (without its ``\\n``); ``end_position`` is the byte offset after it."""

    line: str
    end_position: int


class Decoded(msgspec.Struct, frozen=True):
    """A journal file name decoded to exactly one run id: a store key, never a path."""

    run_id: str


class Truncated(msgspec.Struct, frozen=True):
    """The name may be a hashed (lossy) encoding of a long run id: unrecoverable, keep the file."""


class Malformed(msgspec.Struct, frozen=True):
    """Not a name ``encode_run_id`` could produce: keep the file."""


DecodedJournalRunId = Decoded | Truncated | Malformed


class JournalDirEntry(msgspec.Struct, frozen=True):
    name: str
    mtime_ms: int


class Listed(msgspec.Struct, frozen=True):
    """The mtime listing ran; ``entries`` is complete (possibly, and meaningfully, empty)."""

    entries: tuple[JournalDirEntry, ...]


class Unavailable(msgspec.Struct, frozen=True):
    """The mtime listing did not run as designed: nothing is known, least of all that files are old."""


JournalMtimeListing = Listed | Unavailable


class Finished(msgspec.Struct, frozen=True):
    exit_code: int


class Producing(msgspec.Struct, frozen=True):
    """No valid sentinel: the run is still writing, never started, or its journal is gone."""


class Unknown(msgspec.Struct, frozen=True):
    error: str | None = None


RunExitProbe = Finished | Producing | Unknown


class RunRecordView(Protocol):
    """What the journal needs of a run record: its status (``detached_since`` is read if present)."""

    @property
    def status(self) -> str: ...


class RunLookup(Protocol):
    """The one ``RunStore`` method the journal uses."""

    async def get(self, run_id: str) -> RunRecordView | None: ...


def is_terminal_status(record: RunRecordView) -> bool:
    """Exactly ``completed|failed|aborted``; anything else, junk included, is not (and so is kept)."""
    status = getattr(record, "status", None)
    return isinstance(status, str) and status in TERMINAL_RUN_STATUSES


KeptJournalReason = Literal[
    "non-terminal",
    "orphan-too-recent",
    "age-gate-unavailable",
    "age-gate-missing-entry",
    "undecodable-name",
    "store-error",
    "delete-failed",
    "max-deletes",
]


class KeptJournal(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    names: tuple[str, ...]
    reason: KeptJournalReason
    run_id: str | None = None


class PruneFailure(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    stage: Literal["list", "mtime-list", "store", "delete"]
    message: str
    run_id: str | None = None


class PruneJournalsResult(msgspec.Struct, rename="camel"):
    """What one sweep did. ``listed`` counts file names, ``run_ids`` the distinct runs they decoded to."""

    listed: int = 0
    run_ids: int = 0
    deleted: list[str] = msgspec.field(default_factory=list)
    kept: list[KeptJournal] = msgspec.field(default_factory=list)
    age_gate: Literal["listed", "unavailable"] = "unavailable"
    failures: list[PruneFailure] = msgspec.field(default_factory=list)


# -- names and paths (pure) -----------------------------------------------------------------------


def _escape(data: bytes) -> str:
    return "".join(f"_{byte:02x}" for byte in data)


def encode_run_id(run_id: str) -> str:
    """A filename-safe token for ``run_id``, injective: two runs never share a journal.

    ``[A-Za-z0-9.-]`` pass; every other character (``_`` too, so ``_`` always starts
    an escape) becomes ``_hh`` per UTF-8 byte. A Windows device name is escaped byte
    by byte; over 200 characters keeps 183, then ``-`` and 16 hex of sha256(run_id).
    """
    # Looser than check_run_id: a name an older version wrote must still round-trip (prune keeps it).
    # A lone surrogate encoded as U+FFFD (what JS does) would give two ids one journal: refused.
    data = check_encodable_run_id(run_id).encode("utf-8")
    out = "".join(ch if ch in _SAFE else _escape(ch.encode("utf-8")) for ch in run_id)
    if _RESERVED.fullmatch(out):
        # Only a run id made of safe characters reaches here, and escaping letters is
        # something the normal path never does, so this stays injective.
        out = _escape(data)
    if len(out) > MAX_ENCODED_NAME_LENGTH:
        digest = hashlib.sha256(data).hexdigest()[:TRUNCATION_HASH_LENGTH]
        out = f"{out[: MAX_ENCODED_NAME_LENGTH - TRUNCATION_HASH_LENGTH - 1]}-{digest}"
    return out


def decode_journal_run_id(name: str) -> DecodedJournalRunId:
    """The run id behind a listed journal file name, failing closed (a prune deletes on ``Decoded``)."""
    suffix = next((s for s in JOURNAL_SUFFIXES if name.endswith(s)), None)
    if suffix is None:
        return Malformed()
    token = name[: -len(suffix)]
    if not token:
        return Malformed()
    # Before the character scan: a cut may also split an escape, and truncation is the diagnosis.
    if len(token) > MAX_ENCODED_NAME_LENGTH or (
        len(token) == MAX_ENCODED_NAME_LENGTH
        and _HASHED_TAIL.fullmatch(token, MAX_ENCODED_NAME_LENGTH - TRUNCATION_HASH_LENGTH - 1)
    ):
        return Truncated()
    data = bytearray()
    index = 0
    while index < len(token):
        char = token[index]
        if char == "_":
            if not _HEX2.fullmatch(token, index + 1, index + 3):
                return Malformed()
            data.append(int(token[index + 1 : index + 3], 16))
            index += 3
            continue
        if char not in _SAFE:
            return Malformed()
        data.append(ord(char))
        index += 1
    try:
        return Decoded(bytes(data).decode("utf-8"))
    except UnicodeDecodeError:
        return Malformed()


def _normalize_dir(dir: str) -> str:
    if not isinstance(dir, str) or not dir.startswith("/"):
        # Each command may run in another cwd; a relative dir would name a different file each time.
        raise ValueError(f"journal dir must be an absolute path, got {dir!r}")
    return dir.rstrip("/") or "/"


def _join(dir: str, name: str) -> str:
    return f"{dir}{name}" if dir == "/" else f"{dir}/{name}"


def exit_sentinel_nonce(run_id: str) -> str:
    """sha256 of ``NONCE_DOMAIN:run_id``, 32 hex: derived so a successor recomputes it from the id alone."""
    encode_run_id(run_id)  # the same refusals as the file name
    return hashlib.sha256(f"{NONCE_DOMAIN}:{run_id}".encode()).hexdigest()[:NONCE_LENGTH]


def journal_dir_of(handle: object) -> str:
    """Where ``handle``'s journals live: its own ``journal_dir`` (local-process: a private state
    directory of the sandbox, outside its workspace), else ``DEFAULT_JOURNAL_DIR``, which is only
    right where the sandbox's ``/tmp`` is its own (bubblewrap, containers)."""
    dir = getattr(handle, "journal_dir", None)
    return _normalize_dir(dir) if isinstance(dir, str) else DEFAULT_JOURNAL_DIR


def journal_paths(run_id: str, dir: str = DEFAULT_JOURNAL_DIR) -> JournalPaths:
    """Both file paths and the nonce of ``run_id``'s journal (``check_run_id`` refuses a bad id). Pure."""
    normalized = _normalize_dir(dir)
    name = encode_run_id(check_run_id(run_id))
    return JournalPaths(
        dir=normalized,
        journal=_join(normalized, f"{name}.ndjson"),
        stderr=_join(normalized, f"{name}.err"),
        nonce=exit_sentinel_nonce(run_id),
    )


def exit_sentinel_line(paths: JournalPaths, exit_code: int) -> str:
    """The sentinel line (no newline), byte-identical to what ``journaled_command``'s printf writes."""
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise ValueError(f"exit code must be an int, got {exit_code!r}")
    return f'{{"{EXIT_SENTINEL_KEY}":{exit_code},"{EXIT_SENTINEL_NONCE_KEY}":"{paths.nonce}"}}'


# -- commands (pure) ------------------------------------------------------------------------------


def _tail_from(from_byte: int) -> int:
    if isinstance(from_byte, bool) or not isinstance(from_byte, int) or from_byte < 0:
        raise ValueError(f"from_byte must be an int >= 0, got {from_byte!r}")
    return from_byte + 1  # tail -c +N is 1-based


def _positive(n: int, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"{what} must be an int > 0, got {n!r}")
    return n


def journaled_command(command: str, paths: JournalPaths) -> str:
    """``command`` with stdout appended to the journal, stderr to the sidecar, then the sentinel.

    A subshell, not a ``{ }`` group, so a bare ``exit`` cannot skip the sentinel; ``>>``
    never truncates a prefix a previous host delivered. ``command`` is shell text, raw.
    The dir (0700) and both files (0600) are created first under ``umask 077`` in a subshell of
    their own, so raw agent output is never readable by another user, not even for the first
    byte, while the agent itself keeps the umask it was given.
    """
    printf = f'printf \'{{"{EXIT_SENTINEL_KEY}":%d,"{EXIT_SENTINEL_NONCE_KEY}":"{paths.nonce}"}}\\n\' "$?"'
    return (
        f"{_private_files(paths)} && {{ ( {command} ); {printf}; }} >> {quote(paths.journal)} 2>> {quote(paths.stderr)}"
    )


def _private_files(paths: JournalPaths) -> str:
    return f"( umask 077 && mkdir -p {quote(paths.dir)} && : >> {quote(paths.journal)} && : >> {quote(paths.stderr)} )"


def journal_follow_command(paths: JournalPaths, from_byte: int = 0) -> str:
    """``tail -f`` from ``from_byte``, for ``spawn`` only. Creates the file first (``tail -f`` exits on
    a missing one) and pipes into nothing: a filter's stdio buffer would hold the lines back."""
    return (
        f"umask 077; mkdir -p {quote(paths.dir)} 2>/dev/null; : >> {quote(paths.journal)} 2>/dev/null; "
        f"tail -c +{_tail_from(from_byte)} -f {quote(paths.journal)} 2>/dev/null"
    )


def journal_read_command(paths: JournalPaths, from_byte: int = 0) -> str:
    """A bounded read from ``from_byte``, base64-framed (``exec`` closes base64's stdin, so it flushes)."""
    return f"tail -c +{_tail_from(from_byte)} {quote(paths.journal)} 2>/dev/null | base64"


def journal_exists_command(paths: JournalPaths) -> str:
    return f"test -f {quote(paths.journal)}"


def journal_stderr_read_command(paths: JournalPaths, max_bytes: int = DEFAULT_STDERR_TAIL_BYTES) -> str:
    return f"tail -c -{_positive(max_bytes, 'max_bytes')} {quote(paths.stderr)} 2>/dev/null | base64"


def journal_exit_probe_command(paths: JournalPaths, max_bytes: int = DEFAULT_EXIT_PROBE_BYTES) -> str:
    return f"tail -c -{_positive(max_bytes, 'max_bytes')} {quote(paths.journal)} 2>/dev/null | base64"


def journal_files_path(paths: JournalPaths) -> str:
    """Where a journaled run keeps its workspace listing from before its agent started (private, mode 600).

    A successor's watcher starts after the writes made while no driver lived; from this listing and
    the file events the log holds it reports what the log lacks (``WorkspaceWatcher.release``).
    """
    return paths.journal.removesuffix(".ndjson") + ".files"


def journal_inbox_path(paths: JournalPaths) -> str:
    """Where a relayed (interactive) agent's stdin lines are kept, in order (private, mode 600): what the
    client said, so a successor knows it (``harnesses/relay.py``)."""
    return paths.journal.removesuffix(".ndjson") + ".in"


def journal_stdin_path(paths: JournalPaths) -> str:
    """Where a journaled agent's stdin (its prompt) is kept (private, mode 600) until the journal goes."""
    return paths.journal.removesuffix(".ndjson") + ".stdin"


def journal_fifo_path(paths: JournalPaths) -> str:
    """The FIFO a relayed agent reads its stdin from; its removal asks the relay to stop the agent."""
    return paths.journal.removesuffix(".ndjson") + ".fifo"


def journal_cleanup_command(paths: JournalPaths) -> str:
    relay = f" {quote(journal_inbox_path(paths))} {quote(journal_fifo_path(paths))}"
    kept = f" {quote(journal_files_path(paths))} {quote(journal_stdin_path(paths))}"
    return f"rm -f {quote(paths.journal)} {quote(paths.stderr)}" + kept + relay


def journal_list_command(dir: str = DEFAULT_JOURNAL_DIR) -> str:
    # stderr silenced: a provider that folds it into stdout would hand "ls: cannot access" to the decoder.
    return f"ls -1 {quote(_normalize_dir(dir))} 2>/dev/null"


def journal_mtime_list_command(dir: str = DEFAULT_JOURNAL_DIR) -> str:
    """``stat`` of the dir itself (the witness) and its files: no witness line means no listing."""
    normalized = quote(_normalize_dir(dir))
    return f"stat -c '%Y %n' {normalized} {normalized}/* 2>/dev/null"


# -- parsing (pure) -------------------------------------------------------------------------------


def parse_exit_sentinel(line: str, paths: JournalPaths) -> int | None:
    """The exit code if ``line`` is exactly this run's sentinel, else ``None`` (never coerced to 0)."""
    match = _SENTINEL.fullmatch(line)
    if match is None or match.group(2) != paths.nonce:
        return None
    return int(match.group(1))


def parse_journal_exit(text: str, paths: JournalPaths) -> int | None:
    """The last valid sentinel in a journal tail: the shell writes the real one after the agent's output."""
    for line in reversed(text.split("\n")):
        code = parse_exit_sentinel(line, paths)
        if code is not None:
            return code
    return None


def parse_journal_mtime_listing(text: str, dir: str = DEFAULT_JOURNAL_DIR) -> JournalMtimeListing:
    """Parse ``journal_mtime_list_command`` output; junk lines are dropped, a missing witness is ``Unavailable``."""
    normalized = _normalize_dir(dir)
    prefix = _join(normalized, "")
    entries: list[JournalDirEntry] = []
    witness = False
    for raw in text.split("\n"):
        line = raw.strip()
        seconds, sep, path = line.partition(" ")
        if not sep or not seconds.isascii() or not seconds.isdigit():
            continue
        if path == normalized:
            witness = True
            continue
        if not path.startswith(prefix):
            continue
        name = path[len(prefix) :]
        if not name or "/" in name:
            continue
        entries.append(JournalDirEntry(name=name, mtime_ms=int(seconds) * 1000))
    return Listed(tuple(entries)) if witness else Unavailable()


class Base64Frame:
    """Decodes base64 text arriving in pieces: whole 4-character quanta now, the rest carried."""

    def __init__(self) -> None:
        self._carry = ""

    def feed(self, text: str) -> bytes:
        data = self._carry + _WHITESPACE.sub("", text)
        whole = len(data) - len(data) % 4
        self._carry = data[whole:]
        if not whole:
            return b""
        try:
            return binascii.a2b_base64(data[:whole], strict_mode=True)
        except binascii.Error as exc:
            raise JournalFrameError(str(exc)) from None

    def end(self) -> None:
        if self._carry:
            raise JournalFrameError(f"{len(self._carry)} characters left over at the end")


def decode_base64_frame(text: str) -> bytes:
    """One complete frame, as a bounded read returns it."""
    frame = Base64Frame()
    data = frame.feed(text)
    frame.end()
    return data


class _LineSplitter:
    """Bytes in, complete lines out with absolute end positions; a partial tail is withheld."""

    def __init__(self, position: int) -> None:
        self.position = position
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[JournalLine]:
        self._buffer += data
        lines: list[JournalLine] = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            lines.append(JournalLine(self._buffer[start:end].decode("utf-8", "replace"), self.position + end + 1))
            start = end + 1
        if start:
            self.position += start
            del self._buffer[:start]
        return lines


# -- reading --------------------------------------------------------------------------------------


def journal_read_strategy(handle_or_caps: SandboxHandle | Capabilities) -> Strategy:
    """``follow`` iff the sandbox streams background processes and can kill them; never by provider name."""
    caps = handle_or_caps if isinstance(handle_or_caps, Capabilities) else handle_or_caps.capabilities
    return _strategy_for_caps(caps)


def _bound_seconds(ms: float | None) -> float | None:
    """A millisecond bound as seconds; 0, None or non-finite disable it."""
    if ms is None or not math.isfinite(ms) or ms <= 0:
        return None
    return ms / 1000


class _AbortWatch:
    """A future that resolves when ``signal`` aborts, for racing against reads."""

    def __init__(self, signal: AbortSignal | None) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._remove: Callable[[], None] = lambda: None
        if signal is not None:
            self._remove = signal.add_listener(self._fire)

    def _fire(self, _reason: object) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def close(self) -> None:
        self._remove()
        self.future.cancel()


class _Watch:
    """The two timers a reader keeps: the first-byte bound and the "is the file still there" probe."""

    def __init__(self, target: str, first_byte_timeout_ms: float | None, gone_probe_ms: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._target = target
        self._bound = _bound_seconds(first_byte_timeout_ms)
        self._deadline = None if self._bound is None else self._loop.time() + self._bound
        self._probe_every = _bound_seconds(gone_probe_ms)
        self._idle_since = self._loop.time()
        self._seen_file = False

    def bytes_arrived(self) -> None:
        self._seen_file = True
        self._deadline = None
        self._idle_since = self._loop.time()

    def check_stalled(self) -> None:
        if self._deadline is not None and self._loop.time() >= self._deadline:
            raise JournalAttachUnavailableError(
                self._target,
                "journal-stalled",
                f"the journal gave no byte within {round((self._bound or 0) * 1000)}ms; no exit sentinel can be "
                "coming (the agent's shell died before writing, or nobody is writing this journal)",
            )

    def probe_due(self) -> bool:
        return self._probe_every is not None and self._loop.time() - self._idle_since >= self._probe_every

    def next_wake(self, cap: float | None) -> float | None:
        """Seconds until the next timer fires (at most ``cap``), or None when none is armed."""
        now = self._loop.time()
        waits = [w for w in (cap,) if w is not None]
        if self._deadline is not None:
            waits.append(max(0.0, self._deadline - now))
        if self._probe_every is not None:
            waits.append(max(0.0, self._idle_since + self._probe_every - now))
        return min(waits) if waits else None

    async def journal_gone(self, handle: SandboxHandle, paths: JournalPaths) -> bool:
        """Whether a journal this reader saw exist has been deleted. Absence before that is normal."""
        self._idle_since = self._loop.time()
        try:
            result = await handle.process.exec(journal_exists_command(paths))
        except Exception as exc:  # an unanswered probe is no evidence either way
            _log.debug("journal existence probe failed for %s: %r", paths.journal, exc)
            return False
        if result.exit_code == 0:
            self._seen_file = True
            return False
        return self._seen_file


async def read_journal(
    handle: SandboxHandle,
    paths: JournalPaths,
    *,
    from_byte: int = 0,
    signal: AbortSignal | None = None,
    strategy: Strategy | None = None,
    poll_interval_ms: float = DEFAULT_JOURNAL_POLL_MS,
    first_byte_timeout_ms: float | None = DEFAULT_FIRST_BYTE_TIMEOUT_MS,
    run_id: str | None = None,
    gone_probe_ms: float | None = DEFAULT_GONE_PROBE_MS,
) -> AsyncGenerator[JournalLine, None]:
    """Complete journal lines from ``from_byte`` on, until ``signal`` aborts, the consumer stops,
    or the journal is deleted; it never stops at the sentinel by itself (``read_journal_ndjson`` does).

    ``strategy`` defaults to ``journal_read_strategy(handle)``. No byte within
    ``first_byte_timeout_ms`` raises ``JournalAttachUnavailableError(..., "journal-stalled")``.
    Close it with ``contextlib.aclosing`` when breaking out early: that kills the ``tail``.
    """
    _tail_from(from_byte)
    if signal is not None and signal.aborted:
        return
    chosen = strategy or journal_read_strategy(handle)
    watch = _Watch(run_id or paths.journal, first_byte_timeout_ms, gone_probe_ms)
    if chosen == "follow":
        lines = _follow(handle, paths, from_byte, signal, watch)
    elif chosen == "poll":
        lines = _poll(handle, paths, from_byte, signal, watch, poll_interval_ms)
    else:
        raise ValueError(f"strategy must be 'follow' or 'poll', got {chosen!r}")
    async with contextlib.aclosing(lines):
        async for line in lines:
            yield line


async def _follow(
    handle: SandboxHandle, paths: JournalPaths, from_byte: int, signal: AbortSignal | None, watch: _Watch
) -> AsyncGenerator[JournalLine, None]:
    try:
        process = await handle.process.spawn(journal_follow_command(paths, from_byte), ProcessOptions(signal=signal))
    except AbortError:
        return
    abort = _AbortWatch(signal)
    splitter = _LineSplitter(from_byte)
    # One task reads the tail's output for the whole follow, on demand: each chunk is a future raced
    # against the abort and the watch's timers, never a task of its own.
    chunks: Puller[str] = Puller(process.stdout.__aiter__())
    reading = asyncio.get_running_loop().create_task(chunks.run(), name=f"boxwright journal follow {paths.journal}")
    pending: asyncio.Future[str | Ended | Failed] | None = None
    try:
        while True:
            if pending is None:
                pending = chunks.next()
            racers: set[asyncio.Future[Any]] = {pending, abort.future}
            done, _ = await asyncio.wait(racers, timeout=watch.next_wake(None), return_when=asyncio.FIRST_COMPLETED)
            if abort.future.done():
                return
            if pending in done:
                chunk, pending = pending.result(), None
                if isinstance(chunk, Failed):
                    raise chunk.error
                if isinstance(chunk, Ended):
                    return  # tail exited (it could not open the journal): a clean end
                data = chunk.encode("utf-8")
                if data:
                    watch.bytes_arrived()
                    for line in splitter.feed(data):
                        if abort.future.done():
                            return  # a consumer that aborted mid-chunk gets no more lines
                        yield line
                continue
            watch.check_stalled()
            if watch.probe_due() and await watch.journal_gone(handle, paths):
                return
    finally:
        abort.close()
        chunks.stop()
        reading.cancel()  # a read in flight waits for bytes that may never come
        with contextlib.suppress(Exception):
            await process.kill()
        await asyncio.wait({reading})


async def _poll(
    handle: SandboxHandle,
    paths: JournalPaths,
    from_byte: int,
    signal: AbortSignal | None,
    watch: _Watch,
    poll_interval_ms: float,
) -> AsyncGenerator[JournalLine, None]:
    interval = max(0.0, poll_interval_ms / 1000)
    position = from_byte
    fetched_to = from_byte
    while True:
        if signal is not None and signal.aborted:
            return
        try:
            result = await handle.process.exec(journal_read_command(paths, position), ProcessOptions(signal=signal))
        except AbortError:
            return
        if signal is not None and signal.aborted:
            return  # an aborted exec resolves with a partial frame; it is not ours to decode
        if result.exit_code != 0:
            raise SandboxCommandError("journal read", result.exit_code, result.stderr)
        data = decode_base64_frame(result.stdout)
        splitter = _LineSplitter(position)
        lines = splitter.feed(data)
        # The partial last line is fetched again next time, so only growth counts as activity.
        if position + len(data) > fetched_to:
            fetched_to = position + len(data)
            watch.bytes_arrived()
        for line in lines:
            if signal is not None and signal.aborted:
                return
            yield line
        position = splitter.position
        watch.check_stalled()
        if watch.probe_due() and await watch.journal_gone(handle, paths):
            return
        wake = watch.next_wake(interval)
        await sleep_unless_aborted(interval if wake is None else wake, signal)


async def _read_framed(handle: SandboxHandle, command: str) -> bytes:
    result = await handle.process.exec(command)
    if result.exit_code != 0:
        raise SandboxCommandError("journal tail read", result.exit_code, result.stderr)
    return decode_base64_frame(result.stdout)


async def read_journal_ndjson(
    handle: SandboxHandle,
    paths: JournalPaths,
    *,
    run_id: str | None = None,
    attach: bool = False,
    runs: RunLookup | None = None,
    attach_wait_ms: float | None = None,
    signal: AbortSignal | None = None,
    on_non_json_line: Callable[[str], object] | None = None,
    strategy: Strategy | None = None,
    poll_interval_ms: float = DEFAULT_JOURNAL_POLL_MS,
    first_byte_timeout_ms: float | None = DEFAULT_FIRST_BYTE_TIMEOUT_MS,
) -> AsyncGenerator[dict[str, Any], None]:
    """The journal's JSON objects from byte 0 up to this run's exit sentinel.

    At the sentinel: the read stops, a non-zero exit reads the stderr sidecar's tail,
    both files are removed (best effort), and a non-zero exit raises
    ``AgentProcessExitError``. A read that ends without the sentinel returns quietly
    when ``signal`` aborted (a successor may still need every byte, so nothing is
    deleted) and raises ``JournalTruncatedError`` otherwise. ``attach`` waits for the
    journal first (``await_attachable_journal``) and needs ``run_id``.
    """
    target = run_id or paths.journal
    if attach:
        if run_id is None:
            raise ValueError("attaching to a journal needs the run_id (the store lookup and errors name it)")
        wait_ms = DEFAULT_ATTACH_JOURNAL_WAIT_MS if attach_wait_ms is None else attach_wait_ms
        await await_attachable_journal(handle, paths, run_id, runs=runs, wait_ms=wait_ms, signal=signal)
        if attach_wait_ms is not None:
            first_byte_timeout_ms = attach_wait_ms
    exit_code: int | None = None
    lines = read_journal(
        handle,
        paths,
        signal=signal,
        strategy=strategy,
        poll_interval_ms=poll_interval_ms,
        first_byte_timeout_ms=first_byte_timeout_ms,
        run_id=run_id,
    )
    async with contextlib.aclosing(lines):
        async for entry in lines:
            text = entry.line
            if not text.strip():
                continue
            # Before JSON: the sentinel is a JSON object too, and must never reach a translator.
            exit_code = parse_exit_sentinel(text, paths)
            if exit_code is not None:
                break
            try:
                # Bounded: an agent line too deep or too long is text like any other non-event line.
                value = decode_json(text, max_bytes=MAX_AGENT_LINE_BYTES)
            except msgspec.DecodeError:
                value = None
            if isinstance(value, dict):
                yield value
            elif on_non_json_line is not None:
                on_non_json_line(text)
    if exit_code is None:
        if signal is not None and signal.aborted:
            return
        raise JournalTruncatedError(target, "the read stopped early (journal deleted, or its tail exited)")
    stderr = ""
    if exit_code != 0:
        try:
            stderr = (await _read_framed(handle, journal_stderr_read_command(paths))).decode("utf-8", "replace")
        except Exception as exc:  # the exit code is the news; a missing stderr tail must not replace it
            _log.warning("reading the stderr sidecar of %s failed: %r", target, exc)
    try:
        removed = await handle.process.exec(journal_cleanup_command(paths))
        if removed.exit_code != 0:
            _log.warning("removing the journal of %s exited %d: %s", target, removed.exit_code, removed.stderr)
    except Exception as exc:
        _log.warning("removing the journal of %s failed: %r", target, exc)
    if exit_code != 0:
        raise AgentProcessExitError(exit_code, stderr.strip()[:STDERR_MESSAGE_CHARS])


async def start_journaled_agent(
    handle: SandboxHandle,
    command: str,
    paths: JournalPaths,
    *,
    stdin: str | bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> SpawnHandle:
    """Spawn ``command`` journaled and return at once (its output is read from the journal).

    No signal is passed on purpose: a request's disconnect must not kill a durable agent.
    ``stdin`` is kept in a private file next to the journal and the agent reads it from there, not
    over this host's pipe: a host killed between the spawn and the write would hand the agent an
    empty stdin (claude exits "Input must be provided"), and its successor a failed run to replay.
    """
    if stdin is not None:
        await _write_private_stdin(handle, paths, stdin.decode() if isinstance(stdin, bytes) else stdin)
        command = f"( {command} ) < {quote(journal_stdin_path(paths))}"
    process = await handle.process.spawn(journaled_command(command, paths), ProcessOptions(cwd=cwd, env=env))
    await process.stdin.end()
    return process


# A value per exec's env: well under Linux's 128 KiB limit on one environment string.
_STDIN_CHUNK_CHARS = 32 * 1024


async def _write_private_stdin(handle: SandboxHandle, paths: JournalPaths, text: str) -> None:
    # Through the shell and env, never argv (a prompt may be long, or quote what a user pasted).
    target = quote(journal_stdin_path(paths))
    chunks = [text[i : i + _STDIN_CHUNK_CHARS] for i in range(0, len(text), _STDIN_CHUNK_CHARS)] or [""]
    for index, chunk in enumerate(chunks):
        # Only the dir and this file: the journal itself is made by the agent's own command, so a host
        # that dies before the spawn leaves no journal and its successor starts the run afresh.
        opening = f"( umask 077 && mkdir -p {quote(paths.dir)} && : > {target} ) && " if index == 0 else ""
        result = await handle.process.exec(
            f'{opening}printf %s "$BOXWRIGHT_STDIN" >> {target}', ProcessOptions(env={"BOXWRIGHT_STDIN": chunk})
        )
        if result.exit_code != 0:
            raise OSError(f"could not keep the agent's stdin in the sandbox: {result.stderr.strip()[:200]}")


# -- attach preflight -----------------------------------------------------------------------------


def _describe_record(record: RunRecordView | None) -> str:
    if record is None:
        return "nothing (no run store is wired, or it could not be read)"
    detached = getattr(record, "detached_since", None)
    if isinstance(detached, int) and not isinstance(detached, bool):
        when = datetime.datetime.fromtimestamp(detached / 1000, tz=datetime.UTC).isoformat()
        return f"status {record.status!r}, detached since {when}"
    return f"status {record.status!r} with a viewer attached"


async def _journal_exists(handle: SandboxHandle, paths: JournalPaths, run_id: str) -> bool | None:
    try:
        return (await handle.process.exec(journal_exists_command(paths))).exit_code == 0
    except Exception as exc:
        _log.warning("attach preflight: probing the journal of run %s failed: %r", run_id, exc)
        return None


async def await_attachable_journal(
    handle: SandboxHandle,
    paths: JournalPaths,
    run_id: str,
    *,
    runs: RunLookup | None = None,
    wait_ms: float = DEFAULT_ATTACH_JOURNAL_WAIT_MS,
    probe_interval_ms: float = DEFAULT_ATTACH_PROBE_INTERVAL_MS,
    signal: AbortSignal | None = None,
) -> None:
    """Return once the journal exists; raise ``JournalAttachUnavailableError`` when it never will.

    An existing journal returns without reading the store. Otherwise an unknown run
    fails at once (``unknown-run``), a terminal one too (``terminal-run``); a live
    one, no store, a store error or a failing probe waits up to ``wait_ms``
    (``journal-timeout``). A probe that raises is never taken for "exists": the
    follow read would create the file and tail it forever. Abort returns quietly.
    Only for attaches: a fresh run's journal does not exist until its agent starts.
    """
    exists = await _journal_exists(handle, paths, run_id)
    if exists:
        return
    record: RunRecordView | None = None
    if runs is not None:
        try:
            record = await runs.get(run_id)
        except Exception as exc:  # an unanswered question falls into the bounded wait
            _log.warning("attach preflight: reading the record of run %s failed: %r", run_id, exc)
        else:
            if record is None:
                raise JournalAttachUnavailableError(
                    run_id,
                    "unknown-run",
                    f"no run record exists and the journal ({paths.journal}) was never written; the run id is "
                    "mistyped, from another deployment, or its record was removed",
                )
    if record is not None and is_terminal_status(record):
        raise JournalAttachUnavailableError(
            run_id,
            "terminal-run",
            f"the run is already {record.status!r} and its journal ({paths.journal}) is gone; a finished run's "
            "transcript is served from its event log",
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait_ms) / 1000
    interval = max(0.0, probe_interval_ms) / 1000
    while True:
        if signal is not None and signal.aborted:
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            probe = "could not be probed at all" if exists is None else "did not appear"
            raise JournalAttachUnavailableError(
                run_id,
                "journal-timeout",
                f"the run record says {_describe_record(record)}, but its journal ({paths.journal}) {probe} "
                f"within {round(wait_ms)}ms",
            )
        await sleep_unless_aborted(min(interval, remaining), signal)
        if signal is not None and signal.aborted:
            return
        exists = await _journal_exists(handle, paths, run_id)
        if exists:
            return


# -- probe and prune ------------------------------------------------------------------------------


async def probe_run_exit(
    handle: SandboxHandle, paths: JournalPaths, *, max_bytes: int = DEFAULT_EXIT_PROBE_BYTES
) -> RunExitProbe:
    """Read the journal's tail: ``Finished(code)`` only on this run's valid sentinel. Read-only.

    No sentinel (also an empty or absent journal) is ``Producing``; any failure is
    ``Unknown``, never ``Finished``: the reaper destroys sandboxes on "finished".
    """
    try:
        tail = await _read_framed(handle, journal_exit_probe_command(paths, max_bytes))
        code = parse_journal_exit(tail.decode("utf-8", "replace"), paths)
    except Exception as exc:
        return Unknown(f"{type(exc).__name__}: {exc}")
    return Producing() if code is None else Finished(code)


def _canonical_names(run_id: str) -> tuple[str, ...]:
    token = encode_run_id(run_id)
    return tuple(token + suffix for suffix in JOURNAL_SUFFIXES)


def _warn(logger: logging.Logger, message: str, *args: object) -> None:
    with contextlib.suppress(Exception):
        logger.warning(message, *args)


async def prune_journals(
    handle: SandboxHandle,
    runs: RunLookup,
    *,
    dir: str | None = None,
    now_ms: int | None = None,
    orphan_ttl_ms: int = DEFAULT_ORPHAN_TTL_MS,
    max_deletes: int = DEFAULT_MAX_DELETES,
    logger: logging.Logger | None = None,
) -> PruneJournalsResult:
    """Delete the journals of terminal runs, and of unknown runs untouched for ``orphan_ttl_ms``.

    Everything else stays: non-terminal runs (``interrupted`` too), names that do not
    decode (a hashed name would decode to a wrong run id), unanswered store lookups,
    and every orphan when the mtime listing is unavailable. One store lookup and one
    ``rm`` per run (journal and sidecar together), at most ``max_deletes`` runs per
    sweep. Never raises: failures are reported in the result. ``dir`` defaults to the
    handle's own journal dir (``journal_dir_of``).
    """
    log = logger or _log
    dir = journal_dir_of(handle) if dir is None else dir
    result = PruneJournalsResult()
    try:
        listing = await handle.process.exec(journal_list_command(dir))
    except Exception as exc:
        result.failures.append(PruneFailure(stage="list", message=str(exc) or type(exc).__name__))
        _warn(log, "journal prune: listing %s failed: %r", dir, exc)
        return result
    names = [line.strip() for line in listing.stdout.split("\n") if line.strip()]
    result.listed = len(names)

    mtimes: dict[str, int] = {}
    try:
        parsed = parse_journal_mtime_listing((await handle.process.exec(journal_mtime_list_command(dir))).stdout, dir)
        if isinstance(parsed, Listed):
            result.age_gate = "listed"
            mtimes = {entry.name: entry.mtime_ms for entry in parsed.entries}
        else:
            _warn(log, "journal prune: no mtime listing of %s; every orphan is kept", dir)
    except Exception as exc:
        result.failures.append(PruneFailure(stage="mtime-list", message=str(exc) or type(exc).__name__))
        _warn(log, "journal prune: the mtime listing of %s failed: %r", dir, exc)

    by_run: dict[str, list[str]] = {}
    for name in names:
        decoded = decode_journal_run_id(name)
        # Only the canonical spelling: the rm names the files journal_paths derives, so a file spelled
        # otherwise (upper-case escapes, say) would stay behind while being reported deleted.
        # A run id the validator now refuses (an older version's `a/b`, say) has no run to ask about.
        if (
            isinstance(decoded, Decoded)
            and id_problem(decoded.run_id) is None
            and name in _canonical_names(decoded.run_id)
        ):
            by_run.setdefault(decoded.run_id, []).append(name)
        else:
            result.kept.append(KeptJournal(names=(name,), reason="undecodable-name"))
    result.run_ids = len(by_run)

    sweep = _Sweep(handle, runs, dir, result, mtimes, log)
    cutoff = (int(time.time() * 1000) if now_ms is None else now_ms) - orphan_ttl_ms
    for run_id, run_names in by_run.items():
        if len(result.deleted) >= max_deletes:
            reason: KeptJournalReason | None = "max-deletes"
        else:
            reason = await sweep.decide(run_id, run_names, cutoff)
        if reason is None:
            result.deleted.append(run_id)
        else:
            result.kept.append(KeptJournal(names=tuple(run_names), reason=reason, run_id=run_id))
    return result


class _Sweep:
    """One prune pass over decoded runs; ``decide`` returns why a run is kept, or None once deleted."""

    def __init__(
        self,
        handle: SandboxHandle,
        runs: RunLookup,
        dir: str,
        result: PruneJournalsResult,
        mtimes: dict[str, int],
        log: logging.Logger,
    ) -> None:
        self._handle = handle
        self._runs = runs
        self._dir = dir
        self._result = result
        self._mtimes = mtimes
        self._log = log

    async def decide(self, run_id: str, names: list[str], cutoff: int) -> KeptJournalReason | None:
        try:
            record = await self._runs.get(run_id)
        except Exception as exc:
            self._fail("store", run_id, str(exc) or repr(exc))
            return "store-error"
        if record is None:
            orphan = self._orphan_reason(names, cutoff)
            if orphan is not None:
                return orphan
        elif not is_terminal_status(record):
            return "non-terminal"  # `interrupted` too: a resume continues from this journal
        return await self._delete(run_id)

    def _orphan_reason(self, names: list[str], cutoff: int) -> KeptJournalReason | None:
        """An unknown run: the reader creates its journal before the record exists, so only age can tell."""
        if self._result.age_gate != "listed":
            return "age-gate-unavailable"
        if any(name not in self._mtimes for name in names):
            return "age-gate-missing-entry"
        # The newest file decides: a sidecar written a second ago means someone is writing.
        if max(self._mtimes[name] for name in names) > cutoff:
            return "orphan-too-recent"
        return None

    async def _delete(self, run_id: str) -> KeptJournalReason | None:
        try:
            removed = await self._handle.process.exec(journal_cleanup_command(journal_paths(run_id, self._dir)))
        except Exception as exc:
            self._fail("delete", run_id, str(exc) or repr(exc))
            return "delete-failed"
        if removed.exit_code != 0:
            self._fail("delete", run_id, f"rm exited {removed.exit_code}: {removed.stderr.strip()}")
            return "delete-failed"
        return None

    def _fail(self, stage: Literal["store", "delete"], run_id: str, message: str) -> None:
        self._result.failures.append(PruneFailure(stage=stage, message=message, run_id=run_id))
        _warn(self._log, "journal prune: %s failed for run %s: %s", stage, run_id, message)


__all__ = [
    "DEFAULT_ATTACH_JOURNAL_WAIT_MS",
    "DEFAULT_ATTACH_PROBE_INTERVAL_MS",
    "DEFAULT_EXIT_PROBE_BYTES",
    "DEFAULT_FIRST_BYTE_TIMEOUT_MS",
    "DEFAULT_GONE_PROBE_MS",
    "DEFAULT_JOURNAL_DIR",
    "DEFAULT_JOURNAL_POLL_MS",
    "DEFAULT_MAX_DELETES",
    "DEFAULT_ORPHAN_TTL_MS",
    "DEFAULT_STDERR_TAIL_BYTES",
    "EXIT_SENTINEL_KEY",
    "EXIT_SENTINEL_NONCE_KEY",
    "MAX_ENCODED_NAME_LENGTH",
    "NONCE_DOMAIN",
    "TERMINAL_RUN_STATUSES",
    "AttachUnavailableReason",
    "Base64Frame",
    "Decoded",
    "DecodedJournalRunId",
    "Finished",
    "JournalDirEntry",
    "JournalLine",
    "JournalMtimeListing",
    "JournalPaths",
    "KeptJournal",
    "KeptJournalReason",
    "Listed",
    "Malformed",
    "Producing",
    "PruneFailure",
    "PruneJournalsResult",
    "RunExitProbe",
    "RunLookup",
    "RunRecordView",
    "Strategy",
    "Truncated",
    "Unavailable",
    "Unknown",
    "await_attachable_journal",
    "decode_base64_frame",
    "decode_journal_run_id",
    "encode_run_id",
    "exit_sentinel_line",
    "exit_sentinel_nonce",
    "is_terminal_status",
    "journal_cleanup_command",
    "journal_dir_of",
    "journal_exists_command",
    "journal_exit_probe_command",
    "journal_fifo_path",
    "journal_files_path",
    "journal_follow_command",
    "journal_inbox_path",
    "journal_list_command",
    "journal_mtime_list_command",
    "journal_paths",
    "journal_read_command",
    "journal_read_strategy",
    "journal_stderr_read_command",
    "journal_stdin_path",
    "journaled_command",
    "parse_exit_sentinel",
    "parse_journal_exit",
    "parse_journal_mtime_listing",
    "probe_run_exit",
    "prune_journals",
    "read_journal",
    "read_journal_ndjson",
    "start_journaled_agent",
]
