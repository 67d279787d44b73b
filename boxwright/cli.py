"""The ``boxwright`` command."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import sys
from collections.abc import Sequence

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boxwright", description="Run coding agents in sandboxes.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="which providers and agent CLIs this machine can use, and why not")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
