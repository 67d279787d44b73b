"""The coordinator ``boxwright serve`` runs with no config on the embedded default: the viewer's demo.

A newcomer with no agent CLI and no model key still watches a whole run on the page at ``/``:
the built-in demo harness on a local-process sandbox of a small demo repository, with its host
tools (``house_style`` and ``ask_person``, answered on the page). With ``claude`` and a key (or
its login) Claude Code is offered too, and is the page's default.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from boxwright.config import database_path
from boxwright.definition import define_sandbox
from boxwright.harnesses.base import Harness
from boxwright.middleware.approvals import ApprovalDesk, ask_person_tool
from boxwright.viewer.app import CLAUDE, claude_option
from boxwright.viewer.demo import DEMO_HARNESS, DEMO_POLICY, demo_harness, ensure_demo_repo, house_style
from boxwright.workspace import define_workspace, git_source

from .config import CoordinatorConfig

LOCAL_PROFILE = "local"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def demo_coordinator_config(db: str | os.PathLike[str] | None = None, *, model: str | None = None) -> CoordinatorConfig:
    """The demo harness (and Claude Code when usable) on one local-process profile of the demo repository.

    The repository is made once beside the database file. One approval desk backs both the
    service's approval route and the ``ask_person`` tool, so Allow / Deny on the page answers it.
    """
    path = Path(db if db is not None else database_path()).absolute()
    repo = ensure_demo_repo(path.parent / "viewer-demo-repo")
    from boxwright.providers import local_process_sandbox

    workspace = define_workspace(source=git_source(f"file://{repo}"))
    sandbox = define_sandbox("viewer-demo", local_process_sandbox(), workspace, DEMO_POLICY)
    harnesses: dict[str, Harness] = {}
    if claude_option().available:
        from boxwright.harnesses.claude_code import claude_code

        # First: the page's default is the real agent when it can run.
        harnesses[CLAUDE] = claude_code(model)
    harnesses[DEMO_HARNESS] = demo_harness(tool=house_style)
    desk = ApprovalDesk()
    return CoordinatorConfig(
        sandboxes={LOCAL_PROFILE: sandbox},
        harnesses=harnesses,
        tools=[house_style, ask_person_tool(desk, DEMO_POLICY, provider=DEMO_HARNESS)],
        approvals=desk,
        store_url=f"sqlite:///{path}",
    )


__all__ = ["LOCAL_PROFILE", "demo_coordinator_config", "is_loopback"]
