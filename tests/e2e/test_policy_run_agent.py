"""One policy, every harness with a permission hook, the REAL CLIs against the fake model.

``allow echo *, deny rm *, default ask`` gives the same three outcomes on Claude Code (its permission
prompt tool), OpenCode (its permission rules), claude-agent-acp, codex-acp and Gemini CLI (ACP
``session/request_permission``): the allowed command runs, the denied one does not, and the undecided
one does not run and is announced once as ``approval-requested``. Codex and Grok Build have no
permission hook (their modules and the README's harness table say so): a policy maps to their own
sandbox and approval modes only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, define_sandbox
from boxwright.events import CustomEvent, Event
from boxwright.policy import define_sandbox_policy
from boxwright.providers import local_process_sandbox
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace
from tests.fixtures.fake_model import FakeModelServer, Step, Text
from tests.support.agent_harnesses import BINARY, HARNESS_FOR, SHELL_CALL, codex_acp_for
from tests.support.agent_procs import agent_left
from tests.support.require import agent_cli

HOOKED = ["claude", "opencode", "claude-agent-acp", "codex-acp", "gemini"]
PROVIDER_NAME = {"claude": "claude-code"}  # the approval id's provider; the others use the harness name
ALLOWED, DENIED, ASKED = "echo hi > allowed.txt", "rm -f keep.txt", "touch asked.txt"
RUN_TIMEOUT = 180.0  # seconds; a healthy run takes 3-20 s here (Gemini CLI's start is the slow part)


def _run(agent: str, tmp_path: Path, name: str, commands: list[str]) -> tuple[list[Event], list[str]]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    script: list[Step] = [SHELL_CALL[agent](command) for command in commands] + [Text("Done.")]
    with FakeModelServer({"policy": script}) as model:
        binary = agent_cli(BINARY[agent])
        if agent == "codex-acp":
            harness = codex_acp_for(model.base_url, str(home), binary, ask=True)  # ``untrusted``: it asks us
        else:
            harness = HARNESS_FOR[agent](model.base_url, str(home), binary)
        sandbox = define_sandbox(
            "policy",
            local_process_sandbox(base_dir=tmp_path / f"sb-{name}"),
            define_workspace(setup=["echo keep > keep.txt"]),
            policy=define_sandbox_policy(default="ask", allow=["echo *"], deny=["rm *"]),
        )
        store = MemoryInstanceStore()

        async def main() -> tuple[list[Event], list[str]]:
            run = run_agent(sandbox, harness, "[[script:policy]] tidy up", thread_id=f"t-{name}", store=store)
            events = [event async for event in run]
            again = await sandbox.ensure_existing(EnsureContext(thread_id=f"t-{name}", run_id="check", store=store))
            assert again is not None
            present = [n for n in ("allowed.txt", "keep.txt", "asked.txt") if await again.handle.fs.exists(n)]
            await again.handle.destroy()
            return events, present

        return asyncio.run(asyncio.wait_for(main(), RUN_TIMEOUT))


@pytest.mark.parametrize("agent", HOOKED)
def test_allow_deny_and_ask_give_the_same_three_outcomes(agent: str, tmp_path: Path) -> None:
    if agent == "codex-acp":
        # Measured: codex-acp ends its whole turn once a permission is rejected: one refusal per run.
        events, present = _run(agent, tmp_path, "deny", [ALLOWED, DENIED])
        asked_events, asked_present = _run(agent, tmp_path, "ask", [ASKED])
        assert events[-1].type == "RUN_FINISHED" and asked_events[-1].type == "RUN_FINISHED"
        assert "asked.txt" not in asked_present
        events += asked_events
    else:
        events, present = _run(agent, tmp_path, "all", [ALLOWED, DENIED, ASKED])
        assert events[-1].type == "RUN_FINISHED", events[-1]
    assert present[:2] == ["allowed.txt", "keep.txt"], "allowed ran; denied did not"
    assert "asked.txt" not in present, "the undecided command did not run"
    asked = [e for e in events if isinstance(e, CustomEvent) and e.name == "approval-requested"]
    provider = PROVIDER_NAME.get(agent, agent)
    assert [a.value["approvalId"] for a in asked] == [f"{provider}:command:{ASKED}"], asked
    assert agent_left(f"HOME={tmp_path / 'home'}") == []
