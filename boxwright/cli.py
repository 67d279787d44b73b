"""The ``boxwright`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import msgspec


class Check(msgspec.Struct):
    kind: str
    name: str
    ok: bool
    detail: str


# Names a user of other sandbox libraries looks for: listed so that doctor says plainly they are not here yet.
NOT_SUPPORTED_YET = tuple(("provider", name) for name in ("vercel", "sprites"))
NOT_SUPPORTED = "not supported yet: boxwright has no provider or harness for it"


def _claude_login(home: str) -> str | None:
    """Where the Claude Code CLI keeps its own login, when it has one (never read: only its presence)."""
    config = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude")
    credentials = os.path.join(config, ".credentials.json")
    return credentials if os.path.isfile(credentials) and os.path.getsize(credentials) > 0 else None


def _claude_auth_check() -> Check:
    """A model key or a CLI login: the run fails at the first model call without one. Never prints a key."""
    from .auth import HARNESS_KEY_ENV

    keys = [name for name in HARNESS_KEY_ENV["claude-code"] if os.environ.get(name)]
    login = _claude_login(os.path.expanduser("~"))
    if keys:
        via_login = f"; a login in {login} too" if login else ""
        return Check("agent-auth", "claude-code", True, f"model key in ${keys[0]} (passed to the agent){via_login}")
    if os.environ.get("CLAUDE_CODE_OAUTH_TOKEN"):
        return Check("agent-auth", "claude-code", True, "login token in $CLAUDE_CODE_OAUTH_TOKEN")
    if login:
        return Check(
            "agent-auth",
            "claude-code",
            True,
            f"the CLI's own login in {login} (local-process runs see it; a bubblewrap sandbox has its own "
            "HOME, so set ANTHROPIC_API_KEY for those)",
        )
    return Check(
        "agent-auth",
        "claude-code",
        False,
        "no model key and no login: set ANTHROPIC_API_KEY, or run `claude` once and log in",
    )


def _cli_check(name: str, binary: str, package: str) -> Check:
    local = os.path.join(os.getcwd(), "node_modules", ".bin", binary)
    found = shutil.which(binary) or (local if os.access(local, os.X_OK) else None)
    if found:
        return Check("agent-cli", name, True, found)
    return Check("agent-cli", name, False, f"`{binary}` not found on PATH; npm install {package}")


def _cli_version_check(name: str, binary: str, package: str) -> Check:
    """The binary (as ``_cli_check`` finds it) and the version it reports; a CLI that cannot say is a failure."""
    found = _cli_check(name, binary, package)
    if not found.ok:
        return found
    try:
        done = subprocess.run([found.detail, "--version"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("agent-cli", name, False, f"{found.detail} did not answer --version: {exc}")
    version = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or ["?"]
    if done.returncode != 0:
        return Check("agent-cli", name, False, f"{found.detail} --version exited {done.returncode}: {version[0]}")
    return Check("agent-cli", name, True, f"{found.detail} ({version[0]})")


def _key_or_login_check(name: str, keys: Sequence[str], login: str, hint: str) -> Check:
    """A model key in the env (named, never printed) or the CLI's own login file (only its presence)."""
    present = [key for key in keys if os.environ.get(key)]
    if present:
        return Check("agent-auth", name, True, f"model key in ${present[0]} (passed to the agent)")
    if os.path.isfile(login) and os.path.getsize(login) > 0:
        return Check("agent-auth", name, True, f"the CLI's own login in {login} (local-process runs see it)")
    return Check("agent-auth", name, False, hint)


def _codex_auth_check() -> Check:
    from .auth import HARNESS_KEY_ENV

    home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    return _key_or_login_check(
        "codex",
        HARNESS_KEY_ENV["codex"],
        os.path.join(home, "auth.json"),
        "no model key and no login: set CODEX_API_KEY, or run `codex login`",
    )


def _gemini_auth_check() -> Check:
    return _key_or_login_check(
        "gemini",
        ("GEMINI_API_KEY",),
        os.path.join(os.path.expanduser("~"), ".gemini", "oauth_creds.json"),
        "no model key and no login: set GEMINI_API_KEY, or run `gemini` once and log in",
    )


def _grok_checks() -> list[Check]:
    """Grok Build is on no npm registry: found on PATH or where its installer puts it ($HOME/.grok/bin)."""
    from .auth import HARNESS_KEY_ENV

    installed = os.path.join(os.path.expanduser("~"), ".grok", "bin", "grok")
    found = shutil.which("grok") or (installed if os.access(installed, os.X_OK) else None)
    cli = (
        Check("agent-cli", "grok-build", True, found)
        if found
        else Check("agent-cli", "grok-build", False, "`grok` not found on PATH or in ~/.grok/bin; install Grok Build")
    )
    keys = [k for k in HARNESS_KEY_ENV["grok-build"] if os.environ.get(k)]
    auth = (
        Check("agent-auth", "grok-build", True, f"model key in ${keys[0]} (passed to the agent)")
        if keys
        else Check("agent-auth", "grok-build", False, "no model key: set XAI_API_KEY (or GROK_API_KEY)")
    )
    return [cli, auth]


def _opencode_auth_check() -> Check:
    from .auth import OPENCODE_KEY_ENV

    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return _key_or_login_check(
        "opencode",
        OPENCODE_KEY_ENV,
        os.path.join(data, "opencode", "auth.json"),
        "no model key and no login: set OPENAI_API_KEY, or run `opencode auth login`",
    )


def doctor_checks() -> list[Check]:
    from .providers.bubblewrap import describe_posture, probe

    bwrap = probe()
    checks = [
        Check("provider", "local-process", True, "always available (no isolation: trusted work only)"),
        Check(
            "provider",
            "bubblewrap",
            bwrap.available,
            (
                f"network deny: {'yes' if bwrap.network_deny else 'no'}, "
                f"kill reaches children: {'yes' if bwrap.killable else 'no'}; {describe_posture(bwrap.posture)}"
            )
            if bwrap.available
            else bwrap.reason,
        ),
        *_docker_checks(),
        *_cloud_checks(),
        _cli_check("claude-code", "claude", "@anthropic-ai/claude-code"),
        _claude_auth_check(),
        _cli_version_check("codex", "codex", "@openai/codex"),
        _codex_auth_check(),
        _cli_version_check("opencode", "opencode", "opencode-ai"),
        _opencode_auth_check(),
        _cli_version_check("gemini", "gemini", "@google/gemini-cli"),
        _gemini_auth_check(),
        *_grok_checks(),
        # ACP agents (--harness acp:<command>): presence only, since `--version` would start the stdio server.
        _cli_check("acp:claude-agent-acp", "claude-agent-acp", "@zed-industries/claude-agent-acp"),
        _cli_check("acp:codex-acp", "codex-acp", "@zed-industries/codex-acp"),
        *(Check(kind, name, False, NOT_SUPPORTED) for kind, name in NOT_SUPPORTED_YET),
    ]
    return checks


def _docker_checks() -> list[Check]:
    """Whether a Docker engine answers, and whether the runner image is built (never pulled)."""
    from .docker_doctor import docker_checks

    return [Check(kind, name, ok, detail) for kind, name, ok, detail in docker_checks()]


def _cloud_checks() -> list[Check]:
    """Each cloud provider: its SDK installed, its credential variables set (named, never shown)."""
    from .cloud_doctor import cloud_checks

    return [Check(kind, name, ok, detail) for kind, name, ok, detail in cloud_checks()]


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = doctor_checks()
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(checks) + b"\n")
        return 0
    for kind, title in (("provider", "providers"), ("agent-cli", "agent CLIs"), ("agent-auth", "agent logins")):
        print(f"{title}:")
        for c in (c for c in checks if c.kind == kind):
            mark = "ok " if c.ok else "-- " if c.detail == NOT_SUPPORTED else "no "
            print(f"  {mark} {c.name:14s} {c.detail}")
    return 0


# -- run ---------------------------------------------------------------------------------------------


def _usage_error(message: str) -> NoReturn:
    # One line and exit 2, as argparse does for a bad option: a traceback tells a user nothing.
    print(f"boxwright: {message}", file=sys.stderr)
    raise SystemExit(2)


def _load_tools(spec: str) -> list[Any]:
    """``MODULE:ATTR``: a list of tools or typed functions, one ``@tool``, or a function returning a list."""
    from .errors import ToolDefinitionError
    from .tool_bridge.tools import Tool, as_tools

    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        _usage_error(f"--tools takes MODULE:ATTR (e.g. myapp.tools:TOOLS), got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            _usage_error(f"--tools {spec}: no module named {exc.name!r} (looked in the current directory and sys.path)")
        _usage_error(f"--tools {spec}: importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    except Exception as exc:
        _usage_error(f"--tools {spec}: importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    try:
        value = getattr(module, attr)
    except AttributeError:
        _usage_error(f"--tools {spec}: module {module_name!r} has no attribute {attr!r}")
    if isinstance(value, Tool):
        value = [value]
    elif callable(value) and not isinstance(value, type):
        try:
            value = value()
        except Exception as exc:
            _usage_error(f"--tools {spec}: calling {attr}() for the list of tools failed: {type(exc).__name__}: {exc}")
        if not isinstance(value, (list, tuple)):
            _usage_error(
                f"--tools {spec}: {attr}() returned a {type(value).__name__}, not a list of tools "
                f"(a function given to --tools is called for the list; to bridge {attr} itself, "
                f"list it: TOOLS = [{attr}] and pass {module_name}:TOOLS)"
            )
    try:
        return as_tools(value)
    except ToolDefinitionError as exc:
        _usage_error(f"--tools {spec}: {exc}")


def _workspace(repo: str | None) -> Any:
    from .workspace import define_workspace, git_source, local_source

    if repo is None:
        return None
    if "://" in repo or repo.startswith("git@"):
        return define_workspace(source=git_source(repo))
    path = os.path.abspath(repo)
    if not os.path.isdir(path):
        raise SystemExit(f"--repo {repo!r} is neither a URL nor a directory")
    if os.path.isdir(os.path.join(path, ".git")):
        return define_workspace(source=git_source(f"file://{path}"))
    return define_workspace(source=local_source(path))


def _claude_code_harness(model: str | None) -> Any:
    from .harnesses.claude_code import claude_code

    return claude_code(model)


def _codex_harness(model: str | None) -> Any:
    from .harnesses.codex import codex

    return codex(model)


def _opencode_harness(model: str | None) -> Any:
    from .harnesses.opencode import opencode

    return opencode(model)


def _gemini_harness(model: str | None) -> Any:
    from .harnesses.gemini_cli import gemini_cli

    return gemini_cli(model)


def _grok_harness(model: str | None) -> Any:
    from .harnesses.grok_build import grok_build

    return grok_build(model) if model else grok_build()


# ``--harness NAME``: each entry builds the harness for ``--model`` (None: the CLI's own default).
HARNESSES: dict[str, Callable[[str | None], Any]] = {
    "claude-code": _claude_code_harness,
    "codex": _codex_harness,
    "opencode": _opencode_harness,
    "gemini": _gemini_harness,
    "grok": _grok_harness,
}


def _harness(spec: str, model: str | None) -> Any:
    from .harnesses.command import command_harness

    build = HARNESSES.get(spec)
    if build is not None:
        try:
            return build(model)
        except ValueError as exc:  # e.g. an OpenCode model that is not provider/model
            _usage_error(f"--harness {spec}: {exc}")
    if spec.startswith("command:") and spec[len("command:") :].strip():
        return command_harness(spec[len("command:") :])
    if spec.startswith("acp:") and spec[len("acp:") :].strip():
        from .harnesses.acp import acp

        return acp(spec[len("acp:") :])  # any ACP agent: its command line, split on spaces
    names = ", ".join(HARNESSES)
    raise SystemExit(f"--harness takes one of {names}, acp:<agent command> or command:<shell command>, got {spec!r}")


def _provider(name: str, image: str | None = None) -> Any:
    from .providers import bubblewrap_sandbox, docker_sandbox, local_process_sandbox

    if name == "docker":
        from .docker_doctor import RUNNER_IMAGE

        return docker_sandbox(image or RUNNER_IMAGE)

    if name == "local":
        return local_process_sandbox()
    if name == "bubblewrap":
        return bubblewrap_sandbox()
    raise SystemExit(f"--provider takes local, bubblewrap or docker, got {name!r}")


async def _run(args: argparse.Namespace) -> int:
    from .agent import run_agent
    from .definition import define_sandbox
    from .events import RunErrorEvent, encode_event
    from .stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database
    from .terminal import RunRenderer

    harness = _harness(args.harness, args.model)
    workspace = _workspace(args.repo)
    # No binds of its own: run_agent shows bubblewrap the agent CLI the PATH finds and the workspace
    # shows it a local repository, so a script calling run_agent gets what the command gets.
    sandbox = define_sandbox("cli", _provider(args.provider, args.image), workspace)
    tools = _load_tools(args.tools) if args.tools else None
    thread_id = args.thread or _fresh_thread_id()
    if not args.thread:
        # A fresh thread per run: a second run must not continue in the first one's workspace.
        print(f"new thread {thread_id} (pass --thread {thread_id} to continue it)", file=sys.stderr)
    # The run's RUN_ERROR says why it failed; the agent's log line would say it a second time.
    logging.getLogger("boxwright.agent").addFilter(_said_by_the_run)
    failed = False
    async with open_database(args.db) as db:
        stream = run_agent(
            sandbox,
            harness,
            args.prompt,
            thread_id=thread_id,
            tools=tools,
            store=SqliteInstanceStore(db),
            locks=SqliteLockStore(db),
        )
        async with contextlib.aclosing(stream):  # type: ignore[type-var]  # run_agent is an async generator
            if args.json:
                async for event in stream:
                    sys.stdout.buffer.write(encode_event(event) + b"\n")
                    sys.stdout.buffer.flush()
                    failed = failed or isinstance(event, RunErrorEvent)
            else:
                with RunRenderer() as renderer:
                    async for event in stream:
                        renderer.render(event)
                        failed = failed or isinstance(event, RunErrorEvent)
    return 1 if failed else 0


def _fresh_thread_id() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


def _said_by_the_run(record: logging.LogRecord) -> bool:
    """False for ``run <id> failed: ...``: the command prints that run's RUN_ERROR already."""
    return not str(record.msg).startswith("run %s failed")


def cmd_run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the embedded default: a scripted agent edits a small git repo in a local sandbox."""
    from . import demo_agent

    repo = os.path.abspath(os.path.join(".boxwright", "demo-repo"))
    if not os.path.isdir(os.path.join(repo, ".git")):
        os.makedirs(repo, exist_ok=True)
        with open(os.path.join(repo, "NOTES.md"), "w") as f:
            f.write("# Notes\n")
        for git in (
            ["init", "-q", "-b", "main"],
            ["-c", "user.name=boxwright", "-c", "user.email=demo@boxwright.invalid", "add", "."],
            ["-c", "user.name=boxwright", "-c", "user.email=demo@boxwright.invalid", "commit", "-q", "-m", "notes"],
        ):
            subprocess.run(["git", *git], cwd=repo, check=True)
    agent = f"{shlex.quote(sys.executable)} {shlex.quote(demo_agent.__file__)}"
    run_args = argparse.Namespace(
        prompt=args.prompt,
        repo=repo,
        provider="local",
        harness=f"command:{agent}",
        model=None,
        json=args.json,
        tools=None,
        thread=f"demo-{uuid.uuid4().hex[:8]}",
        db=args.db,
        image=None,
    )
    return cmd_run(run_args)


# -- gc ----------------------------------------------------------------------------------------------


async def _gc(args: argparse.Namespace) -> int:
    from .config import database_path
    from .gc import StoreMissingError, collect_garbage
    from .journal import DEFAULT_JOURNAL_DIR
    from .stores.sqlite import open_database

    async with open_database(args.db or database_path()) as db:
        try:
            result = await collect_garbage(
                db,
                sandbox_dirs=args.sandbox_dir,
                journal_dir=args.journal_dir or DEFAULT_JOURNAL_DIR,
                min_age=args.min_age,
                dry_run=args.dry_run,
            )
        except StoreMissingError as exc:
            print(f"boxwright gc: {exc}", file=sys.stderr)
            return 2
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(result) + b"\n")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for entry in result.removed:
        print(f"{verb} {entry.kind} {entry.path} ({entry.reason})")
    for entry in result.kept if args.verbose else ():
        print(f"kept {entry.kind} {entry.path} ({entry.reason})")
    print(f"{verb} {len(result.removed)}, kept {len(result.kept)}" + ("" if args.verbose else " (-v lists them)"))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    return asyncio.run(_gc(args))


def _serve_coordinator(args: argparse.Namespace) -> int:
    from .coordinator.config import CoordinatorConfig, StoreUrlError
    from .coordinator.demo import demo_coordinator_config, is_loopback
    from .coordinator.serve import (
        CLIENT_TOKEN_ENV,
        STORE_ENV,
        ConfigLoadError,
        load_config,
        serve_coordinator,
        with_overrides,
    )
    from .definition import define_sandbox

    try:
        announce = None
        if args.config:
            config = load_config(args.config)
        elif not args.harness and args.provider == "local" and not (args.store or os.environ.get(STORE_ENV)):
            # The embedded default with nothing configured: the viewer's demo, anonymous on loopback only.
            config = demo_coordinator_config(args.db, model=args.model)
            if not os.environ.get(CLIENT_TOKEN_ENV):
                if not is_loopback(args.host):
                    raise ValueError(
                        f"the demo coordinator allows anonymous clients on loopback only, not on {args.host}: "
                        f"bind 127.0.0.1, or set ${CLIENT_TOKEN_ENV} (the page then needs a cookie-reading "
                        "authorize hook in a --config: EventSource sends no bearer token)"
                    )
                args.allow_anonymous = True
            offered = ", ".join(config.harnesses)
            announce = (
                f"boxwright viewer: {{url}}  (harnesses: {offered}; "
                + ("anonymous clients, loopback only; " if args.allow_anonymous else "")
                + "Ctrl-C stops it)"
            )
        else:
            harnesses = {spec: _harness(spec, args.model) for spec in args.harness or ["claude-code"]}
            sandbox = define_sandbox("coordinator", _provider(args.provider, args.image))
            config = CoordinatorConfig(sandboxes={args.provider: sandbox}, harnesses=harnesses)
        store = args.store or (f"sqlite:///{os.path.abspath(args.db)}" if args.db else None)
        config = with_overrides(
            config,
            store_url=store,
            public_origin=args.public_origin,
            allow_anonymous=True if args.allow_anonymous else None,
            lease_ttl_ms=args.lease_ms,
            inactivity_timeout=args.inactivity_timeout,
        )
        serve_coordinator(config, args.host, args.port, announce=announce)
    except (ConfigLoadError, StoreUrlError, ValueError) as exc:
        _usage_error(f"serve: {exc}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.streams:
        return _serve_coordinator(args)
    from boxwright.streams.app import StreamsLimits
    from boxwright.streams.serve import serve_streams

    limits = StreamsLimits(long_poll_timeout=args.long_poll_timeout, max_body=args.max_body)
    try:
        serve_streams(args.host, args.port, database=args.db, limits=limits, store=args.store)
    except ValueError as exc:  # a store URL it cannot open
        _usage_error(f"boxwright serve --streams: {exc}")
    return 0


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve", help="serve the coordinator over HTTP (--streams: a bare Durable Streams server instead)"
    )
    serve.add_argument(
        "--streams", action="store_true", help="any path is a Durable Streams stream (stored in --store, or --db)"
    )
    serve.add_argument(
        "--store",
        default=None,
        help="sqlite:///ABS/PATH or redis://HOST[:PORT] (default: $BOXWRIGHT_STORE, embedded SQLite)",
    )
    serve.add_argument("--config", default=None, metavar="MODULE:ATTR", help="a CoordinatorConfig (or a function)")
    serve.add_argument("--provider", default="local", help="without --config: local (default), bubblewrap or docker")
    serve.add_argument("--image", default=None, help="without --config: the Docker image (--provider docker)")
    serve.add_argument("--harness", action="append", help="without --config: a harness (repeatable; claude-code)")
    serve.add_argument("--model", default=None, help="without --config: the harnesses' model")
    serve.add_argument("--public-origin", default=None, help="where sandboxes call back (or $BOXWRIGHT_PUBLIC_ORIGIN)")
    serve.add_argument("--allow-anonymous", action="store_true", help="no client auth (development only)")
    serve.add_argument("--lease-ms", type=int, default=None, help="a dead replica's runs are adopted after this")
    serve.add_argument("--inactivity-timeout", type=float, default=None, metavar="SECONDS", help="0: no watchdog")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4437, help="port (default 4437)")
    serve.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    serve.add_argument(
        "--long-poll-timeout", type=float, default=20.0, metavar="SECONDS", help="how long a long-poll waits (20)"
    )
    serve.add_argument(
        "--max-body", type=int, default=16 * 1024 * 1024, metavar="BYTES", help="larger appends get 413 (16 MiB)"
    )
    serve.set_defaults(func=cmd_serve)


def cmd_runner(args: argparse.Namespace) -> int:
    from .runner.__main__ import main as runner_main

    return runner_main(args.runner_args)


def cmd_reap(args: argparse.Namespace) -> int:
    import asyncio

    from .docker_reap import sweep_docker
    from .errors import ProviderUnavailableError

    cloud = [name for name in args.provider or () if name != "docker"]
    if cloud:
        if "docker" in (args.provider or ()):
            _usage_error("reap docker and the cloud providers in two calls (their results differ)")
        return _reap_cloud(cloud, args)

    try:
        found = asyncio.run(sweep_docker(dry_run=not args.yes, label=args.label))
    except ProviderUnavailableError as exc:
        _usage_error(str(exc))
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(found) + b"\n")
    else:
        verb = "removed" if args.yes else "would remove (pass --yes)"
        for c in found.containers:
            state = f"error: {c.error}" if c.error else verb
            print(f"container {c.id[:12]}  {c.reason:13s}  run={c.run or '-'}  owner={c.owner or '-'}  {state}")
        for i in found.images:
            state = f"error: {i.error}" if i.error else verb
            name = ",".join(i.tags) or i.id.removeprefix("sha256:")[:12]
            print(f"image {name}  {i.reason:13s}  sandbox={i.sandbox or '-'}  {state}")
        if not found.containers and not found.images:
            print("no boxwright container or image to reap")
    return 1 if any(c.error for c in found.containers) or any(i.error for i in found.images) else 0


def _reap_cloud(names: Sequence[str], args: argparse.Namespace) -> int:
    """Expired cloud sandboxes of this host: destroyed with --yes; live, unleased and foreign ones stay."""
    import asyncio

    from .cloud_reap import provider_named, reap_cloud

    try:
        providers = {name: provider_named(name) for name in dict.fromkeys(names)}
    except ValueError as exc:
        _usage_error(str(exc))
    labels = None
    if args.label:
        key, _, value = args.label.partition("=")
        labels = {key: value}
    found = asyncio.run(reap_cloud(providers, dry_run=not args.yes, labels=labels))
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(found) + b"\n")
    else:
        verb = "destroyed" if args.yes else "would destroy (pass --yes)"
        for s in found.sandboxes:
            state = f"error: {s.error}" if s.error else verb if s.reason == "expired" else "kept"
            print(f"{s.provider} sandbox {s.id}  {s.reason:8s}  {state}")
        for name, why in found.errors.items():
            print(f"{name}: cannot reap: {why}", file=sys.stderr)
        if not found.sandboxes and not found.errors:
            print(f"no boxwright sandbox of this host on {', '.join(providers)}")
    return 1 if found.errors or any(s.error for s in found.sandboxes) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boxwright", description="Run coding agents in sandboxes.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="which providers and agent CLIs this machine can use, and why not")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=cmd_doctor)

    run = sub.add_parser("run", help="run an agent on a prompt in a sandbox and show its work live")
    run.add_argument("prompt")
    run.add_argument("--repo", help="a git URL, a git repository or a directory to work in")
    run.add_argument("--provider", default="local", help="local (default), bubblewrap or docker")
    run.add_argument("--image", default=None, help="the Docker image (--provider docker; default: the runner image)")
    run.add_argument(
        "--harness",
        default="claude-code",
        help="claude-code (default), codex, opencode, gemini, grok, acp:<agent command> or command:<shell command>",
    )
    run.add_argument("--model", help="the model the agent uses")
    run.add_argument("--tools", help="MODULE:ATTR: Python tools to bridge to the agent")
    run.add_argument(
        "--thread", default=None, help="thread id: the same thread resumes its sandbox (default: a new thread)"
    )
    run.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    run.add_argument("--json", action="store_true", help="print NDJSON AG-UI events instead of rendering")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="the main job offline: a scripted agent edits a demo repo, shown live")
    demo.add_argument("prompt", nargs="?", default="Remember to water the plants.")
    demo.add_argument("--json", action="store_true", help="print NDJSON AG-UI events instead of rendering")
    demo.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    demo.set_defaults(func=cmd_demo)
    gc = sub.add_parser("gc", help="remove sandbox folders and run journals that no record owns")
    gc.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    gc.add_argument(
        "--min-age",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="leave what changed more recently than this (default 3600: a run records its sandbox after creating it)",
    )
    gc.add_argument(
        "--sandbox-dir",
        action="append",
        metavar="DIR",
        help="a providers' base directory to sweep (repeatable; default: the local-process and bubblewrap ones)",
    )
    gc.add_argument("--journal-dir", default=None, metavar="DIR", help="the run journal directory to sweep")
    gc.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    gc.add_argument("-v", "--verbose", action="store_true", help="also list what stays, and why")
    gc.add_argument("--json", action="store_true", help="print the result as JSON")
    gc.set_defaults(func=cmd_gc)
    runner = sub.add_parser(
        "runner", help="the in-container runner (co-located mode; its token: the first line of stdin)"
    )
    runner.add_argument("runner_args", nargs=argparse.REMAINDER, help="--host H --port P")
    runner.set_defaults(func=lambda a: __import__("boxwright.runner.__main__", fromlist=["main"]).main(a.runner_args))
    reap = sub.add_parser(
        "reap", help="remove boxwright's leaked Docker containers and images, or cloud sandboxes (dry run by default)"
    )
    reap.add_argument("--yes", action="store_true", help="remove them (default: a dry run that only lists them)")
    reap.add_argument("--json", action="store_true", help="print the result as JSON")
    reap.add_argument("--label", help="only what also carries this label (KEY or KEY=VALUE), e.g. one deployment's")
    reap.add_argument(
        "--provider",
        action="append",
        metavar="NAME",
        help="a cloud provider whose expired sandboxes to destroy (repeatable; configured from its env, as doctor "
        "lists it: e2b, daytona, railway, upstash-box, blaxel, boxd, ...); default: docker",
    )
    reap.set_defaults(func=cmd_reap)
    _add_serve(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
