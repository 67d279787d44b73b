"""An agent CLI installed outside /usr runs under bubblewrap with no binds given, and its diff is only its work.

The real `claude` lives in /opt/boxwright-agents (npm's .bin/claude is a link into node_modules), the
origin repository and a git skill are host directories under the host's /tmp (which the sandbox
replaces with its own): nothing of them is visible unless boxwright binds it. The fake model scripts
one Bash call that edits a tracked file and adds a new one; the diff must name exactly those two files,
never the projection marker, the skill clone or the skill link boxwright put in the workspace.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, define_sandbox
from boxwright.events import CustomEvent, Event, RunErrorEvent, RunFinishedEvent, TextMessageContentEvent, decode_ndjson
from boxwright.harnesses.claude_code import claude_code
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace, git_skill, git_source
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.require import AGENT_BIN, agent_cli, missing

ROOT = Path(__file__).resolve().parents[2]
EDIT = "sed -i 's/hello/hello from claude/' README.md && printf 'new\\n' > NOTES.md"
SCRIPT = {"edit": [ToolCall("Bash", {"command": EDIT, "description": "edit"}), Text("I edited it.")]}
PROMPT = "[[script:edit]] change the greeting and add notes"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    _git(path, "add", ".")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
    return path


@pytest.fixture
def claude() -> str:
    found = agent_cli("claude")
    if os.path.realpath(found).startswith("/usr/"):
        missing(f"claude resolves into /usr ({os.path.realpath(found)}): this test needs it installed elsewhere")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    return found


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(SCRIPT) as server:
        yield server


def _diff_files(diff: str) -> list[str]:
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", diff, re.MULTILINE)))


def test_run_agent_runs_claude_installed_outside_usr_with_no_binds(
    tmp_path: Path, model: FakeModelServer, claude: str
) -> None:
    origin = _repo(tmp_path / "origin", {"README.md": "hello\n"})
    skill = _repo(tmp_path / "greeter", {"greet/SKILL.md": "---\nname: greet\ndescription: greets\n---\nSay hi.\n"})
    workspace = define_workspace(source=git_source(f"file://{origin}"), skills=[git_skill(str(skill))])
    sandbox = define_sandbox("anywhere", bubblewrap_sandbox(base_dir=tmp_path / "sandboxes"), workspace)
    store = MemoryInstanceStore()
    host_env = {
        "PATH": f"{os.path.dirname(claude)}:/usr/bin:/bin",
        "ANTHROPIC_BASE_URL": model.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
    }

    async def main() -> tuple[list[Event], str]:
        harness = claude_code("claude-sonnet-4-5", env={"CLAUDE_CODE_MAX_RETRIES": "0"})
        events = [
            e
            async for e in run_agent(
                sandbox, harness, PROMPT, thread_id="t", run_id="r", store=store, host_env=host_env
            )
        ]
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t", run_id="r-check", store=store))
        assert again is not None
        # What the agent's own `git status` shows: its work only.
        status = await again.handle.process.exec("git status --porcelain --untracked-files=all")
        await again.handle.destroy()
        return events, status.stdout

    events, status = asyncio.run(main())
    errors = [e for e in events if isinstance(e, RunErrorEvent)]
    assert not errors, errors
    assert isinstance(events[-1], RunFinishedEvent)
    assert "I edited it." in "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1
    assert _diff_files(changed[0].value["diff"]) == ["NOTES.md", "README.md"], changed[0].value["diff"]
    assert sorted(line[3:] for line in status.splitlines()) == ["NOTES.md", "README.md"], status


def test_boxwright_run_on_bubblewrap_finds_claude_outside_usr(
    tmp_path: Path, model: FakeModelServer, claude: str
) -> None:
    origin = _repo(tmp_path / "origin", {"README.md": "hello\n"})
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{AGENT_BIN}:{os.environ['PATH']}",
        "ANTHROPIC_BASE_URL": model.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "BOXWRIGHT_DB": str(tmp_path / "boxwright.db"),
    }
    args = ["run", PROMPT, "--provider", "bubblewrap", "--repo", str(origin), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "boxwright.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    events = decode_ndjson(done.stdout)
    assert isinstance(events[-1], RunFinishedEvent)
    diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
    assert _diff_files(diff) == ["NOTES.md", "README.md"], diff
    assert "+hello from claude" in diff


def test_an_executable_that_cannot_run_names_its_host_path_and_how_to_bind(tmp_path: Path) -> None:
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    bin_dir = tmp_path / "tools" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "claude"
    # Runs (it is bound), but what it runs lives in a host directory the sandbox does not see.
    fake.write_text(f'#!/bin/sh\nexec {tmp_path}/elsewhere/claude-real "$@"\n')
    fake.chmod(0o755)
    (tmp_path / "elsewhere").mkdir()
    sandbox = define_sandbox("hint", bubblewrap_sandbox(base_dir=tmp_path / "sandboxes"))

    async def run(path: str) -> RunErrorEvent:
        events = [
            e
            async for e in run_agent(sandbox, claude_code(), "hi", thread_id=f"t-{len(path)}", host_env={"PATH": path})
        ]
        error = events[-1]
        assert isinstance(error, RunErrorEvent), events
        return error

    found = asyncio.run(run(f"{bin_dir}:/usr/bin:/bin"))
    assert found.code == "executable_not_found"
    assert f"it is at {fake} on the host" in found.message and "ro_binds=[" in found.message, found.message
    nowhere = asyncio.run(run("/usr/bin:/bin"))
    assert nowhere.code == "executable_not_found"
    assert "not on the host's PATH either" in nowhere.message and "npm install" in nowhere.message, nowhere.message


def test_a_workspace_plugin_is_installed_by_the_same_cli_the_run_starts(tmp_path: Path) -> None:
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    fake = tmp_path / "tools" / "bin" / "claude"
    fake.parent.mkdir(parents=True)
    # Installed outside /usr: `claude plugin install` by bare name could not find it in the sandbox.
    fake.write_text('#!/bin/sh\nif [ "$1" = plugin ]; then echo "$@" >> /tmp/plugin-calls; fi\n')
    fake.chmod(0o755)
    workspace = define_workspace(plugins=["greeter@market"])
    sandbox = define_sandbox("plugins", bubblewrap_sandbox(base_dir=tmp_path / "sandboxes"), workspace)
    store = MemoryInstanceStore()

    async def main() -> str:
        stream = run_agent(
            sandbox, claude_code(), "hi", thread_id="t", run_id="r", store=store, host_env={"PATH": str(fake.parent)}
        )
        _ = [e async for e in stream]
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t", run_id="r-check", store=store))
        assert again is not None
        try:
            return await again.handle.fs.read("/tmp/plugin-calls")
        finally:
            await again.handle.destroy()

    assert asyncio.run(main()) == "plugin install greeter@market\n"


def test_a_host_repository_a_sandbox_cannot_be_shown_is_named_with_what_to_do(tmp_path: Path) -> None:
    plain = tmp_path / "not-a-repo"
    plain.mkdir()
    # local-process cannot be given binds (it needs none): a failed clone of a host path says what to try.
    workspace = define_workspace(source=git_source(f"file://{plain}"))
    sandbox = define_sandbox("hint", local_process_sandbox(base_dir=tmp_path / "sandboxes"), workspace)

    async def main() -> RunErrorEvent:
        events = [e async for e in run_agent(sandbox, claude_code(), "hi", thread_id="t")]
        assert isinstance(events[-1], RunErrorEvent), events
        return events[-1]

    error = asyncio.run(main())
    assert f"the host directory {plain} may not be visible" in error.message, error.message
    assert f"local_source({str(plain)!r})" in error.message, error.message
