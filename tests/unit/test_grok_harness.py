"""Grok Build: argv from the policy, the streaming-json translator, and whole runs through run_agent against a
fake CLI that speaks the documented lines (tests/fixtures/fake_grok.py); a live run when a real `grok` is on PATH."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, Lifecycle, define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    create_run_scoped_id_gen,
    encode_event,
)
from boxwright.harnesses.base import BridgeConfig, HarnessContext
from boxwright.harnesses.grok_build import grok_build
from boxwright.policy import define_sandbox_policy
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import Capabilities
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge import tool
from boxwright.workspace import define_workspace, git_source

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_grok.py"
FAKE_EXE = f"{sys.executable} {FAKE}"


def _caps() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=True,
        killable_processes=True,
        snapshots=False,
        network_policy=False,
        durable_filesystem=True,
        fork=False,
    )


def _ctx(**extra: object) -> HarnessContext:
    fields: dict[str, object] = {
        "run_id": "r7",
        "thread_id": "t1",
        "prompt": "fix it",
        "system_prompt": None,
        "capabilities": _caps(),
        "provider": "local-process",
        "gen_id": create_run_scoped_id_gen("r7"),
        **extra,
    }
    return HarnessContext(**fields)  # type: ignore[arg-type]


# -- argv (R28, R29, T31, T32) ------------------------------------------------------------------------


def test_permissive_argv_auto_approves_with_the_literal_cwd_and_the_model_alias() -> None:
    plan = grok_build("grok-build").plan(_ctx())
    assert plan.command.startswith("exec 'grok' -p 'fix it' --output-format streaming-json --model 'grok-build-0.1'")
    assert '--cwd "$PWD"' in plan.command and "/workspace" not in plan.command
    assert "--always-approve --no-plan --no-auto-update" in plan.command
    assert "--mcp-config" not in plan.command and plan.stdin is None


def test_a_restrictive_policy_maps_to_grok_flags() -> None:
    policy = define_sandbox_policy(default="ask", file_write="deny", network="deny")
    plan = grok_build().plan(_ctx(policy=policy, session_id="s-1"))
    assert "--permission-mode default" in plan.command and "--always-approve" not in plan.command
    assert "--sandbox read-only" in plan.command and "--disable-web-search" in plan.command
    assert "--resume 's-1'" in plan.command
    # A deny list alone keeps auto-approve (headless grok would cancel every asked tool).
    assert "--always-approve" in grok_build().plan(_ctx(policy=define_sandbox_policy(deny=["rm *"]))).command


def test_the_bridge_goes_to_grok_config_by_env_and_the_key_is_a_secret() -> None:
    bridge = BridgeConfig(url="http://127.0.0.1:5/mcp", token="tok-123")
    plan = grok_build().plan(_ctx(bridge=bridge, host_env={"XAI_API_KEY": "xai-secret"}))
    assert "tok-123" not in plan.command, "the token never goes in argv"
    table = plan.env["BOXWRIGHT_GROK_MCP"]
    assert '[mcp_servers.boxwright]\nurl = "http://127.0.0.1:5/mcp"\nenabled = true' in table
    assert 'Authorization = "Bearer tok-123"' in table
    assert plan.env["XAI_API_KEY"] == "xai-secret" and {"tok-123", "xai-secret"} <= set(plan.secrets)
    host = grok_build(auth_mode="host").plan(_ctx(host_env={"XAI_API_KEY": "xai-secret"}))
    assert "XAI_API_KEY" not in host.env and host.command.startswith("unset XAI_API_KEY GROK_API_KEY; ")


# -- translation (R30, T33) -----------------------------------------------------------------------------


def _feed(lines: list[dict[str, object]], exit_code: int = 0) -> list[Event]:
    translator = grok_build().translator(_ctx(bridge=BridgeConfig(url="u", token="t")))
    events: list[Event] = []
    for line in lines:
        events += translator.feed(json.dumps(line))
    return events + translator.finish(exit_code, "")


def test_native_lines_become_reasoning_text_session_and_finish() -> None:
    events = _feed(
        [
            {"type": "thought", "content": "plan"},
            {"type": "text", "content": "Hel"},
            {"type": "text", "content": "lo"},
            {"type": "end", "sessionId": "g-1", "usage": {"input_tokens": 3, "output_tokens": 2}},
        ]
    )
    types = [e.type for e in events]
    assert types == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "CUSTOM",
        "RUN_FINISHED",
    ]
    session = events[-2]
    assert isinstance(session, CustomEvent) and session.value == {"sessionId": "g-1"}
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage and finished.usage[0].total_tokens == 5


def test_an_error_line_is_one_run_error_and_no_terminal_line_finishes_on_exit_0() -> None:
    errored = _feed([{"type": "thought", "content": "x"}, {"type": "error", "message": "quota"}], exit_code=1)
    assert [e.type for e in errored].count("RUN_ERROR") == 1 and errored[-1].type == "RUN_ERROR"
    assert isinstance(errored[-1], RunErrorEvent) and errored[-1].message == "quota"
    quiet = _feed([{"type": "text", "content": "hi"}])
    assert quiet[-1].type == "RUN_FINISHED" and "TEXT_MESSAGE_END" in [e.type for e in quiet]


def test_legacy_thread_events_follow_codex_rules() -> None:
    events = _feed(
        [
            {"type": "thread.started", "thread_id": "th-1"},
            {"type": "item.started", "item": {"id": "c1", "type": "command_execution", "command": "ls"}},
            {
                "type": "item.completed",
                "item": {
                    "id": "c1",
                    "type": "command_execution",
                    "command": "ls",
                    "aggregated_output": "a\n",
                    "exit_code": 0,
                    "status": "completed",
                },
            },
            {
                "type": "item.completed",
                "item": {
                    "id": "m1",
                    "type": "mcp_tool_call",
                    "server": "boxwright",
                    "tool": "get_todos",
                    "status": "completed",
                    "result": {"content": [{"type": "text", "text": "T"}]},
                },
            },
            {"type": "item.completed", "item": {"id": "m2", "type": "agent_message", "text": "ok"}},
            {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 3}},
        ]
    )
    starts = [e for e in events if isinstance(e, ToolCallStartEvent)]
    assert [s.tool_name for s in starts] == ["command_execution", "get_todos"]
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert json.loads(results[0].content) == {"aggregated_output": "a\n", "exit_code": 0, "status": "completed"}
    assert results[1].content == "T"
    assert events[-1].type == "RUN_FINISHED"


def test_a_call_left_open_gets_an_interrupted_result() -> None:
    events = _feed([{"type": "item.started", "item": {"id": "c1", "type": "command_execution", "command": "x"}}], 1)
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.content == '{"status":"interrupted"}' and events[-1].type == "RUN_ERROR"


# -- whole runs against the fake CLI ---------------------------------------------------------------------


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@e.com"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "README.md").write_text("hello\n")
    (repo / ".grok").mkdir()
    (repo / ".grok" / "config.toml").write_text('model = "grok-build-0.1"\n')
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


def _run(tmp_path: Path, origin: Path, env: dict[str, str], **kwargs: object) -> tuple[list[Event], dict[str, str]]:
    sandbox = define_sandbox(
        "grok", local_process_sandbox(base_dir=tmp_path / "sb"), define_workspace(source=git_source(f"file://{origin}"))
    )
    store = MemoryInstanceStore()
    harness = grok_build(executable=FAKE_EXE, env=env)

    async def main() -> tuple[list[Event], dict[str, str]]:
        events = [
            e
            async for e in run_agent(
                sandbox,
                harness,
                "please edit",
                thread_id="t",
                run_id="r-grok",
                store=store,
                **kwargs,  # type: ignore[arg-type]
            )
        ]
        files: dict[str, str] = {}
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t", run_id="check", store=store))
        if again is not None:
            for name in ("README.md", ".grok/config.toml"):
                if await again.handle.fs.exists(name):
                    files[name] = await again.handle.fs.read(name)
            files["listing"] = (await again.handle.process.exec("ls -A .grok")).stdout
            await again.handle.destroy()
        return events, files

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_the_fake_cli_edits_the_repo_and_the_diff_is_reported(tmp_path: Path, origin: Path) -> None:
    argv_file = tmp_path / "argv.json"
    env = {"FAKE_GROK_RUN": "sed -i 's/hello/hello from grok/' README.md", "FAKE_GROK_ARGV": str(argv_file)}
    events, files = _run(tmp_path, origin, env)
    types = [e.type for e in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", events[-1]
    assert files["README.md"] == "hello from grok\n"
    diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
    assert "+hello from grok" in diff and ".grok" not in diff
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "command_execution"
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("--cwd") + 1].startswith(str(tmp_path / "sb")), "a literal path, never /workspace"
    session = [e for e in events if isinstance(e, CustomEvent) and e.name == "grok-build.session-id"]
    assert session[0].value == {"sessionId": "grok-session-1"}


def test_the_fake_cli_calls_a_host_tool_over_the_bridge_and_the_config_is_restored(
    tmp_path: Path, origin: Path
) -> None:
    calls: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List todos."""
        calls.append(status)
        return f"- ship it [{status}]"

    env = {"FAKE_GROK_TOOL": 'get_todos:{"status": "open"}'}
    events, files = _run(tmp_path, origin, env, tools=[get_todos])
    assert events[-1].type == "RUN_FINISHED", events[-1]
    assert calls == ["open"]
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "ship it [open]" in result.content
    assert files[".grok/config.toml"] == 'model = "grok-build-0.1"\n', "the workspace's own config is back as it was"
    assert files["listing"].split() == ["config.toml"], "no backup or bridge file is left"
    assert b"Bearer" not in b"".join(encode_event(e) for e in events)


def test_an_error_line_from_the_cli_ends_with_one_run_error(tmp_path: Path, origin: Path) -> None:
    events, _ = _run(tmp_path, origin, {"FAKE_GROK_MODE": "error"})
    errors = [e for e in events if isinstance(e, RunErrorEvent)]
    assert len(errors) == 1 and events[-1] is errors[0] and "quota" in errors[0].message


def test_a_cancelled_grok_run_leaves_no_process(tmp_path: Path, origin: Path) -> None:
    sandbox = define_sandbox("grok", local_process_sandbox(base_dir=tmp_path / "sb"))
    controller = AbortController()
    harness = grok_build(executable=FAKE_EXE, env={"FAKE_GROK_MODE": "hang", "FAKE_MARK": str(tmp_path)})

    async def main() -> list[Event]:
        events: list[Event] = []
        async for event in run_agent(
            sandbox, harness, "wait", thread_id="t", store=MemoryInstanceStore(), signal=controller.signal
        ):
            events.append(event)
            if event.type == "REASONING_MESSAGE_CONTENT":
                controller.abort("boxwright:cancel-requested")
        return events

    events = asyncio.run(asyncio.wait_for(main(), 60))
    assert isinstance(events[-1], RunErrorEvent) and events[-1].code == "cancelled"
    deadline = time.monotonic() + 5
    while (left := _marked(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def _marked(mark: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if mark in Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace"):
                    found.append(pid)
            except OSError:
                continue
    return found


def test_live_grok_when_installed(tmp_path: Path) -> None:
    grok = shutil.which("grok") or shutil.which("grok", path=os.path.expanduser("~/.grok/bin"))
    if grok is None:
        pytest.skip("live Grok Build: no `grok` on PATH or in ~/.grok/bin (not on any registry this project uses)")
    if not (os.environ.get("XAI_API_KEY") or os.environ.get("GROK_API_KEY")):
        pytest.skip("live Grok Build: `grok` is installed but XAI_API_KEY/GROK_API_KEY is not set")
    sandbox = define_sandbox(
        "grok-live", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
    )

    async def main() -> list[Event]:
        return [
            e
            async for e in run_agent(
                sandbox,
                grok_build(executable=grok),
                "Reply with the word ok.",
                thread_id="t",
                store=MemoryInstanceStore(),
            )
        ]

    events = asyncio.run(asyncio.wait_for(main(), 300))
    assert events[-1].type == "RUN_FINISHED", events[-1]
    assert "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent)).strip()
