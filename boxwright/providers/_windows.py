"""Windows rules of the local-process provider (LP11), as pure helpers.

On Windows every sandbox command runs through a git-bash ``sh``. Nothing here
starts a process: the helpers take the environment, a file-existence check or
a ``run`` callable from the caller, so the rules are unit-tested on Linux.

Why tearing down a tree needs more than ``taskkill /T``
-------------------------------------------------------
MSYS emulates ``fork``/``exec`` with new Windows processes. A shell running a
statement list (``cat journal; tail -f journal``) forks a middle shell for the
last command; that middle shell execs ``tail``, i.e. starts a new Windows
process, and its own Windows process exits at once. Windows does not
reparent: the surviving ``tail`` names a dead Windows parent, so
``taskkill /T`` (which follows only live parent links) never reaches it and
still exits 0. The MSYS process table (git-bash ``ps``: ``PID PPID PGID
WINPID TTY UID STIME COMMAND``) keeps the *logical* parent, so the teardown
reads it, before killing anything (a parent killed with ``TerminateProcess``
leaves its children pointing at a PID that is no longer in the table), then
kills with ``taskkill /T`` and sweeps the descendants ``/T`` missed by their
Windows pid.

Teardown never raises: a kill that cannot complete is reported with
``logger.warn(message, meta)``; a process that already exited on its own is
not a failure and is not reported.
"""

from __future__ import annotations

import ntpath
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any, Literal, Protocol

import msgspec

__all__ = [
    "SH_ENV_VAR",
    "IsAliveFn",
    "MsysProcess",
    "RunFn",
    "TaskkillOutcome",
    "WarnLogger",
    "classify_taskkill",
    "git_bash_env",
    "git_root",
    "kill_tree_windows",
    "kill_trees_windows",
    "msys_descendants",
    "parse_msys_ps",
    "ps_argv_for",
    "resolve_sh",
    "taskkill_argv",
]

SH_ENV_VAR = "BOXWRIGHT_SANDBOX_SH"

TaskkillOutcome = Literal["killed", "gone", "failed"]

RunFn = Callable[[list[str]], Awaitable[tuple[int, str, str]]]
"""Runs ``argv`` to completion; returns ``(exit_code, stdout, stderr)``."""

IsAliveFn = Callable[[int], Awaitable[bool]]
"""Whether the process with this Windows pid is still running."""


class WarnLogger(Protocol):
    def warn(self, message: str, meta: dict[str, Any] | None = None) -> None: ...


# --------------------------------------------------------------------------- sh


def _env_get(env: Mapping[str, str], name: str) -> str | None:
    """``env[name]``, the key matched case-insensitively (Windows env keys are)."""
    if name in env:
        return env[name]
    upper = name.upper()
    for key, value in env.items():
        if key.upper() == upper:
            return value
    return None


def _path_values(env: Mapping[str, str]) -> list[str]:
    """Every ``PATH`` value of ``env`` (``Path``, ``PATH``, ... in key order)."""
    return [value for key, value in env.items() if key.upper() == "PATH"]


def _split_path(value: str) -> list[str]:
    entries = []
    for raw in value.split(";"):
        entry = raw.strip().strip('"').strip()
        if entry:
            entries.append(entry)
    return entries


def _strip_sep(path: str) -> str:
    stripped = path.rstrip("\\/")
    # Keep a drive root ("C:\\") intact.
    return path if stripped.endswith(":") or not stripped else stripped


def _is_git_cmd_dir(entry: str, exists: Callable[[str], bool]) -> bool:
    """``…\\Git\\cmd`` (any case, either slash), or a ``cmd`` dir holding ``git.exe`` (portable, scoop)."""
    entry = _strip_sep(entry)
    if ntpath.basename(entry).lower() != "cmd":
        return False
    if ntpath.basename(ntpath.dirname(entry)).lower() == "git":
        return True
    return exists(ntpath.join(entry, "git.exe"))


def _program_files_roots(env: Mapping[str, str]) -> list[str]:
    roots: list[str] = []
    for name in ("ProgramW6432", "ProgramFiles", "ProgramFiles(x86)"):
        value = _env_get(env, name)
        if value and value.strip():
            roots.append(value.strip())
    roots += [r"C:\Program Files", r"C:\Program Files (x86)"]
    seen: set[str] = set()
    unique = []
    for root in roots:
        key = ntpath.normcase(_strip_sep(root))
        if key not in seen:
            seen.add(key)
            unique.append(root)
    return unique


def resolve_sh(env: Mapping[str, str], exists: Callable[[str], bool]) -> str:
    """The ``sh`` the sandbox runs commands through.

    In order: ``BOXWRIGHT_SANDBOX_SH`` (taken as is); a ``…\\Git\\cmd`` entry of
    ``PATH`` (key matched case-insensitively) giving ``..\\usr\\bin\\sh.exe`` then
    ``..\\bin\\sh.exe``; the Program Files installs (``Git\\usr\\bin\\sh.exe``,
    ``Git\\bin\\sh.exe``); else plain ``sh``. ``exists`` checks a file path.
    """
    override = _env_get(env, SH_ENV_VAR)
    if override and override.strip():
        return override.strip()

    candidates: list[str] = []
    for value in _path_values(env):
        for entry in _split_path(value):
            if _is_git_cmd_dir(entry, exists):
                base = _strip_sep(entry)
                candidates.append(ntpath.normpath(ntpath.join(base, "..", "usr", "bin", "sh.exe")))
                candidates.append(ntpath.normpath(ntpath.join(base, "..", "bin", "sh.exe")))
    for root in _program_files_roots(env):
        candidates.append(ntpath.join(root, "Git", "usr", "bin", "sh.exe"))
        candidates.append(ntpath.join(root, "Git", "bin", "sh.exe"))

    for candidate in candidates:
        if exists(candidate):
            return candidate
    return "sh"


def git_root(sh_path: str) -> str | None:
    """The git install an ``sh.exe`` belongs to (``<git>\\usr\\bin\\sh.exe`` or ``<git>\\bin\\sh.exe``).

    ``None`` for a bare command name (``sh``) or a path not under a ``bin`` directory.
    """
    if not (ntpath.dirname(sh_path)):
        return None
    directory = ntpath.dirname(ntpath.normpath(sh_path))
    if ntpath.basename(directory).lower() != "bin":
        return None
    parent = ntpath.dirname(directory)
    if ntpath.basename(parent).lower() == "usr":
        parent = ntpath.dirname(parent)
    if not parent or parent == directory:
        return None
    return parent


def git_bash_env(env: Mapping[str, str], sh_path: str) -> dict[str, str]:
    """``env`` with git-bash's ``usr\\bin``, ``bin`` and ``mingw64\\bin`` prepended to ``PATH``.

    The existing key keeps its casing (``Path`` stays ``Path``; ``PATH`` if
    there is none). Other case variants of the key are folded into it, since a
    Windows environment block holds one ``PATH``. Earlier copies of the three
    directories are dropped, so applying this twice changes nothing. With no
    derivable git install (``sh`` resolved to a bare name) ``env`` is returned
    unchanged (as a new dict).
    """
    root = git_root(sh_path)
    if root is None:
        return dict(env)
    front = [
        ntpath.join(root, "usr", "bin"),
        ntpath.join(root, "bin"),
        ntpath.join(root, "mingw64", "bin"),
    ]
    existing = [e for value in _path_values(env) for e in value.split(";") if e.strip()]
    drop = {ntpath.normcase(_strip_sep(d)) for d in front}
    kept = [e for e in existing if ntpath.normcase(_strip_sep(e.strip().strip('"'))) not in drop]
    path = ";".join(front + kept)

    result: dict[str, str] = {}
    for key, value in env.items():
        if key.upper() != "PATH":
            result[key] = value
        elif not any(k.upper() == "PATH" for k in result):
            result[key] = path  # the first PATH key, in its own casing and place
    if not any(k.upper() == "PATH" for k in result):
        result["PATH"] = path
    return result


def ps_argv_for(sh_path: str) -> list[str]:
    """The git-bash ``ps`` next to ``sh_path`` (``<git>\\usr\\bin\\ps.exe``), else ``ps`` from PATH."""
    root = git_root(sh_path)
    if root is None:
        return ["ps"]
    return [ntpath.join(root, "usr", "bin", "ps.exe")]


# --------------------------------------------------------------- process table


class MsysProcess(msgspec.Struct, frozen=True):
    """One row of git-bash ``ps``: MSYS ``pid``/``ppid``/``pgid``, the Windows pid, the command."""

    pid: int
    ppid: int
    pgid: int
    winpid: int
    command: str


# Optional status letter (S stopped, I waiting for tty input, O tty output), then
# PID PPID PGID WINPID, then the rest of the row.
_ROW = re.compile(r"^\s*(?:[A-Za-z]\s+)?(\d+)\s+(\d+)\s+(\d+)\s+(\d+)(?:\s+(.*))?$")
# TTY UID STIME COMMAND; STIME is HH:MM:SS, or "Mon DD" for a process older than a day.
_TAIL = re.compile(r"^(\S+)\s+(\d+)\s+(\d{1,2}:\d{2}:\d{2}|[A-Za-z]{3}\s+\d{1,2})\s+(.*)$")


def parse_msys_ps(text: str) -> list[MsysProcess]:
    """Parse git-bash ``ps`` output.

    Skips the header, blank and non-numeric rows, and rows with PPID 0
    (Windows-only processes listed by ``ps -W``). Tolerates CRLF, extra
    spaces and the status letter git-bash prints before the PID.
    """
    table: list[MsysProcess] = []
    for line in text.splitlines():
        match = _ROW.match(line.rstrip())
        if match is None:
            continue
        pid, ppid, pgid, winpid = (int(match.group(i)) for i in range(1, 5))
        if ppid == 0:
            continue
        rest = (match.group(5) or "").strip()
        tail = _TAIL.match(rest)
        command = tail.group(4).strip() if tail else rest
        table.append(MsysProcess(pid=pid, ppid=ppid, pgid=pgid, winpid=winpid, command=command))
    return table


def msys_descendants(table: Sequence[MsysProcess], root_winpid: int) -> list[MsysProcess]:
    """Every MSYS descendant of the process(es) whose WINPID is ``root_winpid``.

    Breadth-first over logical parent links (PPID -> PID), so a child whose
    Windows parent has exited is still found. The roots themselves (and any
    row carrying the root's WINPID) are not returned. Cycle-safe: each MSYS
    pid is visited once.
    """
    children: dict[int, list[MsysProcess]] = {}
    for proc in table:
        children.setdefault(proc.ppid, []).append(proc)

    roots = [p for p in table if p.winpid == root_winpid]
    visited: set[int] = {p.pid for p in roots}
    queue: deque[int] = deque(p.pid for p in roots)
    found: list[MsysProcess] = []
    while queue:
        parent = queue.popleft()
        for child in children.get(parent, ()):
            if child.pid in visited:
                continue
            visited.add(child.pid)
            queue.append(child.pid)
            if child.winpid != root_winpid:
                found.append(child)
    return found


# -------------------------------------------------------------------- taskkill

_GONE_PHRASES = ("not found", "does not exist", "no running instance of the task")
_ERROR_START = re.compile(r"(?im)^\s*error:")


def taskkill_argv(winpid: int, *, tree: bool) -> list[str]:
    argv = ["taskkill", "/PID", str(winpid)]
    if tree:
        argv.append("/T")
    argv.append("/F")
    return argv


def classify_taskkill(exit_code: int, stderr: str) -> TaskkillOutcome:
    """``killed`` on exit 0; ``gone`` (already exited) on exit 128 or when every
    error says "not found" / "does not exist" / "no running instance of the
    task"; else ``failed``.

    stderr is split into its ``ERROR:`` messages (a message may span lines,
    ``Reason:`` on the next), so an "Access is denied" next to a "not found"
    for another child of a ``/T`` kill is still a failure.
    """
    if exit_code == 0:
        return "killed"
    if exit_code == 128:
        return "gone"
    starts = [m.start() for m in _ERROR_START.finditer(stderr)]
    if starts:
        bounds = [*starts, len(stderr)]
        messages = [stderr[a:b] for a, b in pairwise(bounds)]
    else:
        messages = [stderr]
    messages = [m.lower() for m in messages if m.strip()]
    if messages and all(any(phrase in m for phrase in _GONE_PHRASES) for m in messages):
        return "gone"
    return "failed"


def _warn(logger: WarnLogger | None, message: str, meta: dict[str, Any]) -> None:
    if logger is None:
        return
    try:
        logger.warn(message, meta)
    except Exception:
        pass


async def _snapshot(run: RunFn, ps_argv: Sequence[str], logger: WarnLogger | None) -> list[MsysProcess]:
    argv = list(ps_argv)
    try:
        code, stdout, stderr = await run(argv)
    except Exception as exc:
        _warn(
            logger,
            "could not read the MSYS process table; orphaned descendants may survive teardown",
            {"argv": argv, "error": repr(exc)},
        )
        return []
    if code != 0:
        _warn(
            logger,
            "could not read the MSYS process table; orphaned descendants may survive teardown",
            {"argv": argv, "exit_code": code, "stderr": stderr.strip()},
        )
        return []
    return parse_msys_ps(stdout)


async def _taskkill(run: RunFn, argv: list[str]) -> tuple[TaskkillOutcome, dict[str, Any]]:
    try:
        code, _stdout, stderr = await run(argv)
    except Exception as exc:
        return "failed", {"error": repr(exc)}
    return classify_taskkill(code, stderr), {"exit_code": code, "stderr": stderr.strip()}


async def kill_trees_windows(
    winpids: Iterable[int],
    *,
    run: RunFn,
    is_alive: IsAliveFn | None = None,
    logger: WarnLogger | None = None,
    ps_argv: Sequence[str] = ("ps",),
) -> None:
    """Kill the process trees rooted at ``winpids`` (Windows pids); never raises.

    1. One snapshot of the MSYS table (``ps_argv``, see :func:`ps_argv_for`)
       for the whole batch, taken before anything is killed.
    2. ``taskkill /PID p /T /F`` per root: ``killed`` and ``gone`` are silent,
       ``failed`` is warned with taskkill's stderr.
    3. Every MSYS descendant of the roots (by logical parent) that ``is_alive``
       reports running (all of them when ``is_alive`` is None) is killed with
       ``taskkill /PID w /F``; those that cannot be killed are warned as
       survivors, in one warning.

    Exceptions from ``run``/``is_alive``/``logger`` are contained
    (cancellation still propagates).
    """
    roots = list(dict.fromkeys(winpids))
    if not roots:
        return
    table = await _snapshot(run, ps_argv, logger)

    for root in roots:
        outcome, detail = await _taskkill(run, taskkill_argv(root, tree=True))
        if outcome == "failed":
            _warn(logger, "taskkill could not kill the process tree", {"winpid": root, **detail})

    handled = set(roots)
    survivors: list[dict[str, Any]] = []
    for root in roots:
        for proc in msys_descendants(table, root):
            if proc.winpid in handled:
                continue
            handled.add(proc.winpid)
            if is_alive is not None:
                try:
                    alive = await is_alive(proc.winpid)
                except Exception:
                    alive = True
                if not alive:
                    continue
            outcome, detail = await _taskkill(run, taskkill_argv(proc.winpid, tree=False))
            if outcome == "failed":
                survivors.append(
                    {
                        "winpid": proc.winpid,
                        "pid": proc.pid,
                        "command": proc.command,
                        "root_winpid": root,
                        **detail,
                    }
                )
    if survivors:
        _warn(
            logger,
            "descendant processes survived teardown",
            {"root_winpids": roots, "survivors": survivors},
        )


async def kill_tree_windows(
    winpid: int,
    *,
    run: RunFn,
    is_alive: IsAliveFn | None = None,
    logger: WarnLogger | None = None,
    ps_argv: Sequence[str] = ("ps",),
) -> None:
    """:func:`kill_trees_windows` for a single root."""
    await kill_trees_windows([winpid], run=run, is_alive=is_alive, logger=logger, ps_argv=ps_argv)
