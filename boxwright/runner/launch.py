"""How a host starts the runner in a sandbox: its token on the runner's stdin, or in a file it unlinks.

Never in the exec's env: Docker's exec wrapper (``sh``) stays the runner's parent with that env,
and the runner's own ``/proc/<pid>/environ`` shows it; both are readable by the agent (same
user). Never in argv: ``cmdline`` is world-readable. Where the provider's exec has a writable
stdin, the host writes one line and closes it, so the pipe holds nothing once the runner read it;
elsewhere (``writable_stdin=False``: sbx, Blaxel, Cloudflare) the token goes in a file the runner
reads and unlinks before it serves, so no agent (none runs before a ``/run`` under the token) and
no snapshot sees it. The runner (``hardening``) is non-dumpable before it reads either.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping

from ..sandbox import ProcessOptions, SandboxHandle, SpawnHandle


async def spawn_runner(
    handle: SandboxHandle,
    token: str,
    *,
    host: str,
    port: int,
    env: Mapping[str, str] | None = None,
    log: str | None = None,
    python: str = "python",
) -> SpawnHandle:
    """``python -m boxwright.runner`` bound to ``host:port`` in ``handle``'s sandbox, given ``token`` as above.

    ``env``: the runner's env (the harness's credentials it hands the agent by name; never the
    token). ``log``: a file in the box for its output (the runner must not depend on the host's
    exec stream), else the output comes back over the spawn's stdout/stderr. ``python``: the
    interpreter that has boxwright (``python`` on the PATH when that one is not there).
    """
    if not token or any(c in token for c in "\r\n\0"):
        raise ValueError("a runner token is one non-empty line")
    interpreter = f'"$(command -v {shlex.quote(python)} || echo python)"'
    command = f"exec {interpreter} -m boxwright.runner --host {shlex.quote(host)} --port {int(port)}"
    by_stdin = handle.capabilities.writable_stdin
    if not by_stdin:
        path = f"/tmp/.boxwright-runner-token-{uuid.uuid4().hex}"
        await handle.fs.write(path, f"{token}\n")
        command += f" --token-file {shlex.quote(path)} </dev/null"
    if log is not None:
        command += f" >{shlex.quote(log)} 2>&1"
    runner = await handle.process.spawn(command, ProcessOptions(env=dict(env or {})))
    if by_stdin:
        try:
            await runner.stdin.write(f"{token}\n")
            await runner.stdin.end()
        except BaseException:
            await runner.kill()
            raise
    return runner


__all__ = ["spawn_runner"]
