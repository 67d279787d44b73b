"""The `boxwright` command, run as a user runs it (a real subprocess, real sandboxes, real stores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from boxwright.events import CustomEvent, RunErrorEvent, RunFinishedEvent, decode_ndjson
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.require import agent_cli

ROOT = Path(__file__).resolve().parents[2]
BOXWRIGHT = [sys.executable, "-m", "boxwright.cli"]


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([*BOXWRIGHT, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)


def test_demo_runs_the_main_job_on_the_embedded_default(tmp_path: Path) -> None:
    done = _run(["demo", "Remember the milk.", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    events = decode_ndjson(done.stdout)
    assert events[0].type == "RUN_STARTED" and isinstance(events[-1], RunFinishedEvent)
    diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
    assert "+- Remember the milk." in diff
    assert (tmp_path / ".boxwright" / "boxwright.db").is_file(), "the embedded SQLite store was used"
    # Rendered for a person, the same run shows the work and the diff.
    shown = _run(["demo", "Water the plants."], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Water the plants." in shown.stdout and "finished" in shown.stdout and "NOTES.md" in shown.stdout


def test_run_exits_non_zero_on_run_error(tmp_path: Path) -> None:
    done = _run(["run", "hi", "--harness", "command:echo boom >&2; exit 3", "--json"], tmp_path)
    assert done.returncode == 1
    error = decode_ndjson(done.stdout)[-1]
    assert isinstance(error, RunErrorEvent) and "code 3" in error.message and "boom" in error.message
    bad = _run(["run", "hi", "--harness", "nope"], tmp_path)
    assert bad.returncode != 0 and "--harness takes" in bad.stderr


def test_run_bridges_tools_from_the_command_line_to_the_real_claude(tmp_path: Path) -> None:
    claude = agent_cli("claude")
    marker = tmp_path / "tool-calls.txt"
    home = tmp_path / "home"
    home.mkdir()
    with FakeModelServer({"todos": [ToolCall("mcp__boxwright__get_todos", {}), Text("Two todos.")]}) as model:
        done = _run(
            ["run", "[[script:todos]] list my todos", "--tools", "tests.e2e.cli_tools:TOOLS", "--json"],
            tmp_path,
            PATH=f"{os.path.dirname(claude)}:{os.environ['PATH']}",
            HOME=str(home),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
            CLAUDE_CODE_MAX_RETRIES="0",
            BOXWRIGHT_TEST_TOOL_MARKER=str(marker),
        )
        sent = str(model.model_requests()[-1].body["messages"])
    assert done.returncode == 0, done.stderr + done.stdout
    assert marker.read_text() == "called open\n"
    assert "ship boxwright" in sent
    assert isinstance(decode_ndjson(done.stdout)[-1], RunFinishedEvent)
