"""The built-in demo: a scripted agent (``demo_agent.py``) as a command harness, its repository and its host tool.

A newcomer with no agent CLI and no model key still watches a whole run: the agent really edits
files in its sandbox, calls the host app's tool over the bridge, asks before it runs the tests
(the demo policy's ``ask``, answered on the page) and runs them. The script is written into the
sandbox as a plan file, so it runs wherever ``python3`` does (local process, bubblewrap, Docker).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import msgspec

from boxwright.harnesses.base import HarnessContext, HarnessPlan
from boxwright.harnesses.command import CommandHarness, CommandTranslator
from boxwright.policy import SandboxPolicy, define_sandbox_policy
from boxwright.shell import quote
from boxwright.tool_bridge.tools import Tool, tool

DEMO_HARNESS: Final = "demo"
TEST_COMMAND: Final = "python3 -m unittest -q"
# The demo asks a person before it runs the tests; everything else it does is allowed.
DEMO_POLICY: Final[SandboxPolicy] = define_sandbox_policy(default="allow", ask=[f"{TEST_COMMAND}*"])
DEFAULT_PACE_S: Final = 0.3

_FILES: Final[dict[str, str]] = {
    "greet.py": 'def greet(name):\n    return "Hello, " + name\n',
    "test_greet.py": (
        "import unittest\n\nfrom greet import greet\n\n\n"
        "class GreetTest(unittest.TestCase):\n"
        "    def test_greets_by_name(self):\n"
        '        self.assertTrue(greet("Ada").startswith("Hello, Ada"))\n\n\n'
        'if __name__ == "__main__":\n    unittest.main()\n'
    ),
    "NOTES.md": "# Notes\n",
}


def demo_agent_script() -> str:
    """The demo agent's source, as the package ships it."""
    return resources.files("boxwright.viewer").joinpath("demo_agent.py").read_text()


def ensure_demo_repo(path: str | Path) -> Path:
    """A small git repository (a function, its test, notes) at ``path``, made once; returns its path."""
    repo = Path(path).absolute()
    if (repo / ".git").is_dir():
        return repo
    repo.mkdir(parents=True, exist_ok=True)
    for name, text in _FILES.items():
        (repo / name).write_text(text)
    who = ["-c", "user.name=boxwright", "-c", "user.email=demo@boxwright.invalid"]
    for args in (["init", "-q", "-b", "main"], [*who, "add", "."], [*who, "commit", "-q", "-m", "greet"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


@tool(read_only=True)
def house_style(topic: str) -> str:
    """The team's house style for a topic (the demo's host tool: it runs in the app's process)."""
    styles = {"greetings": "Greetings end with an exclamation mark!"}
    return styles.get(topic.strip().lower(), f"No house style for {topic!r}: keep it short.")


@dataclass(frozen=True)
class DemoHarness:
    """The demo agent as a command harness, told where its bridge is and which host tool to call."""

    tool: str = house_style.name
    tool_args: Mapping[str, Any] = field(default_factory=lambda: {"topic": "greetings"})
    ask_tool: str = "ask_person"
    pace_s: float = DEFAULT_PACE_S
    python: str = "python3"
    emit_diff: bool = True

    @property
    def name(self) -> str:
        return DEMO_HARNESS

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        script = f"/tmp/boxwright-demo-agent-{ctx.file_suffix}.py"
        env = {
            "BOXWRIGHT_DEMO_TOOL": self.tool,
            "BOXWRIGHT_DEMO_TOOL_ARGS": msgspec.json.encode(dict(self.tool_args)).decode(),
            "BOXWRIGHT_DEMO_ASK_TOOL": self.ask_tool,
            "BOXWRIGHT_DEMO_PACE": str(self.pace_s),
        }
        secrets: list[str] = []
        if ctx.bridge is not None:
            env["BOXWRIGHT_BRIDGE_URL"] = ctx.bridge.url
            env["BOXWRIGHT_BRIDGE_TOKEN"] = ctx.bridge.token
            secrets.append(ctx.bridge.token)
        plan = CommandHarness(f"{quote(self.python)} {quote(script)}", env=env).plan(ctx)
        plan.files[script] = demo_agent_script()
        plan.secrets = [*plan.secrets, *secrets]
        return plan

    def translator(self, ctx: HarnessContext) -> CommandTranslator:
        return CommandTranslator(ctx)


def demo_harness(
    *, tool: Tool = house_style, tool_args: Mapping[str, Any] | None = None, pace_s: float = DEFAULT_PACE_S
) -> DemoHarness:
    """The demo agent calling ``tool`` (with ``tool_args``, default ``{"topic": "greetings"}``) over the bridge."""
    return DemoHarness(tool=tool.name, tool_args=dict(tool_args or {"topic": "greetings"}), pace_s=pace_s)


__all__ = [
    "DEMO_HARNESS",
    "DEMO_POLICY",
    "TEST_COMMAND",
    "DemoHarness",
    "demo_agent_script",
    "demo_harness",
    "ensure_demo_repo",
    "house_style",
]
