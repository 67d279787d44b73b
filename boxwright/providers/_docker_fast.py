"""The Docker provider's fast exec path: a stdlib server inside the container, one TCP round trip per command.

A ``docker exec`` costs a container-runtime exec every time (~80 ms measured here); a command
through this server costs a connection and a ``fork``. The handle starts it in the background
after create (never on the create path) wherever the image has ``python3`` and the container
an address, and falls back to ``docker exec`` until it answers, or for good when it cannot.

Wire: the client sends one JSON line ``{"token", "argv", "cwd", "env"}``; the server answers
frames ``kind(1) length(4, big-endian) payload`` (1 stdout, 2 stderr) and a last frame of
kind 3 whose payload is the exit code (signal deaths as 128 + N). The client hanging up kills
the command's process group (TERM, then KILL): a cancelled exec leaves nothing running. The
token is the handle's, popped from the server's env so no command inherits it.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import secrets
import struct
from collections.abc import Mapping, Sequence

from ..sandbox import ExecResult

SERVER = r"""
import asyncio, hmac, json, os, signal, sys
# BOOT: set by the keep-alive loader (the token came on PID 1's stdin); else the token is in our env.
KEEP = "BOOT" in globals()
TOKEN = (BOOT["token"] if KEEP else os.environ.pop("BOXWRIGHT_EXEC_TOKEN")).encode()

async def run(reader, writer):
    proc = None
    try:
        req = json.loads(await reader.readline())
        if not hmac.compare_digest(str(req.get("token", "")).encode(), TOKEN):
            return
        env = dict(os.environ)
        env.update(req.get("env") or {})
        proc = await asyncio.create_subprocess_exec(*req["argv"], cwd=req.get("cwd") or "/", env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        async def pump(stream, kind):
            while True:
                data = await stream.read(65536)
                if not data:
                    return
                writer.write(kind + len(data).to_bytes(4, "big") + data)
                await writer.drain()
        work = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, b"\1"), pump(proc.stderr, b"\2"), proc.wait()))
        hangup = asyncio.ensure_future(reader.read())
        await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(work), grace)
                    break
                except asyncio.TimeoutError:
                    pass
            return
        hangup.cancel()
        code = proc.returncode
        code = 128 - code if code < 0 else code
        writer.write(b"\3" + (4).to_bytes(4, "big") + code.to_bytes(4, "big", signed=True))
        await writer.drain()
    except Exception:
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        writer.close()

async def keep_alive():
    # The container's own command (the workspace made): say the port on stdout (the host's attach stream)
    # and serve for good.
    server = await asyncio.start_server(run, "0.0.0.0", 0, limit=1 << 24)
    print("boxwright-ready", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

async def main():
    if KEEP:
        return await keep_alive()
    server = await asyncio.start_server(run, sys.argv[1], 0, limit=1 << 24)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    # The handle's exec stream is the server's life line: stdin at EOF (the host went away) ends it.
    await loop.run_in_executor(None, sys.stdin.buffer.read)

asyncio.run(main())
"""

# The container's command when the handle serves from it. As the user: wait for root's `chmod 1777 /` (a
# root exec the host starts), make the workspace, say so on stdout (the host's attach stream). It then runs
# the host's "run" lines (a base64 script, output on its own stdout/stderr, ended by the line's nonce and
# the exit code): the first command costs no docker exec. At the host's "go" line (after the first command:
# python starting beside it slows it on a loaded machine) it becomes python3 reading one JSON line on stdin
# holding the token and SERVER: never in the config, env or command line a commit or `docker inspect` shows.
# Anything going wrong (no python3, a restart with nobody attached) leaves a plain keep-alive; the handle
# then uses docker exec. Without `setsid` a command it ran could not be killed as a group: it runs none.
LOADER = r"""
import json, sys, time
try:
    boot = json.loads(sys.stdin.buffer.readline())
    exec(boot.pop("script"), {"BOOT": boot, "__name__": "__main__"})
except Exception:
    pass
while True:
    time.sleep(86400)
"""
_KEEP_ALIVE_SH = """i=0
while [ ! -w / ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
if [ -w / ] && mkdir -p -- "$1"; then
  if command -v setsid >/dev/null 2>&1; then echo boxwright-setup-ok; else echo boxwright-setup-ok-no-setsid; fi
else echo boxwright-setup-failed; fi
while read -r kind nonce script; do
  case "$kind" in
    run) (eval "$(printf %s "$script" | base64 -d)") </dev/null; c=$?
      printf '%s %d\\n' "$nonce" "$c"; printf '%s\\n' "$nonce" >&2;;
    go) command -v python3 >/dev/null 2>&1 && exec python3 -c "$2"; echo boxwright-no-python;;
  esac
done
exec sleep infinity"""


def keep_alive_command(workdir: str) -> list[str]:
    return ["sh", "-c", _KEEP_ALIVE_SH, "boxwright-keep-alive", workdir, LOADER]


def go_lines(token: str) -> bytes:
    """What the keep-alive reads on its stdin once set up: "go", then the server's boot line."""
    return b"go\n" + json.dumps({"token": token, "script": SERVER}).encode() + b"\n"


class FastExecUnavailable(Exception):
    """The fast path cannot carry this command (no connection): use ``docker exec``; nothing ran."""


class FastExecLost(Exception):
    """The server accepted the command, then went away: it may have run, so it is never retried."""


class FastExec:
    def __init__(self, host: str, port: int, token: str) -> None:
        self.host = host
        self.port = port
        self._token = token

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(24)

    async def run(self, argv: Sequence[str], env: Mapping[str, str], cwd: str = "/") -> ExecResult:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise FastExecUnavailable(str(exc)) from exc
        out = codecs.getincrementaldecoder("utf-8")(errors="replace")
        err = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stdout: list[str] = []
        stderr: list[str] = []
        try:
            request = {"token": self._token, "argv": list(argv), "cwd": cwd, "env": dict(env)}
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            while True:
                try:
                    header = await reader.readexactly(5)
                except (asyncio.IncompleteReadError, OSError) as exc:
                    raise FastExecLost("the container's exec server went away mid-command") from exc
                kind = header[0]
                (size,) = struct.unpack(">I", header[1:])
                try:
                    payload = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, OSError) as exc:
                    raise FastExecLost("the container's exec server went away mid-command") from exc
                if kind == 3:
                    (code,) = struct.unpack(">i", payload)
                    stdout.append(out.decode(b"", final=True))
                    stderr.append(err.decode(b"", final=True))
                    return ExecResult(stdout="".join(stdout), stderr="".join(stderr), exit_code=code)
                (stderr if kind == 2 else stdout).append((err if kind == 2 else out).decode(payload))
        finally:
            # On cancel too: the hang-up is what kills the command inside.
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
