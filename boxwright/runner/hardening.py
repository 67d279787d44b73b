"""What keeps the runner's token from the agent it spawns: same uid, no capabilities, a child of the runner.

The token is read from the runner's stdin (``read_token``): the host writes one line and closes
it, so it is never in the runner's environ (``/proc/<pid>/environ`` shows the exec's env to any
process of the same uid, and ``unsetenv`` does not clear that page) nor its argv (``cmdline`` is
world-readable). Its memory is guarded by ``set_non_dumpable`` before the token is read: a
non-dumpable process's ``/proc/<pid>/mem``, ``maps``, ``environ`` and ``fd/`` are refused to a
same-uid process without ``CAP_SYS_PTRACE`` (EACCES), and so is ``ptrace``/``process_vm_readv``
(EPERM). The agent itself is dumpable again: the kernel resets the flag on ``execve`` of a
program that changes no credentials, so nothing the agent does to itself (or its tools) changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys
import time

from .protocol import RUNNER_TOKEN_ENV

# <sys/prctl.h>
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
# How long the runner waits for the host's line: a host that died before writing it closes the
# exec's stdin (EOF, at once); one that hung would otherwise hold a runner that serves nothing.
TOKEN_WITHIN = 60.0
# runner_token() is 64 hex digits, mint_token() 43 characters: anything far longer is not a token.
_MAX_TOKEN = 1024


class RunnerTokenError(RuntimeError):
    """The runner got no usable token; it exits with this message (its log shows it to the host)."""


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    result = int(prctl(option, arg, 0, 0, 0))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def set_non_dumpable() -> str | None:
    """Make this process non-dumpable; None when done, else why it is a no-op here (not Linux).

    On Linux a failure raises: a runner whose memory the agent could read must not start.
    """
    if not sys.platform.startswith("linux"):
        return (
            f"not Linux ({sys.platform}): no prctl(PR_SET_DUMPABLE); the runner's memory is as guarded as the OS "
            "makes it"
        )
    try:
        _prctl(PR_SET_DUMPABLE, 0)
        dumpable = _prctl(PR_GET_DUMPABLE)
    except (OSError, AttributeError) as exc:
        raise RunnerTokenError(f"could not make the runner non-dumpable (prctl PR_SET_DUMPABLE 0): {exc}") from exc
    if dumpable != 0:
        raise RunnerTokenError(f"the runner is still dumpable after prctl PR_SET_DUMPABLE 0 (it reads {dumpable})")
    return None


def is_dumpable() -> bool | None:
    """Whether this process is dumpable (``PR_GET_DUMPABLE``); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return _prctl(PR_GET_DUMPABLE) != 0


def read_token(fd: int = 0, *, within: float = TOKEN_WITHIN) -> str:
    """The token: the first line of ``fd`` (the runner's stdin), which is then replaced by /dev/null.

    The host writes the line and closes its end; after this nothing the runner spawns can inherit
    (or reopen through ``/proc``) the pipe that carried it. A token in ``$BOXWRIGHT_RUNNER_TOKEN``
    is refused: it would be in the runner's environ for the agent to read.
    """
    _refuse_env()
    data = b""
    deadline = time.monotonic() + within
    try:
        while b"\n" not in data and len(data) <= _MAX_TOKEN:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunnerTokenError(
                    f"no token on the runner's stdin within {within:g} s (the host writes it as it starts the runner)"
                )
            if os.name == "posix":
                ready, _, _ = select.select([fd], [], [], left)
                if not ready:
                    continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        _to_dev_null(fd)
    line = data.split(b"\n", 1)[0]
    if len(line) > _MAX_TOKEN:
        raise RunnerTokenError(f"the runner's stdin began with a line over {_MAX_TOKEN} bytes, not a token")
    token = line.decode(errors="replace").strip()
    if not token:
        raise RunnerTokenError("the runner's stdin closed before its token came (write the token and a newline)")
    return token


def read_token_file(path: str) -> str:
    """The token from the file ``path`` (a provider whose exec has no writable stdin), unlinked at once."""
    _refuse_env()
    try:
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_TOKEN + 1)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    except OSError as exc:
        raise RunnerTokenError(f"cannot read the runner's token file {path}: {exc.strerror}") from None
    token = data.split(b"\n", 1)[0].decode(errors="replace").strip()
    if not token or len(data) > _MAX_TOKEN:
        raise RunnerTokenError(f"the runner's token file {path} holds no token (one line, at most {_MAX_TOKEN} bytes)")
    return token


def _refuse_env() -> None:
    if RUNNER_TOKEN_ENV in os.environ:
        raise RunnerTokenError(
            f"${RUNNER_TOKEN_ENV} is set: the runner's token must not be in its environment, which an agent of "
            "the same user reads from /proc/<pid>/environ; write it as one line to the runner's stdin "
            "(boxwright.runner.launch.spawn_runner does)"
        )


def _to_dev_null(fd: int) -> None:
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


__all__ = ["TOKEN_WITHIN", "RunnerTokenError", "is_dumpable", "read_token", "read_token_file", "set_non_dumpable"]
