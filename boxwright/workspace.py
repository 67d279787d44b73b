"""What the agent sees: a workspace's source, setup plan, scripts, skills and instructions, and its bootstrap.

``define_workspace`` only records data; ``bootstrap`` lands it in a freshly
created sandbox, in order: secrets into the env, the source, git skills,
``AGENTS.md`` (with ``CLAUDE.md``/``GEMINI.md`` links) and other file skills,
the package manager, then the setup plan over one persistent shell.
Per-harness projection (MCP config, skill links, plugins) is ``projection.py``.

``workspace_hash`` keys a sandbox on everything that changes what the agent
sees, never on a secret value (R32).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec

from .abort import AbortSignal
from .errors import GitSkillError, SandboxCommandError, WorkspaceSourceError
from .git_exclude import hide_from_git
from .host_paths import expose_host_directory, host_directory_of
from .sandbox import WORKSPACE, ProcessOptions, SandboxHandle
from .secrets import SecretRef, Secrets, create_secrets, is_secret_ref, redact, resolve_all_secrets, resolve_secret
from .setup_shell import (
    STEP_TIMEOUT,
    Parallel,
    Serial,
    SetupBuilder,
    SetupCallback,
    SetupGroup,
    build_setup_plan,
    run_setup,
    tail,
)
from .shell import quote

SKILLS_DIR = ".boxwright-skills"
PACKAGE_MANAGERS = ("npm", "pnpm", "yarn", "bun", "auto")
# Probe order matters: a pnpm repo may also carry a stray package-lock.json.
LOCKFILES = (("pnpm", "pnpm-lock.yaml"), ("yarn", "yarn.lock"), ("bun", "bun.lockb"), ("npm", "package-lock.json"))
INSTRUCTIONS_FILE = "AGENTS.md"
INSTRUCTION_LINKS = ("CLAUDE.md", "GEMINI.md")
Depth = int | Literal["full"]

# -- sources -----------------------------------------------------------------------------------------


class GitAuth(msgspec.Struct, frozen=True):
    token: SecretRef
    username: str | None = None


class GitSource(msgspec.Struct, frozen=True, tag="git", tag_field="type"):
    url: str
    ref: str | None = None
    auth: GitAuth | None = None
    depth: Depth | None = None
    type: ClassVar[Literal["git"]] = "git"


class LocalSource(msgspec.Struct, frozen=True, tag="local", tag_field="type"):
    path: str
    type: ClassVar[Literal["local"]] = "local"


class NoneSource(msgspec.Struct, frozen=True, tag="none", tag_field="type"):
    type: ClassVar[Literal["none"]] = "none"


Source = GitSource | LocalSource | NoneSource

# -- skills ------------------------------------------------------------------------------------------


class FileSkill(msgspec.Struct, frozen=True, tag="file", tag_field="kind"):
    path: str
    content: str


class AgentSkill(msgspec.Struct, frozen=True, tag="agent-skill", tag_field="kind"):
    name: str


class GitSkill(msgspec.Struct, frozen=True, tag="git", tag_field="kind"):
    repo: str
    secret: SecretRef | None = None
    into: str | None = None


class McpSkill(msgspec.Struct, frozen=True, tag="mcp", tag_field="kind"):
    # config["headers"] values may be str, SecretRef or BearerRef; they stay unresolved here (R4).
    name: str
    config: dict[str, Any]


Skill = FileSkill | AgentSkill | GitSkill | McpSkill

# -- the workspace -----------------------------------------------------------------------------------


class Workspace(msgspec.Struct, frozen=True, kw_only=True):
    source: Source
    package_manager: str = "auto"
    setup: tuple[str, ...] | SetupCallback | None = None
    scripts: dict[str, str] | None = None
    skills: tuple[Skill, ...] = ()
    instructions: str | None = None
    plugins: tuple[str, ...] = ()
    secrets: Secrets | None = None
    root: str = WORKSPACE


class BootstrapResult(msgspec.Struct, frozen=True, rename="camel"):
    package_manager: str | None
    ran_setup: list[str]


def define_workspace(
    *,
    source: Source | None = None,
    package_manager: str = "auto",
    setup: Sequence[str] | SetupCallback | None = None,
    scripts: Mapping[str, str] | None = None,
    skills: Sequence[Skill] = (),
    instructions: str | None = None,
    plugins: Sequence[str] = (),
    secrets: Secrets | Mapping[str, str] | None = None,
    root: str = WORKSPACE,
) -> Workspace:
    """Validate and record a workspace; no I/O, and a setup callback is not run yet (R1)."""
    if source is None:
        source = NoneSource()
    if not isinstance(source, GitSource | LocalSource | NoneSource):
        raise TypeError(f"source must come from git_source/github_repo/local_source/none_source, got {source!r}")
    if package_manager not in PACKAGE_MANAGERS:
        raise ValueError(f"package_manager must be one of {', '.join(PACKAGE_MANAGERS)}; got {package_manager!r}")
    if setup is not None and not callable(setup):
        setup = tuple(s.command for s in build_setup_plan(setup) if isinstance(s, Serial))
    if scripts is not None:
        for name, command in scripts.items():
            if not isinstance(name, str) or not name or not isinstance(command, str):
                raise TypeError(f"scripts maps names to command strings; got {name!r}: {command!r}")
        scripts = dict(scripts)
    for skill in skills:
        if not isinstance(skill, FileSkill | AgentSkill | GitSkill | McpSkill):
            raise TypeError(f"skills take file_skill/agent_skill/git_skill/mcp_skill values, got {skill!r}")
    if instructions is not None and not isinstance(instructions, str):
        raise TypeError(f"instructions must be a string, got {type(instructions).__name__}")
    if isinstance(plugins, str) or not all(isinstance(p, str) and p for p in plugins):
        raise TypeError(f"plugins must be a list of non-empty strings, got {plugins!r}")
    if secrets is not None and not isinstance(secrets, Secrets):
        secrets = create_secrets(secrets)
    if not isinstance(root, str) or not root.startswith("/"):
        raise ValueError(f"root must be an absolute path inside the sandbox, got {root!r}")
    return Workspace(
        source=source,
        package_manager=package_manager,
        setup=setup,
        scripts=scripts,
        skills=tuple(skills),
        instructions=instructions,
        plugins=tuple(plugins),
        secrets=secrets,
        root=root.rstrip("/") or "/",
    )


_SHORTHAND = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_SCP_LIKE = re.compile(r"[\w.-]+@[\w.-]+:")


def repo_url(repo: str) -> str:
    """``o/r`` -> ``https://github.com/o/r.git``; a URL (or path, or ``user@host:path``) is kept (R1)."""
    if not isinstance(repo, str) or not repo:
        raise ValueError(f"a git repository must be a non-empty string, got {repo!r}")
    if repo.startswith("http") or "://" in repo or repo.startswith("/") or _SCP_LIKE.match(repo):
        return _url(repo)
    if _SHORTHAND.fullmatch(repo):
        return f"https://github.com/{repo}.git"
    raise ValueError(f"bad git repository {repo!r}: expected 'owner/name' or a URL")


def _url(url: str) -> str:
    if not isinstance(url, str) or not url or url.startswith("-") or any(c.isspace() or c == "\x00" for c in url):
        raise ValueError(f"bad git URL {url!r}: it must be non-empty, without spaces, and not start with '-'")
    return url


def _check_clone_args(ref: str | None, depth: object) -> None:
    if ref is not None and (not isinstance(ref, str) or not ref or ref.startswith("-") or "\x00" in ref):
        raise ValueError(f"bad git ref {ref!r}: it must be a non-empty name that does not start with '-'")
    if depth is not None and depth != "full" and (type(depth) is not int or depth < 1):
        raise ValueError(f"git depth must be a positive int or 'full', got {depth!r}")


def git_source(
    url: str, *, ref: str | None = None, depth: Depth | None = None, auth: GitAuth | SecretRef | None = None
) -> GitSource:
    """Clone ``url`` into the workspace; unset ``depth`` is the provider default, a shallow clone (R2)."""
    _check_clone_args(ref, depth)
    if auth is not None and not isinstance(auth, GitAuth):
        if not is_secret_ref(auth):
            raise TypeError("git auth takes a SecretRef (from create_secrets) or GitAuth(token=SecretRef)")
        auth = GitAuth(auth)
    if auth is not None and not is_secret_ref(auth.token):
        raise TypeError("GitAuth.token must be a SecretRef (from create_secrets), never a plain token")
    return GitSource(_url(url), ref=ref, auth=auth, depth=depth)


def github_repo(
    repo: str, *, ref: str | None = None, depth: Depth | None = None, secret: SecretRef | None = None
) -> GitSource:
    return git_source(repo_url(repo), ref=ref, depth=depth, auth=secret)


def local_source(path: str | os.PathLike[str]) -> LocalSource:
    """A host directory; copied into the sandbox at bootstrap unless the provider already shows it there."""
    path = os.fspath(path)
    if not path:
        raise ValueError("local_source needs a directory path")
    return LocalSource(os.path.abspath(path))


def none_source() -> NoneSource:
    return NoneSource()


def file_skill(path: str, content: str) -> FileSkill:
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"file_skill path must be relative to the workspace root, without '..': {path!r}")
    if not isinstance(content, str):
        raise TypeError(f"file_skill content must be a string, got {type(content).__name__}")
    return FileSkill(path, content)


def agent_skill(name: str) -> AgentSkill:
    if not isinstance(name, str) or not name:
        raise ValueError(f"agent_skill needs a name, got {name!r}")
    return AgentSkill(name)


def git_skill(repo: str, *, secret: SecretRef | None = None, into: str | None = None) -> GitSkill:
    repo_url(repo)
    git_skill_basename(repo)
    if secret is not None and not is_secret_ref(secret):
        raise TypeError("git_skill secret must be a SecretRef (from create_secrets)")
    if into is not None and (not isinstance(into, str) or not into.startswith("/")):
        raise ValueError(f"git_skill into must be an absolute path inside the sandbox, got {into!r}")
    return GitSkill(repo, secret=secret, into=into)


def mcp_skill(name: str, config: Mapping[str, Any]) -> McpSkill:
    if not isinstance(name, str) or not name:
        raise ValueError(f"mcp_skill needs a name, got {name!r}")
    if not isinstance(config, Mapping):
        raise TypeError(f"mcp_skill config must be a mapping, got {type(config).__name__}")
    _canonical_value(config, f"mcp_skill {name!r} config")
    return McpSkill(name, dict(config))


def git_skill_basename(repo: str) -> str:
    name = repo.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    name = name[:-4] if name.endswith(".git") else name
    if name in ("", ".", ".."):
        raise ValueError(f"cannot name a directory after git repository {repo!r}")
    return name


def git_skill_dir(root: str, skill: GitSkill) -> str:
    """``into``, else ``<root>/.boxwright-skills/<basename>`` (R12)."""
    return skill.into or f"{root.rstrip('/')}/{SKILLS_DIR}/{git_skill_basename(skill.repo)}"


# -- canonical form and hash (R32) -------------------------------------------------------------------


def workspace_canonical(ws: Workspace | None) -> object:
    """JSON-able builtins of everything that changes what the agent sees; secrets excluded.

    Unset and default fields are omitted, so equal workspaces compare equal however
    they were spelled; a setup callback appears as the plan it records.
    """
    if ws is None:
        return None
    out: dict[str, object] = {"source": _source_canonical(ws.source)}
    if ws.package_manager != "auto":
        out["packageManager"] = ws.package_manager
    plan = build_setup_plan(ws.setup)
    if plan:
        out["setup"] = [g.command if isinstance(g, Serial) else list(g.commands) for g in plan]
    if ws.scripts:
        out["scripts"] = dict(ws.scripts)
    if ws.skills:
        out["skills"] = [_skill_canonical(s) for s in ws.skills]
    if ws.instructions:
        out["instructions"] = ws.instructions
    if ws.plugins:
        out["plugins"] = list(ws.plugins)
    if ws.root != WORKSPACE:
        out["root"] = ws.root
    return out


def _source_canonical(source: Source) -> dict[str, object]:
    if isinstance(source, LocalSource):
        return {"type": "local", "path": source.path}
    if isinstance(source, NoneSource):
        return {"type": "none"}
    out: dict[str, object] = {"type": "git", "url": source.url}
    if source.ref is not None:
        out["ref"] = source.ref
    if source.auth is not None:
        auth: dict[str, object] = {"token": _canonical_value(source.auth.token, "auth.token")}
        if source.auth.username is not None:
            auth["username"] = source.auth.username
        out["auth"] = auth
    if source.depth is not None:
        out["depth"] = source.depth
    return out


def _skill_canonical(skill: Skill) -> dict[str, object]:
    if isinstance(skill, FileSkill):
        return {"kind": "file", "path": skill.path, "content": skill.content}
    if isinstance(skill, AgentSkill):
        return {"kind": "agent-skill", "name": skill.name}
    if isinstance(skill, McpSkill):
        return {"kind": "mcp", "name": skill.name, "config": _canonical_value(skill.config, skill.name)}
    out: dict[str, object] = {"kind": "git", "repo": skill.repo}
    if skill.secret is not None:
        out["secret"] = _canonical_value(skill.secret, "secret")
    if skill.into is not None:
        out["into"] = skill.into
    return out


def _canonical_value(value: object, where: str) -> object:
    """Builtins of a config value; a secret reference becomes its name (``{"secretName": ...}``), never a value."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if is_secret_ref(value):
        return {"secretName": value.secret_name}
    if is_secret_ref(getattr(value, "ref", None)):
        return {"ref": _canonical_value(getattr(value, "ref", None), where)}
    if isinstance(value, Mapping):
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {key!r}")
            out[key] = _canonical_value(item, f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__name__} is not a JSON value or secret reference")


def canonical_json(value: object) -> str:
    """Compact JSON with keys sorted by UTF-16 code units, non-ASCII kept: what JS ``JSON.stringify`` gives."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "null"
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, str):
        # Lone surrogates are escaped, as well-formed JSON.stringify does.
        return re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m[0]):04x}", json.dumps(value, ensure_ascii=False))
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON keys must be strings, got {key!r}")
        keys = sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(f"{canonical_json(k)}:{canonical_json(value[k])}" for k in keys) + "}"
    raise TypeError(f"{type(value).__name__} has no canonical JSON form")


def stable_hash(value: object) -> str:
    """16 hex chars of SHA-256 over the UTF-8 of ``canonical_json(value)`` (R32, with decision 8).

    The reference's FNV-1a runs a second lane over the high bytes of UTF-16 code
    units, which are zero for ASCII: its 64-bit keys carry 32 bits for most input,
    and a key collision would hand one thread's sandbox to another. So we hash
    with SHA-256; keys need not match the TypeScript original's.
    """
    data = canonical_json(value).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:16]


def workspace_hash(ws: Workspace | None) -> str:
    return stable_hash("no-workspace") if ws is None else stable_hash(workspace_canonical(ws))


# -- bootstrap (R10-R19) -----------------------------------------------------------------------------


async def bootstrap(
    handle: SandboxHandle,
    workspace: Workspace,
    *,
    signal: AbortSignal | None = None,
    step_timeout: float = STEP_TIMEOUT,
) -> BootstrapResult:
    """Land ``workspace`` in a freshly created sandbox and run its setup; see the module doc for the order."""
    root = workspace.root

    def check() -> None:
        if signal is not None:
            signal.throw_if_aborted()

    check()
    resolved = resolve_all_secrets(workspace.secrets)
    if resolved:
        handle.env.set(resolved)
    await _land_source(handle, workspace, root, signal)
    for skill in workspace.skills:
        if isinstance(skill, GitSkill):
            check()
            await _clone_git_skill(handle, workspace, root, skill)
    if any(isinstance(skill, GitSkill) and skill.into is None for skill in workspace.skills):
        # Our clones, not the agent's work: out of every diff and of the agent's `git add -A`.
        await hide_from_git(handle, root, [f"/{SKILLS_DIR}/"])
    check()
    await _write_instructions_and_files(handle, workspace, root, signal)
    package_manager = await detect_package_manager(handle, workspace)
    ran = await run_setup(handle, build_setup_plan(workspace.setup), root, signal=signal, step_timeout=step_timeout)
    return BootstrapResult(package_manager, ran)


async def _land_source(handle: SandboxHandle, ws: Workspace, root: str, signal: AbortSignal | None) -> None:
    source = ws.source
    if isinstance(source, GitSource):
        if await handle.fs.exists(f"{root}/.git"):
            return
        auth: dict[str, str] | None = None
        if source.auth is not None:
            auth = {"token": resolve_secret(ws.secrets, source.auth.token)}
            if source.auth.username:
                auth["username"] = source.auth.username
        # Depth only when set: the provider default is the shallow clone (R2).
        extra: dict[str, Any] = {} if source.depth is None else {"depth": source.depth}
        hint = _show_local_repository(handle, source.url, "copy it in with local_source({path})")
        try:
            await handle.git.clone(source.url, root, ref=source.ref, auth=auth, **extra)
        except SandboxCommandError as exc:
            raise WorkspaceSourceError(source.url, redact(str(exc)) + hint, ref=source.ref, dir=root) from None
    elif isinstance(source, LocalSource):
        if await handle.fs.exists(root) and await handle.fs.list(root):
            return  # the provider mounted or copied the directory at create
        await _copy_host_dir(handle, source.path, root, signal)


def _show_local_repository(handle: SandboxHandle, url: str, remedy: str) -> str:
    """Show a host repository to the clone; what a failed clone's error adds when it could not be shown.

    A clone inside the sandbox reads a host repository (file:///srv/repo) through the sandbox's
    eyes: bubblewrap shows it read-only, on its own, for as long as the handle lives.
    """
    path = host_directory_of(url)
    if path is None or expose_host_directory(handle, path):
        return ""
    return f" (the host directory {path} may not be visible in this sandbox: {remedy.format(path=repr(path))})"


async def _copy_host_dir(handle: SandboxHandle, src: str, root: str, signal: AbortSignal | None) -> None:
    """Copy a host directory in through ``handle.fs`` (any provider); links and exec bits through one shell."""
    if not os.path.isdir(src):
        raise WorkspaceSourceError(src, "the local directory does not exist or is not a directory", dir=root)
    files, links, dirs = await asyncio.to_thread(_walk, src)
    await handle.fs.mkdir(root)
    for rel in dirs:
        await handle.fs.mkdir(f"{root}/{rel}")
    executables = []
    for rel, mode in files:
        data = await asyncio.to_thread(_read_bytes, os.path.join(src, rel))
        await handle.fs.write(f"{root}/{rel}", data)
        if mode & 0o111:
            executables.append(rel)
    commands = [f"ln -s -- {quote(target)} {quote(rel)}" for rel, target in links]
    commands += [f"chmod +x -- {quote(rel)}" for rel in executables]
    for start in range(0, len(commands), 200):
        batch = " && ".join(commands[start : start + 200])
        result = await handle.process.exec(batch, ProcessOptions(cwd=root, signal=signal))
        if result.exit_code != 0:
            raise WorkspaceSourceError(src, f"could not recreate links/modes: {tail(result.stderr)}", dir=root)


def _walk(src: str) -> tuple[list[tuple[str, int]], list[tuple[str, str]], list[str]]:
    files: list[tuple[str, int]] = []
    links: list[tuple[str, str]] = []
    dirs: list[str] = []
    for top, dirnames, filenames in os.walk(src):
        rel_top = os.path.relpath(top, src)
        for name in [*dirnames, *filenames]:
            path = os.path.join(top, name)
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                links.append((rel, os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                dirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                files.append((rel, st.st_mode))
    return files, links, dirs


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def _clone_git_skill(handle: SandboxHandle, ws: Workspace, root: str, skill: GitSkill) -> None:
    url = repo_url(skill.repo)
    target = git_skill_dir(root, skill)
    auth = None
    if skill.secret is not None and ws.secrets is not None:
        auth = {"token": resolve_secret(ws.secrets, skill.secret)}
    hint = _show_local_repository(handle, url, "give the skill a URL the sandbox can reach")
    try:
        await handle.git.clone(url, target, auth=auth, depth=1)
    except SandboxCommandError as exc:
        raise GitSkillError(skill.repo, url, target, redact(str(exc)) + hint) from None


def instructions_content(ws: Workspace) -> str | None:
    """``AGENTS.md`` text: instructions (else an ``AGENTS.md`` file skill) plus a scripts section (R13)."""
    base = ws.instructions or None
    if base is None:
        base = next((s.content for s in ws.skills if isinstance(s, FileSkill) and s.path == INSTRUCTIONS_FILE), None)
    section = ""
    if ws.scripts:
        lines = [f"- {name} → {ws.scripts[name]}" for name in sorted(ws.scripts)]
        section = "## Workspace scripts\n\n" + "\n".join(lines)
    if not section:
        return base
    return section if base is None else f"{base.rstrip()}\n\n{section}"


async def _write_instructions_and_files(
    handle: SandboxHandle, ws: Workspace, root: str, signal: AbortSignal | None
) -> None:
    linked: set[str] = set()
    content = instructions_content(ws)
    if content is not None:
        await handle.fs.write(f"{root}/{INSTRUCTIONS_FILE}", content)
        for name in INSTRUCTION_LINKS:
            link = f"ln -s {quote(INSTRUCTIONS_FILE)} {quote(name)}"
            result = await handle.process.exec(link, ProcessOptions(cwd=root, signal=signal))
            if result.exit_code == 0:
                linked.add(name)
            else:
                await handle.fs.write(f"{root}/{name}", content)
    for skill in ws.skills:
        if isinstance(skill, FileSkill) and skill.path != INSTRUCTIONS_FILE:
            if skill.path in linked:
                # Writing through our link would overwrite AGENTS.md itself.
                await handle.fs.remove(f"{root}/{skill.path}")
            await handle.fs.write(f"{root}/{skill.path}", skill.content)


async def detect_package_manager(handle: SandboxHandle, ws: Workspace) -> str | None:
    """An explicit manager wins; ``auto`` probes the lockfiles in order; none found -> ``None`` (R15)."""
    if ws.package_manager != "auto":
        return ws.package_manager
    for manager, lockfile in LOCKFILES:
        if await handle.fs.exists(f"{ws.root}/{lockfile}"):
            return manager
    return None


__all__ = [
    "INSTRUCTION_LINKS",
    "LOCKFILES",
    "PACKAGE_MANAGERS",
    "SKILLS_DIR",
    "AgentSkill",
    "BootstrapResult",
    "FileSkill",
    "GitAuth",
    "GitSkill",
    "GitSource",
    "LocalSource",
    "McpSkill",
    "NoneSource",
    "Parallel",
    "Serial",
    "SetupBuilder",
    "SetupGroup",
    "Skill",
    "Source",
    "Workspace",
    "agent_skill",
    "bootstrap",
    "build_setup_plan",
    "canonical_json",
    "define_workspace",
    "detect_package_manager",
    "file_skill",
    "git_skill",
    "git_skill_dir",
    "git_source",
    "github_repo",
    "instructions_content",
    "local_source",
    "mcp_skill",
    "none_source",
    "repo_url",
    "stable_hash",
    "workspace_canonical",
    "workspace_hash",
]
