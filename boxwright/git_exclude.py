"""boxwright's own files in a workspace, kept out of git's sight through ``.git/info/exclude``.

The projection marker, cloned git skills and projected configs live in the worktree because the
agent must find them there; but an untracked file is in every diff boxwright reports and in what an
agent's ``git add -A`` commits. ``info/exclude`` is git's per-clone ignore list: unlike a
``.gitignore`` it is itself no file of the worktree, and it hides only untracked files, so a tracked
file the user keeps (a ``.mcp.json`` in the repository) still shows its changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .sandbox import ProcessOptions, SandboxHandle
from .shell import quote

__all__ = ["hide_from_git"]


async def hide_from_git(handle: SandboxHandle, root: str, patterns: Sequence[str]) -> None:
    """Add ``patterns`` (gitignore syntax, ``/x`` anchored at ``root``) to the repository's exclude list.

    Nothing when ``root`` is not the top of a git repository: there is no diff to keep clean then.
    Idempotent: a pattern already listed is not added again.
    """
    if not patterns:
        return
    git = f"{root.rstrip('/')}/.git"
    found = await handle.fs.lstat(git)
    if found is None:
        return
    if found.type == "dir":
        path = f"{git}/info/exclude"
        existing = await handle.fs.read(path) if await handle.fs.exists(path) else ""
        listed = set(existing.splitlines())
        missing = [p for p in dict.fromkeys(patterns) if p not in listed]
        if missing:
            lead = "" if not existing or existing.endswith("\n") else "\n"
            await handle.fs.write(path, existing + lead + "\n".join(missing) + "\n")
        return
    # A linked worktree or submodule: `.git` is a file naming a git dir that may lie outside the
    # workspace, where only git itself knows the path (and the sandbox's file API may not reach).
    appends = " && ".join(f'{{ grep -qxF -- {quote(p)} "$f" || printf "%s\\n" {quote(p)} >> "$f"; }}' for p in patterns)
    command = f'f=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$f")" && touch "$f" && {appends}'
    await handle.process.exec(command, ProcessOptions(cwd=root))
