"""Git over a sandbox's ``exec``: what every provider without a native git client uses.

Tokens never reach argv or ``.git/config``: a one-shot credential helper reads
them from the child's env. A non-zero exit raises; a git failure is never ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from .errors import SandboxCommandError
from .sandbox import WORKSPACE, ProcessOptions, SandboxProcesses
from .shell import positional, quote

# Reads the token from the env of the git process, so it is never an argument.
_CREDENTIAL_HELPER = (
    "!f() { echo username=${GIT_ASKPASS_USER:-x-access-token}; echo password=${GIT_ASKPASS_TOKEN}; }; f"
)
_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")


def _auth_env(auth: Mapping[str, str] | None) -> dict[str, str]:
    env = {"GIT_TERMINAL_PROMPT": "0"}
    if auth and auth.get("token"):
        env["GIT_ASKPASS_TOKEN"] = auth["token"]
        if auth.get("username"):
            env["GIT_ASKPASS_USER"] = auth["username"]
    return env


def _git(auth: Mapping[str, str] | None) -> str:
    if auth and auth.get("token"):
        return "git -c credential.helper= -c " + quote(f"credential.helper={_CREDENTIAL_HELPER}")
    return "git"


class ExecGit:
    """``SandboxGit`` implemented with shell commands run through ``process.exec``."""

    def __init__(self, process: SandboxProcesses, shell_path: Callable[[str], str] | None = None) -> None:
        self._process = process
        # How a sandbox path reads in the shell: local-process runs on the host, where
        # /workspace is not the workspace.
        self._shell_path = shell_path or (lambda path: path)

    async def _run(self, op: str, command: str, auth: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        result = await self._process.exec(command, ProcessOptions(cwd=cwd, env=_auth_env(auth)))
        if result.exit_code != 0:
            raise SandboxCommandError(op, result.exit_code, result.stderr or result.stdout)
        return result.stdout

    async def clone(
        self,
        url: str,
        dir: str,
        *,
        ref: str | None = None,
        auth: Mapping[str, str] | None = None,
        depth: int | Literal["full"] = 1,
    ) -> None:
        positional(url, "git url")
        positional(dir, "clone directory")
        if depth != "full" and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise ValueError(f"git clone depth must be a positive int or 'full', got {depth!r}")
        if ref is not None:
            positional(ref, "git ref")
        dir = self._shell_path(dir)
        git = _git(auth)
        shallow = "" if depth == "full" else f" --depth {depth}"
        parent = quote(dir.rstrip("/").rsplit("/", 1)[0] or "/") if "/" in dir.rstrip("/") else "."
        if ref is not None and _SHA.match(ref):
            # A commit cannot be named by --branch: fetch it into a fresh repository instead.
            cmd = (
                f"mkdir -p {quote(dir)} && cd {quote(dir)} && git init -q && "
                f"git remote add origin -- {quote(url)} && {git} fetch -q{shallow} origin -- {quote(ref)} && "
                "git checkout -q FETCH_HEAD"
            )
        else:
            branch = f" --branch {quote(ref)}" if ref is not None else ""
            single = " --single-branch" if depth != "full" else ""
            cmd = f"mkdir -p {parent} && {git} clone -q{shallow}{single}{branch} -- {quote(url)} {quote(dir)}"
        await self._run("git clone", cmd, auth)

    async def status(self, dir: str = WORKSPACE) -> str:
        return await self._run("git status", "git status --porcelain", cwd=dir)

    async def add(self, paths: Sequence[str], dir: str = WORKSPACE) -> None:
        await self._run("git add", "git add -- " + " ".join(quote(p) for p in paths), cwd=dir)

    async def commit(self, message: str, dir: str = WORKSPACE) -> None:
        await self._run("git commit", f"git commit -q -m {quote(message)}", cwd=dir)

    async def push(self, dir: str = WORKSPACE, *, auth: Mapping[str, str] | None = None) -> None:
        await self._run("git push", f"{_git(auth)} push -q", auth, cwd=dir)

    async def pull(self, dir: str = WORKSPACE, *, auth: Mapping[str, str] | None = None) -> None:
        await self._run("git pull", f"{_git(auth)} pull -q", auth, cwd=dir)

    async def branch(self, dir: str = WORKSPACE) -> str:
        return (await self._run("git branch", "git rev-parse --abbrev-ref HEAD", cwd=dir)).strip()


__all__ = ["ExecGit"]
