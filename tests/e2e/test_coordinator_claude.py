"""The real ``claude`` driven by a ``boxwright serve`` coordinator, against the fake model: its MCP client calls
a host tool through the bridge the coordinator mounts on its own origin (``/_bridge``), with the run's token."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.coordinator import CoordinatorProcess, coordinators, sse_events, trigger
from tests.support.require import agent_cli


def test_real_claude_calls_a_host_tool_through_the_coordinators_bridge(tmp_path: Path) -> None:
    agent_cli("claude")  # a named skip locally, a failure in CI, when the CLI is not installed
    script = [ToolCall("mcp__boxwright__record_call", {"text": "from claude"}), Text("Recorded it.")]
    with FakeModelServer({"record": script}) as model:
        env = {"BWT_MODEL_URL": model.base_url, "BWT_CLAUDE_HOME": str(tmp_path / "home")}
        (tmp_path / "home").mkdir()
        with coordinators(CoordinatorProcess("claude", tmp_path, "true", env=env)) as (coordinator,):
            thread, run = f"t-{secrets.token_hex(4)}", f"r-claude-{secrets.token_hex(4)}"
            body = trigger(thread, "[[script:record]] record it", run, harness="claude")
            assert coordinator.post("/runs", body).status_code == 202
            frames = sse_events(coordinator.url, run, thread, timeout=120)
            failures = coordinator.stderr()
            events = [json.loads(data) for event, _, data in frames if event is None]
            status = json.loads(frames[-1][2])
            assert frames[-1][0] == "status" and status["status"] == "completed", (status, failures)
            assert [c["args"] for c in coordinator.tool_calls()] == [{"text": "from claude"}], failures
            starts = [e for e in events if e["type"] == "TOOL_CALL_START"]
            assert [e["toolCallName"] for e in starts] == ["record_call"], starts
            results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
            assert results and "recorded" in json.dumps(results[0]), results
            texts = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert "Recorded it." in texts
