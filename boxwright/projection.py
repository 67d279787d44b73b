"""Projection: a workspace's MCP servers, git skills, agent skills and plugins -> each harness's own files.

Every run, before the harness starts, ``project_workspace`` rewrites the
harness's MCP config with freshly resolved header values (so a rotated secret
applies on the next run and a restored snapshot never serves a stale one).
Everything else (skill links, plugin installs, warnings) is done once per
sandbox, guarded by an empty marker file named after the workspace hash.

What a harness cannot express is skipped with one WARNING on the
``boxwright.projection`` logger per item and sandbox, never an exception.
Secret values go into the harness config files (that is their purpose) and
nowhere else: no log line, no error text.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import math
import posixpath
import re
import tomllib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from .abort import AbortSignal
from .errors import BoxwrightError, SecretResolutionError
from .git_exclude import hide_from_git
from .sandbox import WORKSPACE, ProcessOptions, SandboxHandle
from .secrets import BearerRef, SecretRef, Secrets, is_bearer_ref, redact, resolve_bearer, resolve_secret
from .shell import quote
from .workspace import AgentSkill, GitSkill, McpSkill, Skill, Workspace, git_skill_dir

PROJECTION_MARKER_PREFIX = ".boxwright-projected-"
SKILL_FILE = "skill.md"
MAX_SKILL_DEPTH = 6
PLUGIN_INSTALL_TIMEOUT_S = 300.0

Harness = Literal["claude-code", "codex", "opencode", "grok-build"]
SecretResolver = Callable[[SecretRef | BearerRef], str]

log = logging.getLogger("boxwright.projection")


@dataclass(frozen=True, kw_only=True)
class WorkspaceProjection:
    """What a run projects into the harness: built by ``projection_for``, consumed by ``project_workspace``.

    ``root`` and ``marker_path`` are virtual sandbox paths (``/workspace/...``);
    the provider maps them onto its real workspace directory.
    """

    skills: Sequence[Skill]
    plugins: Sequence[str]
    resolve_secret: SecretResolver
    marker_path: str
    root: str = WORKSPACE
    scripts: Mapping[str, str] = field(default_factory=dict)


def marker_path_for(root: str, workspace_hash: str) -> str:
    return f"{root.rstrip('/')}/{PROJECTION_MARKER_PREFIX}{workspace_hash}"


def projection_for(workspace: Workspace, workspace_hash: str) -> WorkspaceProjection:
    root = workspace.root or WORKSPACE
    return WorkspaceProjection(
        skills=tuple(workspace.skills or ()),
        plugins=tuple(workspace.plugins or ()),
        resolve_secret=_resolver(workspace.secrets),
        marker_path=marker_path_for(root, workspace_hash),
        root=root,
        scripts=dict(workspace.scripts or {}),
    )


def _resolver(secrets: Secrets | None) -> SecretResolver:
    def resolve(ref: SecretRef | BearerRef) -> str:
        if secrets is None:
            name = _ref_name(ref)
            raise SecretResolutionError(
                f"secret {name!r} is used by the workspace, but the workspace has no secrets; "
                "pass secrets=create_secrets(...) to define_workspace",
                name,
            )
        if is_bearer_ref(ref):
            return resolve_bearer(secrets, ref)
        return resolve_secret(secrets, ref)

    return resolve


def _ref_name(ref: object) -> str:
    inner = ref.ref if is_bearer_ref(ref) else ref
    name = getattr(inner, "secret_name", None)
    return name if isinstance(name, str) else type(ref).__name__


# -- per-harness targets --------------------------------------------------------------------------


class McpServer(NamedTuple):
    """One remote (streamable HTTP) MCP server with its headers already resolved."""

    url: str
    headers: dict[str, str]


class _Target(NamedTuple):
    mcp_file: str  # root-relative
    servers_key: str  # the top-level key (JSON) or table (TOML) holding one entry per server
    entry: Callable[[McpServer], dict[str, Any]]
    skills_dir: str | None  # root-relative; None: the harness has no skills folder
    installs_plugins: bool

    def render(self, existing: str | None, servers: dict[str, McpServer]) -> tuple[str, bool]:
        """The new file text, and whether ``existing`` parsed (else it is replaced, not merged)."""
        toml = self.mcp_file.endswith(".toml")
        doc, parsed = _parse(existing, toml)
        found = doc.get(self.servers_key)
        entries: dict[str, Any] = found if isinstance(found, dict) else {}
        # Only our own names are replaced: a harness's tool-bridge entry and the user's servers stay.
        for name, server in servers.items():
            entries[name] = self.entry(server)
        doc[self.servers_key] = entries
        return toml_dumps(doc) if toml else json.dumps(doc, indent=2, ensure_ascii=False) + "\n", parsed


def _parse(existing: str | None, toml: bool) -> tuple[dict[str, Any], bool]:
    if existing is None or not existing.strip():
        return {}, True
    try:
        parsed = tomllib.loads(existing) if toml else json.loads(existing)
    except ValueError:  # TOMLDecodeError and JSONDecodeError both are
        return {}, False
    return (parsed, True) if isinstance(parsed, dict) else ({}, False)


def _claude_entry(server: McpServer) -> dict[str, Any]:
    return {"type": "http", "url": server.url, "headers": server.headers}


def _opencode_entry(server: McpServer) -> dict[str, Any]:
    return {"type": "remote", "url": server.url, "enabled": True, "headers": server.headers}


def _codex_entry(server: McpServer) -> dict[str, Any]:
    out: dict[str, Any] = {"url": server.url}
    if server.headers:
        # Inline, as Codex's docs and `-c` overrides write it; a [sub.table] would parse the same.
        out["http_headers"] = InlineTable(server.headers)
    return out


def _grok_entry(server: McpServer) -> dict[str, Any]:
    out: dict[str, Any] = {"url": server.url, "enabled": True}
    if server.headers:
        out["headers"] = dict(server.headers)
    return out


TARGETS: dict[str, _Target] = {
    "claude-code": _Target(".mcp.json", "mcpServers", _claude_entry, ".claude/skills", True),
    "codex": _Target(".codex/config.toml", "mcp_servers", _codex_entry, ".codex/skills", False),
    "grok-build": _Target(".grok/config.toml", "mcp_servers", _grok_entry, ".grok/skills", False),
    "opencode": _Target("opencode.json", "mcp", _opencode_entry, None, False),
}


def render_mcp_config(harness: str, existing: str | None, servers: Mapping[str, McpServer]) -> str:
    """``existing`` (a harness's MCP file text, or None) with ``servers`` put in; other entries are kept.

    For a harness adapter adding its own server to the same file (Grok's tool
    bridge shares ``.grok/config.toml`` with the workspace's servers).
    """
    target = TARGETS.get(harness)
    if target is None:
        raise ValueError(f"no MCP config format for harness {harness!r}; known: {', '.join(TARGETS)}")
    return target.render(existing, dict(servers))[0]


# -- warnings, once per item per sandbox ----------------------------------------------------------

_WARNED_MAX = 10_000
_warned: OrderedDict[tuple[str, str, str], None] = OrderedDict()


def _warn_once(logger: logging.Logger, handle: SandboxHandle, harness: str, item: str, message: str) -> None:
    key = (handle.id, harness, item)
    if key in _warned:
        return
    _warned[key] = None
    # Bounded: a long-lived host sees many sandboxes; forgetting the oldest costs at most a repeat warning.
    while len(_warned) > _WARNED_MAX:
        _warned.popitem(last=False)
    logger.warning(message)


# -- the projection -------------------------------------------------------------------------------


async def project_workspace(
    handle: SandboxHandle,
    projection: WorkspaceProjection,
    harness: Harness | str,
    *,
    logger: logging.Logger | None = None,
    executable: Sequence[str] = ("claude",),
) -> None:
    """Project ``projection`` into ``harness``'s files inside ``handle`` (R20-R23).

    ``executable`` is the harness's CLI as the sandbox runs it (an absolute path when the host's
    install was bound in): its plugin installer is that same program.
    """
    logger = logger or log
    target = TARGETS.get(harness)
    if target is None:
        _warn_once(
            logger,
            handle,
            harness,
            "harness",
            f"no workspace projection for harness {harness!r}: its skills, plugins and MCP servers are not "
            f"projected (projection knows {', '.join(TARGETS)})",
        )
        return
    root = projection.root.rstrip("/") or "/"
    run = _Run(handle, projection, harness, target, root, logger, executable)
    await run.write_mcp_config()
    if await handle.fs.exists(projection.marker_path):
        return
    for skill in projection.skills:
        if isinstance(skill, GitSkill):
            await run.link_git_skill(skill)
        elif isinstance(skill, AgentSkill):
            run.warn(
                f"agent-skill:{skill.name}",
                f"{harness}: agent skill {skill.name!r} not projected: {harness} cannot install a skill by bare "
                "name; give it as git_skill(...) instead",
            )
    for plugin in projection.plugins:
        await run.install_plugin(plugin)
    # Before the marker exists: an interrupted projection runs again, and the agent starts only after.
    await hide_from_git(handle, root, run.own_paths())
    await handle.fs.write(projection.marker_path, "")


class _Run:
    """One projection call: the handle, the target and what was resolved, for masking."""

    def __init__(
        self,
        handle: SandboxHandle,
        projection: WorkspaceProjection,
        harness: str,
        target: _Target,
        root: str,
        logger: logging.Logger,
        executable: Sequence[str] = ("claude",),
    ) -> None:
        self.handle = handle
        self.executable = tuple(executable)
        self.projection = projection
        self.harness = harness
        self.target = target
        self.root = root
        self.logger = logger
        self.resolved: set[str] = set()
        self.linked: dict[str, str] = {}
        self.written: list[str] = []  # files and links this projection made in the workspace

    def own_paths(self) -> list[str]:
        """What this projection put in the worktree, as root-anchored git exclude patterns."""
        patterns = [f"/{PROJECTION_MARKER_PREFIX}*"]  # every hash's: a changed workspace leaves the old marker
        for path in self.written:
            if path.startswith(self.root.rstrip("/") + "/"):
                patterns.append("/" + posixpath.relpath(path, self.root))
        return patterns

    def warn(self, item: str, message: str) -> None:
        _warn_once(self.logger, self.handle, self.harness, item, self._mask(message))

    def _mask(self, text: str) -> str:
        # Command output quoted in a warning could echo a secret. `redact` knows every value resolved
        # through secrets.py; the header values are masked here too, whoever resolved them.
        for value in sorted(self.resolved, key=len, reverse=True):
            if value:
                text = text.replace(value, "***")
        return redact(text)

    def _path(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}"

    async def write_mcp_config(self) -> None:
        servers: dict[str, McpServer] = {}
        for skill in self.projection.skills:
            if isinstance(skill, McpSkill):
                server = self._server(skill)
                if server is not None:
                    servers[skill.name] = server
        if not servers:
            return
        path = self._path(self.target.mcp_file)
        existing: str | None = None
        readable = True
        if await self.handle.fs.exists(path):
            try:
                existing = await self.handle.fs.read(path)
            except UnicodeDecodeError:
                readable = False
        text, parsed = self.target.render(existing, servers)
        if not (readable and parsed):
            self.warn(
                f"config:{path}",
                f"{self.harness}: {path} could not be parsed; rewritten with only the workspace MCP servers",
            )
        await self.handle.fs.write(path, text)
        self.written.append(path)

    def _server(self, skill: McpSkill) -> McpServer | None:
        url = skill.config.get("url")
        if not isinstance(url, str) or not url:
            # An entry without a url can make a CLI reject its whole config file.
            self.warn(f"mcp:{skill.name}", f"{self.harness}: MCP server {skill.name!r} not written: it has no url")
            return None
        raw_headers = skill.config.get("headers") or {}
        if not isinstance(raw_headers, Mapping):
            raise TypeError(f"mcp_skill {skill.name!r}: headers must be a mapping, got {type(raw_headers).__name__}")
        headers: dict[str, str] = {}
        for name, value in raw_headers.items():
            if isinstance(value, str):
                headers[str(name)] = value
                continue
            resolved = self.projection.resolve_secret(value)
            self.resolved.update((resolved, resolved.removeprefix("Bearer ")))
            headers[str(name)] = resolved
        return McpServer(url, headers)

    async def link_git_skill(self, skill: GitSkill) -> None:
        clone = git_skill_dir(self.root, skill)
        if self.target.skills_dir is None:
            self.warn(
                f"git-skill:{skill.repo}",
                f"{self.harness}: git skill {skill.repo!r} not linked: {self.harness} has no skills folder; "
                f"it stays cloned at {clone}",
            )
            return
        if not await self.handle.fs.exists(clone):
            self.warn(
                f"git-skill:{skill.repo}",
                f"{self.harness}: git skill {skill.repo!r} not linked: its clone {clone} does not exist",
            )
            return
        folders = await discover_skill_folders(self.handle, clone) or [clone]
        skills_dir = self._path(self.target.skills_dir)
        await self.handle.fs.mkdir(skills_dir)
        for folder in folders:
            await self._link(folder, skills_dir)

    async def _link(self, folder: str, skills_dir: str) -> None:
        name = posixpath.basename(folder.rstrip("/"))
        dest = f"{skills_dir}/{name}"
        taken_by = self.linked.get(name)
        if taken_by is not None:
            self.warn(
                f"skill-folder:{folder}",
                f"{self.harness}: skill folder {folder} not linked: {dest} is already linked to {taken_by}",
            )
            return
        self.linked[name] = folder
        existing = await self.handle.fs.lstat(dest)
        if existing is not None:
            # A link is ours from a projection interrupted before its marker; anything else is the user's.
            if existing.type != "symlink":
                self.warn(
                    f"skill-folder:{folder}",
                    f"{self.harness}: skill folder {folder} not linked: {dest} already exists and is kept",
                )
            return
        source = _link_source(folder, skills_dir, self.root)
        opts = ProcessOptions(cwd=skills_dir)
        linked = await self.handle.process.exec(f"ln -s {quote(source)} {quote(name)}", opts)
        if linked.exit_code == 0:
            self.written.append(dest)
            return
        copied = await self.handle.process.exec(f"cp -r {quote(source)} {quote(name)}", opts)
        if copied.exit_code == 0:
            self.written.append(dest)
        if copied.exit_code != 0:
            self.warn(
                f"skill-folder:{folder}",
                f"{self.harness}: skill folder {folder} not linked into {dest}: ln -s exited {linked.exit_code}, "
                f"cp -r exited {copied.exit_code}: {_tail(copied.stderr or linked.stderr)}",
            )

    async def install_plugin(self, plugin: str) -> None:
        if not self.target.installs_plugins:
            self.warn(
                f"plugin:{plugin}",
                f"{self.harness}: plugin {plugin!r} not installed: {self.harness} has no plugin concept",
            )
            return
        opts = ProcessOptions(cwd=self.root, signal=AbortSignal.timeout(PLUGIN_INSTALL_TIMEOUT_S))
        try:
            command = " ".join(quote(part) for part in (*self.executable, "plugin", "install", plugin))
            result = await self.handle.process.exec(command, opts)
        except Exception as exc:  # best effort, as a failed install is: a plugin never fails the run
            self.warn(f"plugin:{plugin}", f"{self.harness}: plugin {plugin!r} not installed: {exc}")
            return
        if result.exit_code != 0:
            self.warn(
                f"plugin:{plugin}",
                f"{self.harness}: plugin {plugin!r} not installed: `claude plugin install` exited "
                f"{result.exit_code}: {_tail(result.stderr or result.stdout)}",
            )


def _link_source(folder: str, skills_dir: str, root: str) -> str:
    """The link target as the shell in ``skills_dir`` must see it.

    Relative inside the workspace: a provider's shell may see the workspace at a
    different path than ``/workspace`` (local-process runs in its host
    directory), and a relative link also survives a fork or copy of the tree.
    """
    inside = root == "/" or folder == root or folder.startswith(root + "/")
    return posixpath.relpath(folder, skills_dir) if inside else folder


def _tail(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


async def discover_skill_folders(handle: SandboxHandle, top: str) -> list[str]:
    """Folders under ``top`` holding a ``SKILL.md`` (any case), sorted; ``[]`` when there is none (R22).

    A folder holding one is a skill and is not searched further; dot-folders and
    ``node_modules`` are skipped; folders deeper than ``MAX_SKILL_DEPTH`` below
    ``top`` are not looked at. Symlinked folders are not followed (no cycles).
    """
    found: list[str] = []

    async def walk(path: str, depth: int) -> None:
        try:
            entries = await handle.fs.list(path)
        except (OSError, ValueError, BoxwrightError):
            return
        if any(e.type == "file" and e.name.lower() == SKILL_FILE for e in entries):
            found.append(path)
            return
        if depth >= MAX_SKILL_DEPTH:
            return
        children = [
            e.path for e in entries if e.type == "dir" and not e.name.startswith(".") and e.name != "node_modules"
        ]
        await asyncio.gather(*(walk(child, depth + 1) for child in children))

    await walk(top.rstrip("/") or "/", 0)
    return sorted(found)


# -- a small TOML writer --------------------------------------------------------------------------


class InlineTable(dict[str, Any]):
    """A table ``toml_dumps`` writes inline (``{ "k" = "v" }``) instead of as a ``[section]``."""


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_dumps(doc: Mapping[str, Any]) -> str:
    """TOML 1.0 text for ``doc``: what ``tomllib.loads`` returns reads back equal.

    Values: str, bool, int, float, datetime/date/time, lists, dicts. A dict is a
    ``[section]`` (an ``InlineTable`` or a dict inside a list is written inline);
    a non-empty list of plain dicts is an array of tables (``[[section]]``).
    """
    lines: list[str] = []
    _emit_table(lines, (), doc, array=False)
    return "\n".join(lines) + "\n" if lines else ""


def _is_section(value: object) -> bool:
    return isinstance(value, dict) and not isinstance(value, InlineTable)


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_section(v) for v in value)


def _emit_table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any], *, array: bool) -> None:
    plain = [(k, v) for k, v in table.items() if not _is_section(v) and not _is_table_array(v)]
    sections = [(k, v) for k, v in table.items() if _is_section(v)]
    arrays = [(k, v) for k, v in table.items() if _is_table_array(v)]
    # A table holding only sub-tables needs no header of its own: `[a.b]` defines `a` too.
    if path and (array or plain or not (sections or arrays)):
        if lines:
            lines.append("")
        header = ".".join(_toml_key(p) for p in path)
        lines.append(f"[[{header}]]" if array else f"[{header}]")
    for key, value in plain:
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in sections:
        _emit_table(lines, (*path, key), value, array=False)
    for key, items in arrays:
        for item in items:
            _emit_table(lines, (*path, key), item, array=True)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write a {type(value).__name__} as TOML")
