"""Host paths a sandbox must see: an agent CLI installed anywhere on the host, a local repository to clone.

A provider whose sandbox shows host paths at the same place (bubblewrap shows ``/usr`` and what
``ro_binds`` names) implements ``HostPathBinder``: ``shows_host_path`` says whether a host path is
already visible, ``bind_read_only`` adds read-only binds for the handle's later commands. A provider
without the host's filesystem (a container, a VM) does not implement it, and nothing here applies.

An npm-installed CLI is a symlink (``node_modules/.bin/claude``) into a package that may need its
siblings, so what is bound is the outermost ``node_modules`` that holds the real file, never the
link's own directory; anything else is bound as the one file it is, not its folder: a CLI in
``~/bin`` must not show the agent the rest of the home directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

__all__ = [
    "HostCommand",
    "HostPathBinder",
    "bind_hint",
    "expose_host_command",
    "expose_host_directory",
    "find_host_command",
    "host_directory_of",
    "host_path_env",
]

_SHEBANG_BYTES = 512


@runtime_checkable
class HostPathBinder(Protocol):
    """A handle whose sandbox can be shown more host paths, read-only and at the same path."""

    def shows_host_path(self, path: str) -> bool:
        """Whether the host path ``path`` is visible at the same path inside the sandbox."""
        ...

    def bind_read_only(self, paths: Sequence[str]) -> None:
        """Show ``paths`` (host paths) read-only at the same path to the handle's later commands."""
        ...


def bind_hint(path: str) -> str:
    """What to tell a user whose sandbox does not see ``path``."""
    return f"bind it read-only with bubblewrap_sandbox(ro_binds=[{path!r}])"


@dataclass(frozen=True)
class HostCommand:
    """A command found on the host, and how the sandbox runs it once its files are bound."""

    name: str  # what was looked up, e.g. "claude"
    host_path: str  # where the host's PATH found it (maybe a symlink)
    # By absolute path, with the script's interpreter in front: the sandbox's PATH need not find either.
    argv: tuple[str, ...]
    needs: tuple[str, ...]  # host paths the sandbox must see for argv to run
    bound: tuple[str, ...] = ()  # the ones that had to be bound for this sandbox


def _bind_root(real: str) -> str:
    parts = real.split(os.sep)
    if "node_modules" in parts:
        # The outermost one: npm hoists a package's dependencies up to it.
        return os.sep.join(parts[: parts.index("node_modules") + 1]) or os.sep
    return real


def _interpreter(real: str, path_env: str | None) -> tuple[str, ...]:
    """The ``#!`` line of a script as an argv prefix (``env NAME`` resolved on the host), or ``()``."""
    try:
        with open(real, "rb") as f:
            head = f.read(_SHEBANG_BYTES)
    except OSError:
        return ()
    if not head.startswith(b"#!"):
        return ()
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return ()
    program, args = words[0], words[1:]
    if os.path.basename(program) == "env":
        args = [a for a in args if not a.startswith("-")]  # `env -S node --flag`: -S only splits
        if not args:
            return ()
        program, args = args[0], args[1:]
    found = shutil.which(program, path=path_env) if not os.path.isabs(program) else program
    if found is None or not os.path.exists(found):
        return ()
    return (os.path.realpath(found), *args)


def find_host_command(name: str, path_env: str | None) -> HostCommand | None:
    """``name`` as the host finds it (``path_env`` is the host's PATH), or None when it finds none."""
    found = shutil.which(name, path=path_env)
    if found is None:
        return None
    real = os.path.realpath(found)
    interpreter = _interpreter(real, path_env)
    needs = [_bind_root(real)]
    if interpreter:
        needs.append(_bind_root(interpreter[0]))
    return HostCommand(
        name=name,
        host_path=os.path.abspath(found),
        argv=(*interpreter, real),
        needs=tuple(dict.fromkeys(needs)),
    )


def expose_host_command(handle: object, name: str, path_env: str | None) -> HostCommand | None:
    """Find ``name`` on the host and bind what it needs into ``handle``'s sandbox.

    None when the handle cannot be shown host paths (its sandbox is not on this host's filesystem)
    or the host has no such command: the sandbox then runs ``name`` as it finds it, or reports it missing.
    """
    if not isinstance(handle, HostPathBinder):
        return None
    command = find_host_command(name, path_env)
    if command is None:
        return None
    missing = tuple(p for p in command.needs if not handle.shows_host_path(p))
    if missing:
        handle.bind_read_only(missing)
    return HostCommand(command.name, command.host_path, command.argv, command.needs, missing)


def host_directory_of(url: str) -> str | None:
    """The host directory a git source URL names (``file:///srv/repo`` or ``/srv/repo``), else None."""
    if url.startswith("file://"):
        path = unquote(urlsplit(url).path)
    elif os.path.isabs(url):
        path = url
    else:
        return None
    return os.path.realpath(path) if os.path.isdir(path) else None


def expose_host_directory(handle: object, path: str) -> bool:
    """Bind the host directory ``path`` read-only into ``handle``'s sandbox unless it shows it already.

    False when the handle cannot be shown host paths; True when the sandbox sees ``path`` now.
    """
    if not isinstance(handle, HostPathBinder):
        return False
    if not handle.shows_host_path(path):
        handle.bind_read_only([path])
    return True


def host_path_env(host_env: Mapping[str, str]) -> str | None:
    """The PATH a harness executable is looked up on: the run's host env, else this process's."""
    return host_env.get("PATH") or os.environ.get("PATH")
