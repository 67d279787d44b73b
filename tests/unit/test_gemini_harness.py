"""Gemini CLI over ACP: its argv and auth, its recorded output translated, the fake model's Gemini API, and the
`--harness gemini|grok|acp:<command>` registry with its doctor lines."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import msgspec
import pytest

from boxwright.cli import _harness, doctor_checks
from boxwright.events import Event, ToolCallResultEvent, ToolCallStartEvent, create_run_scoped_id_gen
from boxwright.harnesses.acp import AcpHarness, PermissionRequest, SelectedOutcome
from boxwright.harnesses.base import BridgeConfig, HarnessContext
from boxwright.harnesses.gemini_cli import gemini_cli
from boxwright.harnesses.grok_build import GrokBuildHarness
from boxwright.policy import define_sandbox_policy
from boxwright.sandbox import Capabilities
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "acp"


def _ctx(**extra: object) -> HarnessContext:
    caps = Capabilities(
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
    fields: dict[str, object] = {
        "run_id": "r7",
        "thread_id": "t1",
        "prompt": "hi",
        "system_prompt": None,
        "capabilities": caps,
        "provider": "local-process",
        "gen_id": create_run_scoped_id_gen("r7"),
        **extra,
    }
    return HarnessContext(**fields)  # type: ignore[arg-type]


def test_argv_auth_and_env() -> None:
    harness = gemini_cli("gemini-2.5-flash", approval_mode="yolo")
    host = {"GEMINI_API_KEY": "g-secret", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9", "OTHER": "x"}
    plan = harness.plan(_ctx(host_env=host))
    assert plan.command == "exec 'gemini' '--acp' '-m' 'gemini-2.5-flash' '--approval-mode' 'yolo'"
    assert plan.env["GEMINI_API_KEY"] == "g-secret" and plan.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9"
    assert "OTHER" not in plan.env and plan.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert plan.secrets == ["g-secret"], "the key is masked; the base URL is not a secret"
    assert harness.auth_method == "gemini-api-key" and harness.name == "gemini"
    logged_in = gemini_cli(auth_mode="host").plan(_ctx(host_env=host))
    assert "GEMINI_API_KEY" not in logged_in.env and gemini_cli(auth_mode="host").auth_method is None
    with pytest.raises(ValueError, match="approval_mode"):
        gemini_cli(approval_mode="always")


def test_recorded_gemini_output_names_the_bridge_tool_and_its_result() -> None:
    translator = gemini_cli().translator(_ctx(bridge=BridgeConfig(url="http://127.0.0.1:18310/mcp", token="t")))
    events: list[Event] = []
    for line in (RECORDINGS / "gemini-mcp.ndjson").read_text().splitlines():
        events += translator.feed(line)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.content == "- write the spec [open]"


def test_recorded_gemini_permission_requests_are_decided_by_the_command_in_the_title() -> None:
    policy = define_sandbox_policy(default="ask", allow=["echo *"], deny=["rm *"])
    translator = gemini_cli().translator(_ctx(policy=policy))
    answers = []
    for line in (RECORDINGS / "gemini-policy.ndjson").read_text().splitlines():
        data = json.loads(line)
        if data.get("method") == "session/request_permission":
            request = msgspec.convert(data["params"], PermissionRequest)
            answer = translator.answer_permission(request, [])
            assert isinstance(answer.outcome, SelectedOutcome)
            answers.append((request.tool_call.title, answer.outcome.option_id))
    assert answers == [("echo hi > f.txt", "proceed_once"), ("rm -f keep.txt", "cancel")]


def _post(url: str, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()  # type: ignore[no-any-return]


def test_the_fake_model_speaks_stream_generate_content() -> None:
    tools = [{"functionDeclarations": [{"name": "run_shell_command", "parameters": {"type": "object"}}]}]
    with FakeModelServer({"s": [ToolCall("run_shell_command", {"command": "ls"}), Text("Listed.")]}) as model:
        url = f"{model.base_url}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        user = {"role": "user", "parts": [{"text": "[[script:s]] go"}]}
        first = _post(url, {"contents": [user], "tools": tools}).decode()
        chunks = [json.loads(line[6:]) for line in first.splitlines() if line.startswith("data: ")]
        call = chunks[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]
        assert call["name"] == "run_shell_command" and call["args"] == {"command": "ls"}
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["usageMetadata"]["totalTokenCount"]
        answered = {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {}}}]}
        model_turn = {"role": "model", "parts": [{"functionCall": call}]}
        second = _post(url, {"contents": [user, model_turn, answered], "tools": tools}).decode()
        text = "".join(
            json.loads(line[6:])["candidates"][0]["content"]["parts"][0].get("text", "")
            for line in second.splitlines()
            if line.startswith("data: ")
        )
        assert text == "Listed."
        whole = json.loads(_post(url.replace("streamGenerateContent?alt=sse", "generateContent"), {"contents": [user]}))
        assert whole["candidates"][0]["content"]["parts"] == [{"text": "ok"}], "no tools offered: the side reply"
        steps = [r.step for r in model.model_requests()]
    assert steps == [0, 1, None]


def test_the_cli_registry_builds_gemini_grok_and_any_acp_agent() -> None:
    assert isinstance(_harness("gemini", "gemini-2.5-pro"), AcpHarness)
    assert _harness("gemini", None).command == ("gemini", "--acp")
    grok = _harness("grok", None)
    assert isinstance(grok, GrokBuildHarness) and grok.model == "grok-build-0.1"
    agent = _harness("acp:claude-agent-acp --debug", None)
    assert isinstance(agent, AcpHarness) and agent.command == ("claude-agent-acp", "--debug")
    with pytest.raises(SystemExit, match="acp:<agent command>"):
        _harness("acp:", None)


def test_doctor_reports_gemini_grok_and_the_acp_agents(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = "/opt/boxwright-agents/node_modules/.bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("XAI_API_KEY", "xai-do-not-print")
    checks = {f"{c.kind}:{c.name}": c for c in doctor_checks()}
    gemini = checks["agent-cli:gemini"]
    if os.access(f"{bin_dir}/gemini", os.X_OK):
        assert gemini.ok and "0.61.0" in gemini.detail, gemini
    assert checks["agent-auth:gemini"].ok is False and "GEMINI_API_KEY" in checks["agent-auth:gemini"].detail
    assert checks["agent-cli:grok-build"].ok is False and "install Grok Build" in checks["agent-cli:grok-build"].detail
    assert checks["agent-auth:grok-build"].ok is True and "$XAI_API_KEY" in checks["agent-auth:grok-build"].detail
    assert "xai-do-not-print" not in str([c.detail for c in checks.values()])
    for agent in ("claude-agent-acp", "codex-acp"):
        line = checks[f"acp:{agent}".join(["agent-cli:", ""])]
        assert line.ok == os.access(f"{bin_dir}/{agent}", os.X_OK), line
