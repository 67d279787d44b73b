"""A journaled interactive agent: an ACP agent started under a small in-sandbox relay, so it outlives its host.

Why a relay: a protocol agent (ACP) is a conversation over its stdio, and a pipe belongs to the
process that spawned the agent. When that host dies (SIGKILL), its end of the pipe is gone: the
agent's stdout would SIGPIPE it, and no successor could ever write to its stdin. Every journaled
agent already writes stdout to the journal (``boxwright.journal``); the relay gives stdin the same
treatment, with only POSIX sh, ``mkfifo`` and GNU ``tail`` inside the sandbox:

* the agent reads its stdin from a FIFO (``<enc>.fifo``) fed by ``tail -f`` of an *inbox* file
  (``<enc>.in``, private like the journal). A host sends a line by appending it to the inbox
  (a ``cat >> inbox`` process in the sandbox, fed by the host), so any host with a handle and the
  run id can talk to the agent, and the agent never sees EOF when a host dies;
* the inbox is the record of what the client said: a successor reads it to learn which requests
  were sent (it waits for their answers in the journal instead of sending them again) and which
  of the agent's requests were answered (``AcpTranslator.resume``);
* a stop is the removal of the FIFO's *name* (the open FIFO is unaffected): the relay's watcher
  sees it within 0.1 s and sends TERM (KILL 3 s later) to the agent's process tree from inside the
  sandbox. A pid would not do: inside bubblewrap every command has its own pid namespace, so no
  later command can signal the agent by number. The watcher also stops the agent when the inbox
  disappears (the sandbox's state was removed).

When the agent exits, the relay removes the FIFO and exits with the agent's code; the journal's
wrapper then writes the exit sentinel. The inbox stays until the journal is removed (same cleanup).
A host dying in the middle of a line leaves a partial line: a successor ends it with a newline before
its first line (the agent skips one unparsable line).
"""

from __future__ import annotations

import asyncio
import contextlib

from ..journal import JournalPaths, journal_fifo_path, journal_inbox_path, start_journaled_agent
from ..sandbox import ProcessOptions, SandboxHandle, SpawnHandle
from ..shell import quote

# How often the relay's watcher looks for a stop request, and how long TERM may take before KILL.
WATCH_INTERVAL = 0.1
TERM_GRACE = 3.0

# The agent's process tree (itself first), walked through /proc: no ps or pkill in a minimal sandbox.
# The command name in /proc/<pid>/stat may hold spaces; everything after its last ") " is fields.
_TREE = (
    'bw_tree() { echo "$1"; for bw_s in /proc/[0-9]*/stat; do '
    '{ read -r bw_l < "$bw_s"; } 2>/dev/null || continue; bw_r=${bw_l##*) }; bw_r=${bw_r#* }; '
    '[ "${bw_r%% *}" = "$1" ] || continue; bw_c=${bw_s#/proc/}; bw_tree "${bw_c%/stat}"; done; }'
)


def relay_command(command: str, paths: JournalPaths) -> str:
    """``command`` (shell text) under the relay; stdout/stderr are the caller's (the journal's redirects)."""
    inbox, fifo = quote(journal_inbox_path(paths)), quote(journal_fifo_path(paths))
    ticks = round(TERM_GRACE / WATCH_INTERVAL)
    stop = (
        f'bw_p=$(bw_tree "$bw_a"); kill -TERM $bw_p 2>/dev/null; bw_i=0; '
        f'while kill -0 "$bw_a" 2>/dev/null && [ "$bw_i" -lt {ticks} ]; do sleep {WATCH_INTERVAL}; '
        f'bw_i=$((bw_i+1)); done; kill -KILL $(bw_tree "$bw_a") $bw_p 2>/dev/null'
    )
    return (
        f"{_TREE}; ( umask 077 && : >> {inbox} ) || exit 125; rm -f {fifo}; "
        f"( umask 077 && mkfifo {fifo} ) || exit 125; "
        # The agent opens the FIFO for reading and blocks until tail opens it for writing.
        f"sh -c {quote(command)} < {fifo} & bw_a=$!; "
        # --pid: tail ends with the agent (it would otherwise follow the inbox for ever).
        f'tail -c +1 -f --pid="$bw_a" -s 0.2 {inbox} > {fifo} 2>/dev/null & bw_t=$!; '
        f"( while [ -e {fifo} ] && [ -e {inbox} ]; do sleep {WATCH_INTERVAL}; done; {stop} ) "
        f"> /dev/null 2>&1 < /dev/null & bw_w=$!; "
        f'wait "$bw_a"; bw_rc=$?; kill "$bw_w" "$bw_t" 2>/dev/null; wait; rm -f {fifo}; exit "$bw_rc"'
    )


def _writer_command(paths: JournalPaths, *, create: bool) -> str:
    inbox = quote(journal_inbox_path(paths))
    if create:
        return f"umask 077; : >> {inbox}; exec cat >> {inbox}"
    # A successor of a finished run finds no inbox: what it would send has no reader, and must not
    # leave a file (a session/new line holds the bridge token) behind.
    return f"if [ -f {inbox} ]; then exec cat >> {inbox}; else exec cat > /dev/null; fi"


class _InboxWriter:
    """The host's side of the inbox: lines to the in-sandbox ``cat >> inbox``, a partial line ended first."""

    def __init__(self, process: SpawnHandle, partial: bool) -> None:
        self._process = process
        self._partial = partial

    async def write(self, data: str | bytes) -> None:
        if self._partial:
            self._partial = False
            data = (b"\n" + data) if isinstance(data, bytes) else "\n" + data
        await self._process.stdin.write(data)

    async def end(self) -> None:
        await self._process.stdin.end()


class RelayedAgent:
    """A relayed agent as ``AgentChannel`` drives it: ``stdin`` appends to the inbox, ``kill`` asks the relay.

    ``exited`` is set by the journal's reader once the agent's exit sentinel (or the read's end) is reached.
    """

    pid = 0  # not ours to signal: the agent may live in another pid namespace

    def __init__(self, handle: SandboxHandle, paths: JournalPaths, writer: SpawnHandle, partial: bool) -> None:
        self._handle = handle
        self._paths = paths
        self._writer = writer
        self.stdin = _InboxWriter(writer, partial)
        self.exited = asyncio.Event()

    async def wait(self) -> int:
        await self.exited.wait()
        return 0

    async def kill(self, sig: int | None = None) -> None:
        """Ask the relay to stop the agent (TERM, then KILL); returns once asked, not once stopped."""
        await self._handle.process.exec(f"rm -f {quote(journal_fifo_path(self._paths))}")

    async def close(self) -> None:
        """End the host's inbox writer (the agent goes on: a successor may still talk to it). Never raises."""
        with contextlib.suppress(Exception):
            await self._writer.stdin.end()
        with contextlib.suppress(TimeoutError, Exception):
            await asyncio.wait_for(self._writer.wait(), 5)
            return
        with contextlib.suppress(Exception):
            await self._writer.kill()


async def start_relayed_agent(
    handle: SandboxHandle, command: str, paths: JournalPaths, *, env: dict[str, str], cwd: str
) -> RelayedAgent:
    """Start ``command`` journaled under the relay, with a fresh inbox; returns at once."""
    # The writer first: it creates the inbox the relay's tail then follows from byte 0.
    writer = await handle.process.spawn(_writer_command(paths, create=True), ProcessOptions(cwd=cwd))
    await start_journaled_agent(handle, relay_command(command, paths), paths, env=env, cwd=cwd)
    return RelayedAgent(handle, paths, writer, partial=False)


async def attach_relayed_agent(handle: SandboxHandle, paths: JournalPaths) -> tuple[RelayedAgent, list[str]]:
    """Join a relayed agent another host started: (the agent, the inbox's complete lines so far)."""
    inbox = quote(journal_inbox_path(paths))
    read = await handle.process.exec(f"cat {inbox} 2>/dev/null; true")
    text = read.stdout
    writer = await handle.process.spawn(_writer_command(paths, create=False))
    lines = text.split("\n")
    # A partial last line is a host's line cut by its death: not sent (the agent never got a whole line).
    complete = lines[:-1]
    return RelayedAgent(handle, paths, writer, partial=bool(lines[-1])), [line for line in complete if line.strip()]
