"""The ``boxwright`` command."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec


class Check(msgspec.Struct):
    kind: str
    name: str
    ok: bool
    detail: str


def _docker_check() -> Check:
    if importlib.util.find_spec("docker") is None:
        return Check(
            "provider", "docker", False, "the `docker` extra is not installed: pip install 'boxwright[docker]'"
        )
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        path = host[len("unix://") :]
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(path)
        except OSError as exc:
            return Check("provider", "docker", False, f"no docker engine answers at {path}: {exc.strerror or exc}")
    return Check("provider", "docker", True, f"engine at {host}")


def _credential_check(name: str, *keys: str, extra: str) -> Check:
    if importlib.util.find_spec(extra) is None:
        return Check("provider", name, False, f"the `{extra}` extra is not installed: pip install 'boxwright[{extra}]'")
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        return Check("provider", name, False, f"needs {', '.join(missing)} in the environment")
    return Check("provider", name, True, "credentials present")


def _cli_check(name: str, binary: str, package: str) -> Check:
    local = os.path.join(os.getcwd(), "node_modules", ".bin", binary)
    found = shutil.which(binary) or (local if os.access(local, os.X_OK) else None)
    if found:
        return Check("agent-cli", name, True, found)
    return Check("agent-cli", name, False, f"`{binary}` not found on PATH; npm install {package}")


def doctor_checks() -> list[Check]:
    from .providers.bubblewrap import probe

    bwrap = probe()
    checks = [
        Check("provider", "local-process", True, "always available (no isolation: trusted work only)"),
        Check(
            "provider",
            "bubblewrap",
            bwrap.available,
            (
                f"network deny: {'yes' if bwrap.network_deny else 'no'}, "
                f"kill reaches children: {'yes' if bwrap.killable else 'no'}"
            )
            if bwrap.available
            else bwrap.reason,
        ),
        _docker_check(),
        _credential_check("e2b", "E2B_API_KEY", extra="e2b"),
        _cli_check("claude-code", "claude", "@anthropic-ai/claude-code"),
        _cli_check("codex", "codex", "@openai/codex"),
        _cli_check("opencode", "opencode", "opencode-ai"),
        _cli_check("grok-build", "grok", "@vibe-kit/grok-cli"),
    ]
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = doctor_checks()
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(checks) + b"\n")
        return 0
    for kind in ("provider", "agent-cli"):
        print(f"{kind}s:")
        for c in (c for c in checks if c.kind == kind):
            print(f"  {'ok ' if c.ok else 'no '} {c.name:14s} {c.detail}")
    return 0


# -- run ---------------------------------------------------------------------------------------------


def _load_tools(spec: str) -> list[Any]:
    """``MODULE:ATTR``: a list of tools, or a function returning one."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--tools takes MODULE:ATTR, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    value = getattr(importlib.import_module(module_name), attr)
    tools = value() if callable(value) and not isinstance(value, (list, tuple)) else value
    return list(tools)


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


def _harness(spec: str, model: str | None) -> Any:
    from .harnesses.claude_code import claude_code
    from .harnesses.command import command_harness

    if spec == "claude-code":
        return claude_code(model)
    if spec.startswith("command:") and spec[len("command:") :].strip():
        return command_harness(spec[len("command:") :])
    raise SystemExit(f"--harness takes claude-code or command:<shell command>, got {spec!r}")


def _provider(name: str, ro_binds: list[str]) -> Any:
    from .providers import bubblewrap_sandbox, local_process_sandbox

    if name == "local":
        return local_process_sandbox()
    if name == "bubblewrap":
        return bubblewrap_sandbox(ro_binds=[b for b in ro_binds if os.path.isdir(b)])
    raise SystemExit(f"--provider takes local or bubblewrap, got {name!r}")


async def _run(args: argparse.Namespace) -> int:
    from .agent import run_agent
    from .definition import define_sandbox
    from .events import RunErrorEvent, encode_event
    from .stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database
    from .terminal import RunRenderer

    harness = _harness(args.harness, args.model)
    workspace = _workspace(args.repo)
    binds = [os.path.abspath(args.repo)] if args.repo and os.path.isdir(args.repo) else []
    executable = getattr(harness, "executable", None)
    if executable and shutil.which(executable):
        binds.append(os.path.dirname(os.path.dirname(os.path.realpath(shutil.which(executable) or ""))))
    sandbox = define_sandbox("cli", _provider(args.provider, binds), workspace)
    tools = _load_tools(args.tools) if args.tools else None
    failed = False
    async with open_database(args.db) as db:
        stream = run_agent(
            sandbox,
            harness,
            args.prompt,
            thread_id=args.thread,
            tools=tools,
            store=SqliteInstanceStore(db),
            locks=SqliteLockStore(db),
        )
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
    )
    return cmd_run(run_args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boxwright", description="Run coding agents in sandboxes.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="which providers and agent CLIs this machine can use, and why not")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=cmd_doctor)

    run = sub.add_parser("run", help="run an agent on a prompt in a sandbox and show its work live")
    run.add_argument("prompt")
    run.add_argument("--repo", help="a git URL, a git repository or a directory to work in")
    run.add_argument("--provider", default="local", help="local (default) or bubblewrap")
    run.add_argument("--harness", default="claude-code", help="claude-code (default) or command:<shell command>")
    run.add_argument("--model", help="the model the agent uses")
    run.add_argument("--tools", help="MODULE:ATTR: Python tools to bridge to the agent")
    run.add_argument("--thread", default="cli", help="thread id: the same thread resumes its sandbox")
    run.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    run.add_argument("--json", action="store_true", help="print NDJSON AG-UI events instead of rendering")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="the main job offline: a scripted agent edits a demo repo, shown live")
    demo.add_argument("prompt", nargs="?", default="Remember to water the plants.")
    demo.add_argument("--json", action="store_true", help="print NDJSON AG-UI events instead of rendering")
    demo.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    demo.set_defaults(func=cmd_demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
