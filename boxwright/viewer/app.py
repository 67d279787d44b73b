"""The run viewer's routes and the run factory behind its Start form.

``viewer_routes(config)`` serves the page (``GET /``), its two assets and ``viewer/config.json``
(which agents and sandboxes the form offers). The page talks to the service core's own routes
(``POST /runs``, the SSE tail, cancel, approval) relative to where it is mounted, or under
``config.api_base``. Mount it next to ``sandbox_routes`` in any app, or serve it at ``/`` of a
coordinator: ``routes=[*sandbox_routes(service), *viewer_routes()]``.

``ViewerRuns`` is a run factory reading the form's ``metadata`` (``harness``, ``provider``,
``repo``): the built-in demo agent (``boxwright.viewer.demo``) offline, or Claude Code where its
CLI and a credential are present.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from boxwright.auth import HARNESS_KEY_ENV
from boxwright.definition import SandboxDefinition, define_sandbox
from boxwright.harnesses.base import Harness
from boxwright.middleware.approvals import ApprovalDesk, ask_person_tool
from boxwright.middleware.service import RunSpec, StartRunRequest
from boxwright.sandbox import SandboxProvider
from boxwright.tool_bridge.tools import Tool
from boxwright.workspace import Workspace, define_workspace, git_source, local_source

from .demo import DEFAULT_PACE_S, DEMO_HARNESS, DEMO_POLICY, demo_harness, ensure_demo_repo, house_style

ASSETS: Final = {"viewer.css": "text/css; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8"}
CLAUDE: Final = "claude-code"
AGENT_BIN: Final = "/opt/boxwright-agents/node_modules/.bin"


class HarnessOption(msgspec.Struct, rename="camel", kw_only=True):
    name: str
    label: str
    available: bool = True
    reason: str = ""


class ProviderOption(msgspec.Struct, rename="camel", kw_only=True):
    name: str
    label: str


class ViewerConfig(msgspec.Struct, rename="camel", kw_only=True):
    """What the page offers; ``api_base`` is where the service's routes are, relative to the page ("" = beside it)."""

    harnesses: list[HarnessOption] = msgspec.field(default_factory=list)
    providers: list[ProviderOption] = msgspec.field(default_factory=list)
    default_harness: str = DEMO_HARNESS
    api_base: str = ""


def claude_option() -> HarnessOption:
    """Claude Code, available when its CLI is found and a key or its own login is there (never read)."""
    found = shutil.which("claude") or shutil.which("claude", path=AGENT_BIN)
    if found is None:
        return HarnessOption(
            name=CLAUDE, label="Claude Code", available=False, reason="no `claude` CLI on this server."
        )
    keys = [*HARNESS_KEY_ENV[CLAUDE], "CLAUDE_CODE_OAUTH_TOKEN"]
    config_dir = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")
    login = os.path.join(config_dir, ".credentials.json")
    if any(os.environ.get(key) for key in keys) or (os.path.isfile(login) and os.path.getsize(login) > 0):
        return HarnessOption(name=CLAUDE, label="Claude Code")
    return HarnessOption(
        name=CLAUDE, label="Claude Code", available=False, reason="no model key (ANTHROPIC_API_KEY) and no login."
    )


def detect_config(*, api_base: str = "") -> ViewerConfig:
    """The demo agent always; Claude Code when usable (then the default); the host's sandboxes."""
    claude = claude_option()
    providers = [ProviderOption(name="local", label="local process")]
    if shutil.which("bwrap"):
        providers.append(ProviderOption(name="bubblewrap", label="bubblewrap"))
    if shutil.which("docker"):
        providers.append(ProviderOption(name="docker", label="Docker"))
    return ViewerConfig(
        harnesses=[HarnessOption(name=DEMO_HARNESS, label="demo agent (offline)"), claude],
        providers=providers,
        default_harness=CLAUDE if claude.available else DEMO_HARNESS,
        api_base=api_base,
    )


def profiles_config(
    harnesses: Iterable[str], sandboxes: Iterable[str], *, default_harness: str | None = None, api_base: str = ""
) -> ViewerConfig:
    """The page's choices for a coordinator: its harness and sandbox profile names (the form sends them as
    ``metadata.harness`` and ``metadata.sandbox``)."""
    names = list(harnesses)
    return ViewerConfig(
        harnesses=[HarnessOption(name=name, label=name) for name in names],
        providers=[ProviderOption(name=name, label=name) for name in sandboxes],
        default_harness=default_harness or (names[0] if names else DEMO_HARNESS),
        api_base=api_base,
    )


def _asset(name: str) -> str:
    return resources.files("boxwright.viewer").joinpath("static", name).read_text()


def viewer_routes(config: ViewerConfig | None = None) -> list[BaseRoute]:
    """``GET /`` (the page), ``GET /viewer/viewer.css|viewer.js``, ``GET /viewer/config.json``.

    ``config`` defaults to ``detect_config()`` (read once, here).
    """
    settings = config if config is not None else detect_config()
    # Read once: the package's files do not change under a running server.
    page = _asset("index.html")
    assets = {name: _asset(name) for name in ASSETS}
    encoded = msgspec.json.encode(settings)

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "config.json":
            return Response(encoded, media_type="application/json", headers={"Cache-Control": "no-store"})
        if name not in assets:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(assets[name], media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    return [Route("/", index, methods=["GET"]), Route("/viewer/{name}", asset, methods=["GET"])]


def _workspace(repo: str) -> Workspace:
    if "://" in repo or repo.startswith("git@"):
        return define_workspace(source=git_source(repo))
    path = os.path.abspath(os.path.expanduser(repo))
    if not os.path.isdir(path):
        raise ValueError(f"repo {repo!r} is neither a git URL nor a directory on this server")
    if os.path.isdir(os.path.join(path, ".git")):
        return define_workspace(source=git_source(f"file://{path}"))
    return define_workspace(source=local_source(path))


@dataclass
class ViewerRuns:
    """The run factory of the page's form: ``metadata`` ``{harness, provider, repo?}`` -> a ``RunSpec``.

    ``tools`` are the app's host tools (the demo agent calls the first); every run also gets
    ``ask_person`` on ``desk``, the service's approval desk. A finished run's sandbox stays, as
    any thread's does (``boxwright gc`` sweeps old ones); Stop destroys it.
    """

    desk: ApprovalDesk
    demo_repo: Path
    tools: Sequence[Tool] = (house_style,)
    sandbox_base: str | None = None
    pace_s: float = DEFAULT_PACE_S
    model: str | None = None
    # The Claude Code harness to run (default: ``claude_code(model)``, the CLI the PATH finds).
    claude: Harness | None = None
    _providers: dict[str, SandboxProvider] = field(default_factory=dict)

    def _provider(self, name: str) -> SandboxProvider:
        if name not in self._providers:
            from boxwright.providers import bubblewrap_sandbox, docker_sandbox, local_process_sandbox

            if name == "local":
                self._providers[name] = local_process_sandbox(base_dir=self.sandbox_base)
            elif name == "bubblewrap":
                self._providers[name] = bubblewrap_sandbox()
            elif name == "docker":
                from boxwright.docker_doctor import RUNNER_IMAGE

                self._providers[name] = docker_sandbox(RUNNER_IMAGE)
            else:
                raise ValueError(f"provider is local, bubblewrap or docker, not {name!r}")
        return self._providers[name]

    def __call__(self, start: StartRunRequest) -> RunSpec:
        metadata: dict[str, Any] = start.metadata or {}
        harness_name = str(metadata.get("harness") or DEMO_HARNESS)
        provider = self._provider(str(metadata.get("provider") or "local"))
        repo = metadata.get("repo")
        if repo is not None and not isinstance(repo, str):
            raise ValueError("metadata.repo is a git URL or a directory path")
        tools = list(self.tools)
        if harness_name == DEMO_HARNESS:
            workspace = _workspace(repo) if repo else _workspace(str(ensure_demo_repo(self.demo_repo)))
            sandbox: SandboxDefinition = define_sandbox("viewer-demo", provider, workspace, DEMO_POLICY)
            harness: Any = demo_harness(tool=tools[0] if tools else house_style, pace_s=self.pace_s)
            if not tools:
                tools = [house_style]
            tools.append(ask_person_tool(self.desk, DEMO_POLICY, provider=DEMO_HARNESS))
            return RunSpec(sandbox=sandbox, harness=harness, tools=tools)
        if harness_name == CLAUDE:
            from boxwright.harnesses.claude_code import claude_code

            workspace = _workspace(repo) if repo else _workspace(str(ensure_demo_repo(self.demo_repo)))
            sandbox = define_sandbox("viewer-claude", provider, workspace)
            harness = self.claude if self.claude is not None else claude_code(self.model)
            return RunSpec(sandbox=sandbox, harness=harness, tools=tools or None)
        raise ValueError(f"harness is {DEMO_HARNESS} or {CLAUDE}, not {harness_name!r}")


__all__ = [
    "HarnessOption",
    "ProviderOption",
    "ViewerConfig",
    "ViewerRuns",
    "claude_option",
    "detect_config",
    "profiles_config",
    "viewer_routes",
]
