"""`boxwright run --tools MODULE:ATTR`: plain typed functions are tools; a bad value is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from boxwright.events import RunFinishedEvent, decode_ndjson
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.require import agent_cli

ROOT = Path(__file__).resolve().parents[2]

APP_TOOLS = '''
import os


def get_todos(status: str = "open") -> str:
    """The app's todos, from a plain function."""
    with open(os.environ["BOXWRIGHT_TEST_TOOL_MARKER"], "a") as f:
        f.write(f"called {status}\\n")
    return "- buy milk\\n- ship boxwright"


TOOLS = [get_todos]
NOT_A_LIST = 5
WITH_A_STRING = [get_todos, "get_todo"]


def broken():
    raise RuntimeError("no database")


def one():
    return get_todos
'''


def _boxwright(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "boxwright.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app_tools.py").write_text(textwrap.dedent(APP_TOOLS))
    (tmp_path / "raises_on_import.py").write_text("raise ImportError('needs the app config')\n")
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("app_tools", "--tools takes MODULE:ATTR (e.g. myapp.tools:TOOLS), got 'app_tools'"),
        ("app_tools:", "--tools takes MODULE:ATTR"),
        ("no_such_module:TOOLS", "no module named 'no_such_module'"),
        ("raises_on_import:TOOLS", "importing 'raises_on_import' failed: ImportError: needs the app config"),
        ("app_tools:MISSING", "module 'app_tools' has no attribute 'MISSING'"),
        ("app_tools:NOT_A_LIST", "tools takes a list of tools, e.g. tools=[get_todos]"),
        ("app_tools:WITH_A_STRING", "tools[1]: it is not a tool"),
        ("app_tools:broken", "calling broken() for the list of tools failed: RuntimeError: no database"),
        ("app_tools:one", "one() returned a function, not a list of tools"),
    ],
)
def test_a_bad_tools_value_is_one_clear_line_and_exit_2(app: Path, spec: str, says: str) -> None:
    done = _boxwright(["run", "hi", "--harness", "command:echo hi", "--tools", spec, "--json"], app)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("boxwright: ") and says in lines[0], lines[0]
    assert done.stdout == "", "nothing may run for a bad --tools value"
    assert not (app / ".boxwright").exists() or not any((app / ".boxwright").rglob("*sandbox*"))


def test_a_list_of_plain_functions_is_bridged_to_the_real_claude(app: Path) -> None:
    claude = agent_cli("claude")
    marker = app / "tool-calls.txt"
    home = app / "home"
    home.mkdir()
    script = {"todos": [ToolCall("mcp__boxwright__get_todos", {"status": "open"}), Text("Two todos.")]}
    with FakeModelServer(script) as model:
        done = _boxwright(
            ["run", "[[script:todos]] list my todos", "--tools", "app_tools:TOOLS", "--json"],
            app,
            PATH=f"{os.path.dirname(claude)}:{os.environ['PATH']}",
            HOME=str(home),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
            CLAUDE_CODE_MAX_RETRIES="0",
            BOXWRIGHT_TEST_TOOL_MARKER=str(marker),
        )
        requests = model.model_requests()
    assert done.returncode == 0, done.stderr + done.stdout
    sent = str(requests[-1].body["messages"])
    assert marker.read_text() == "called open\n"
    assert "ship boxwright" in sent
    assert isinstance(decode_ndjson(done.stdout)[-1], RunFinishedEvent)
