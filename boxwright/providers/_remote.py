"""Pieces the cloud providers (E2B, Daytona, ...) share: a text stream fed with decoded
text, the workspace path mapping, an exec-backed file system, the group-kill script and
the ownership metadata a reaper looks for.

A cloud SDK hands over output already decoded (its own incremental UTF-8 decoder), so
these streams take ``str``; the exec-backed fs runs small ``sh -c`` scripts whose values
travel as positional arguments, never spliced into the script text.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Literal

from ..errors import SandboxCommandError
from ..sandbox import WORKSPACE, ExecResult, FsEntry, FsStat, NativeWatch, SandboxChannel
from ..shell import join, quote

LABEL_MANAGED = "boxwright.managed"
LABEL_OWNER = "boxwright.owner"
LABEL_SANDBOX = "boxwright.sandbox"
LABEL_RUN = "boxwright.run"
LABEL_LEASE = "boxwright.lease-expires"
DEFAULT_LEASE = 6 * 3600.0
MISSING = "__boxwright_missing__"
NO_PID = "__boxwright_kill_no_pid__"
SURVIVED = "__boxwright_kill_survived__"
_WRITE_CHUNK = 48 * 1024


def owner_id() -> str:
    """This host's name in the owner metadata: reaping by owner stays per host."""
    return socket.gethostname()


def ownership(
    key: str | None, run: str | None, lease_seconds: float, extra: Mapping[str, str] | None
) -> dict[str, str]:
    """The metadata/labels every remote sandbox carries, so ``boxwright reap`` can find a leaked one."""
    labels = {
        **(extra or {}),
        LABEL_MANAGED: "1",
        LABEL_OWNER: owner_id(),
        LABEL_LEASE: f"{time.time() + lease_seconds:.0f}",
    }
    if key:
        labels[LABEL_SANDBOX] = key
    if run:
        labels[LABEL_RUN] = run
    return labels


def map_path(path: str, workdir: str) -> str:
    """``/workspace[/x]`` is ``workdir[/x]``; a relative path is under it; other absolute paths are the VM's own."""
    if "\x00" in path:
        raise ValueError(f"a path cannot contain a NUL byte: {path!r}")
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return workdir + path[len(WORKSPACE) :]
    if not path.startswith("/"):
        return f"{workdir}/{path}" if path else workdir
    return path


def check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be an int between 1 and 65535, got {port!r}")


class TextChannel:
    """A single-consumer async iterator of text chunks that a callback feeds (SDK output handlers)."""

    def __init__(self) -> None:
        self._chunks: asyncio.Queue[str | None] = asyncio.Queue()
        self._closed = False
        self._done = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        chunk = await self._chunks.get()
        if chunk is None:
            self._done = True
            raise StopAsyncIteration
        return chunk

    def feed(self, text: str) -> None:
        if text and not self._closed:
            self._chunks.put_nowait(text)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._chunks.put_nowait(None)


async def collect(stream: AsyncIterator[str]) -> str:
    return "".join([chunk async for chunk in stream])


# The wrapper every spawned command runs in, as the leader of its own session and group
# (started by `setsid`): $1 is the pid file, $2 the command. Its pid is the group id, recorded
# from inside because `setsid` forks when its caller already leads a group (then the SDK's pid
# is not the group's). A normal end removes the record; after a kill the kill script does.
WRAPPER = 'echo $$ > "$1" || exit 125; sh -c "$2"; c=$?; rm -f "$1"; exit $c'

# $1 pid file, $2 signal. Waits for the record (a kill may come before the wrapper ran), signals
# the group, KILLs what is left, and says when something survived or no pid was recorded.
KILL_SCRIPT = r"""F="$1"; S="$2"; i=0
while [ ! -s "$F" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
if [ ! -s "$F" ]; then echo __boxwright_kill_no_pid__ >&2; rm -f "$F"; exit 0; fi
p=$(cat "$F")
alive() { ps -eo pgid=,stat= | while read g s; do
  [ "$g" = "$p" ] && case "$s" in Z*) ;; *) echo y; break;; esac; done; }
kill -"$S" -"$p" 2>/dev/null || kill -"$S" "$p" 2>/dev/null
i=0; while [ -n "$(alive)" ] && [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done
if [ -n "$(alive)" ]; then
  kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
  i=0; while [ -n "$(alive)" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
fi
[ -n "$(alive)" ] && echo __boxwright_kill_survived__ >&2
rm -f "$F"; exit 0"""


def script(op: str, text: str, *args: str) -> str:
    """A command line running ``text`` with ``args`` as its positional parameters (``$1``...)."""
    return f"sh -c {quote(text)} {quote(op)} {join(args)}".rstrip()


Run = Callable[[str], Awaitable[ExecResult]]


class ShellFs:
    """``SandboxFs`` over shell commands (GNU coreutils/find/stat in the VM); subclasses may read/write natively."""

    watch: NativeWatch | None = None  # the framework polls with `find`

    def __init__(self, run: Run, workdir: str) -> None:
        self._run = run
        self.workdir = workdir

    def p(self, path: str) -> str:
        return map_path(path, self.workdir)

    async def sh(self, op: str, text: str, *args: str) -> str:
        result = await self._run(script(op, text, *args))
        if result.exit_code != 0:
            raise SandboxCommandError(op, result.exit_code, (result.stderr or result.stdout).strip())
        return result.stdout

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8", errors="replace")

    async def read_bytes(self, path: str) -> bytes:
        return base64.b64decode(await self.sh("read", 'base64 -w0 -- "$1"', self.p(path)))

    async def write(self, path: str, data: str | bytes) -> None:
        target = self.p(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        chunks = [raw[i : i + _WRITE_CHUNK] for i in range(0, len(raw), _WRITE_CHUNK)] or [b""]
        first = base64.b64encode(chunks[0]).decode()
        await self.sh("write", 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"', target, first)
        for chunk in chunks[1:]:
            await self.sh("write", 'printf %s "$2" | base64 -d >> "$1"', target, base64.b64encode(chunk).decode())

    async def list(self, path: str) -> list[FsEntry]:
        virtual = path.rstrip("/") or "/"
        out = await self.sh("list", 'ls -1Ap -- "$1"', self.p(path))
        entries = []
        for line in out.splitlines():
            if not line:
                continue
            kind: Literal["file", "dir"] = "dir" if line.endswith("/") else "file"
            name = line.rstrip("/")
            entries.append(FsEntry(name, f"{virtual.rstrip('/')}/{name}", kind))
        return entries

    async def mkdir(self, path: str) -> None:
        await self.sh("mkdir", 'mkdir -p -- "$1"', self.p(path))

    async def remove(self, path: str) -> None:
        await self.sh("remove", 'rm -rf -- "$1"', self.p(path))

    async def rename(self, src: str, dst: str) -> None:
        await self.sh("rename", 'mkdir -p -- "$(dirname -- "$2")" && mv -- "$1" "$2"', self.p(src), self.p(dst))

    async def exists(self, path: str) -> bool:
        result = await self._run(script("exists", 'test -e "$1" || test -L "$1"', self.p(path)))
        return result.exit_code == 0

    async def lstat(self, path: str) -> FsStat | None:
        # On a stat failure, absence is proven by listing the parent (an unreadable parent is an error).
        probe = (
            'if s=$(stat -c "%f:%s" -- "$1" 2>/dev/null); then echo "$s"; exit 0; fi; '
            'd=$(dirname -- "$1"); b=$(basename -- "$1"); '
            'if [ ! -e "$d" ]; then echo ' + MISSING + "; exit 0; fi; "
            'l=$(find -H "$d" -mindepth 1 -maxdepth 1 -name "$b" -print 2>&1) || { echo "$l" >&2; exit 1; }; '
            '[ -z "$l" ] && { echo ' + MISSING + '; exit 0; }; stat -c "%f:%s" -- "$1"'
        )
        out = (await self.sh("lstat", probe, self.p(path))).strip()
        if out == MISSING:
            return None
        hex_mode, _, size = out.partition(":")
        mode = int(hex_mode, 16)
        kind = mode & 0o170000
        if kind == 0o100000:
            return FsStat("file", mode, int(size))
        if kind == 0o040000:
            return FsStat("dir", mode)
        if kind == 0o120000:
            return FsStat("symlink", mode)
        return FsStat("other", mode)


def channel(url: str, headers: Mapping[str, str] | None = None, token: str | None = None) -> SandboxChannel:
    return SandboxChannel(url=url, token=token, headers=dict(headers) if headers else None)
