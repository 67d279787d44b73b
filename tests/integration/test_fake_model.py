"""The scripted fake model server: its three wire formats, and the real `claude` CLI run against it."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.fixtures import CLAUDE_RECORDINGS, claude_env, find_claude
from tests.fixtures.fake_model import (
    NO_SCRIPT,
    REDACTED,
    SCRIPT_DONE,
    SIDE_REPLY,
    CustomToolCall,
    FakeModelServer,
    Hang,
    HttpError,
    Sleep,
    Text,
    Thinking,
    ToolCall,
    ToolCalls,
)
from tests.support.require import missing

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def _post(base_url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _sse(raw: bytes) -> list[tuple[str | None, Any]]:
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        events.append((name, data if data == "[DONE]" else json.loads(data or "null")))
    return events


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _results(*ids: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids]}


# --------------------------------------------------------------------------- Anthropic Messages


def test_anthropic_stream_has_the_real_event_sequence_and_split_tool_json() -> None:
    call_input = {"command": "echo hi > f.txt", "description": "write f.txt"}
    with FakeModelServer({"s": [ToolCall("Bash", call_input, text="Let me.")]}) as fake:
        body = {"model": "claude-x", "stream": True, "tools": TOOLS, "messages": [_user("[[script:s]] go")]}
        status, raw = _post(fake.base_url, "/v1/messages?beta=true", body, {"x-api-key": "sk-secret"})
    assert status == 200
    events = _sse(raw)
    assert all(name == data["type"] for name, data in events)
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["model"] == "claude-x"
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "Bash" and starts[1]["id"].startswith("toolu_")
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0)
    assert text == "Let me."
    pieces = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1]
    assert len([p for p in pieces if p]) >= 2 and json.loads("".join(pieces)) == call_input
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] >= 1
    [req] = fake.requests
    assert (req.path, req.query, req.script, req.step) == ("/v1/messages", "beta=true", "s", 0)
    assert req.headers["x-api-key"] == REDACTED and "sk-secret" not in json.dumps(req.headers)


def test_anthropic_thinking_stream_and_json_reply() -> None:
    with FakeModelServer({"t": [Thinking("plan it", "Answer.")]}) as fake:
        body = {"model": "m", "tools": TOOLS, "messages": [_user("[[script:t]]")]}
        status, raw = _post(fake.base_url, "/v1/messages", {**body, "stream": True})
        status2, raw2 = _post(fake.base_url, "/v1/messages", body)
    assert status == status2 == 200
    deltas = [d["delta"] for n, d in _sse(raw) if n == "content_block_delta"]
    assert "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta") == "plan it"
    assert [d["type"] for d in deltas].count("signature_delta") == 1
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "Answer."
    message = json.loads(raw2)
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["signature"] and message["stop_reason"] == "end_turn"


def test_step_follows_tool_results_after_the_newest_user_text() -> None:
    steps = [
        ToolCalls([("Bash", {"command": "a"}), ("Bash", {"command": "b"})]),
        ToolCall("Bash", {"command": "c"}),
        Text("end"),
    ]
    with FakeModelServer({"p": steps}) as fake:

        def reply(messages: list[dict[str, Any]], tools: Any = TOOLS) -> dict[str, Any]:
            status, raw = _post(fake.base_url, "/v1/messages", {"model": "m", "tools": tools, "messages": messages})
            assert status == 200
            return json.loads(raw)

        first = reply([_user("[[script:p]] go")])
        assert [b["input"]["command"] for b in first["content"]] == ["a", "b"]
        convo = [_user("[[script:p]] go"), first, _results("x", "y")]
        assert reply(convo)["content"][0]["input"] == {"command": "c"}
        assert reply([*convo, {"role": "assistant", "content": []}, _results("z")])["content"][0]["text"] == "end"
        # Injected context (a lone <system-reminder> message) is no new user turn.
        reminder = _user("<system-reminder>\nnote\n</system-reminder>\n")
        assert reply([*convo, reminder])["content"][0]["input"] == {"command": "c"}
        # A retry gets the same step; a later user turn (no marker) restarts the same script.
        assert reply(convo)["content"][0]["input"] == {"command": "c"}
        assert reply([*convo, _results("z"), {"role": "system", "content": "x"}, _user("again")])["stop_reason"] == (
            "tool_use"
        )
        assert (
            reply([*convo, _results("z"), {"role": "assistant", "content": []}, _results("w")])["content"][0]["text"]
            == SCRIPT_DONE
        )
        assert reply([_user("[[script:p]] title?")], tools=[])["content"][0]["text"] == SIDE_REPLY
        assert reply([_user("[[script:nope]]")])["content"][0]["text"] == NO_SCRIPT
        assert reply([_user("no marker")])["content"][0]["text"] == NO_SCRIPT
    assert [r.step for r in fake.requests][:3] == [0, 1, 2]


def test_http_error_count_tokens_and_models() -> None:
    with FakeModelServer({"e": [HttpError(529, "busy"), Text("x")], "f": [HttpError(500, "boom")]}) as fake:
        status, raw = _post(fake.base_url, "/v1/messages", {"tools": TOOLS, "messages": [_user("[[script:e]]")]})
        assert status == 529
        assert json.loads(raw)["error"] == {"type": "overloaded_error", "message": "busy"}
        status, raw = _post(fake.base_url, "/v1/messages", {"tools": TOOLS, "messages": [_user("[[script:f]]")]})
        assert (status, json.loads(raw)["type"], json.loads(raw)["error"]["type"]) == (500, "error", "api_error")
        status, raw = _post(fake.base_url, "/v1/messages/count_tokens", {"messages": [_user("hello there")]})
        assert status == 200 and json.loads(raw)["input_tokens"] > 0
        url = urlsplit(fake.base_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        conn.close()
    assert "claude-opus-5-5" in [m["id"] for m in models["data"]]


def test_sleep_delays_and_hang_is_released_by_stop() -> None:
    fake = FakeModelServer({"s": [Sleep(0.3), Text("late")], "h": [Hang()]})
    fake.start()
    try:
        started = time.monotonic()
        _, raw = _post(fake.base_url, "/v1/messages", {"tools": TOOLS, "messages": [_user("[[script:s]]")]})
        assert json.loads(raw)["content"][0]["text"] == "late" and time.monotonic() - started >= 0.3
        outcome: list[BaseException | tuple[int, bytes]] = []

        def hang() -> None:
            try:
                outcome.append(
                    _post(fake.base_url, "/v1/messages", {"tools": TOOLS, "messages": [_user("[[script:h]]")]})
                )
            except (OSError, http.client.HTTPException) as exc:
                outcome.append(exc)

        thread = threading.Thread(target=hang)
        thread.start()
        fake.wait_for_request(lambda r: r.script == "h", timeout=5)
        time.sleep(0.2)
        assert thread.is_alive()  # still no answer
    finally:
        stopped = time.monotonic()
        fake.stop()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - stopped < 3
    assert isinstance(outcome[0], BaseException)  # dropped, never answered


# --------------------------------------------------------------------------- OpenAI Responses / Chat


def test_responses_stream_function_call_text_and_steps() -> None:
    script = [
        ToolCall("get_todos", {"a": 1}, namespace="mcp__bridge"),
        CustomToolCall("apply_patch", "*** Begin"),
        Text("Done!"),
    ]
    with FakeModelServer({"r": script}) as fake:
        base: list[dict[str, Any]] = [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[[script:r]] go"}]},
        ]
        body = {"model": "gpt-5.5", "stream": True, "tools": [{"type": "function", "name": "x"}], "input": base}
        _, raw = _post(fake.base_url, "/v1/responses", body)
        events = _sse(raw)
        assert [n for n, _ in events][:2] == ["response.created", "response.in_progress"]
        assert all(n == d["type"] for n, d in events)
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        args = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
        assert json.loads(args) == {"a": 1}
        done = next(d["item"] for n, d in events if n == "response.output_item.done")
        assert (done["type"], done["name"], done["namespace"]) == ("function_call", "get_todos", "mcp__bridge")
        completed = events[-1][1]["response"]
        assert events[-1][0] == "response.completed" and completed["usage"]["total_tokens"] > 0
        call_out = {"type": "function_call_output", "call_id": done["call_id"], "output": "[]"}
        _, raw = _post(fake.base_url, "/v1/responses", {**body, "input": [*base, done, call_out]})
        custom = next(d for n, d in _sse(raw) if n == "response.output_item.done")["item"]
        assert (custom["type"], custom["input"]) == ("custom_tool_call", "*** Begin")
        custom_out = {"type": "custom_tool_call_output", "call_id": custom["call_id"], "output": "ok"}
        _, raw = _post(fake.base_url, "/v1/responses", {**body, "input": [*base, done, call_out, custom, custom_out]})
        text = "".join(d["delta"] for n, d in _sse(raw) if n == "response.output_text.delta")
        assert text == "Done!"
        _, raw = _post(fake.base_url, "/v1/responses", {**body, "stream": False, "input": "[[script:r]]"})
        assert json.loads(raw)["status"] == "completed"
        status, raw = _post(fake.base_url, "/v1/responses", {"model": "m", "input": "title please"})
        assert status == 200
        assert json.loads(raw)["output"][0]["content"][0]["text"] == SIDE_REPLY


def test_chat_completions_stream_tool_calls_and_done() -> None:
    with FakeModelServer(
        {"c": [ToolCall("bash", {"command": "ls"}), Thinking("hm", "Fine.")], "e": [HttpError(400, "x")]}
    ) as fake:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "[[script:c]]"},
        ]
        body = {"model": "fake-model", "stream": True, "stream_options": {"include_usage": True}, "tools": [{}]}
        _, raw = _post(fake.base_url, "/v1/chat/completions", {**body, "messages": messages})
        events = _sse(raw)
        assert events[-1] == (None, "[DONE]")
        chunks = [d for _, d in events[:-1]]
        calls = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
        assert calls[0]["function"]["name"] == "bash" and calls[0]["id"].startswith("call_")
        assert json.loads("".join(tc["function"]["arguments"] for tc in calls)) == {"command": "ls"}
        finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
        assert finishes == ["tool_calls"] and chunks[-1]["usage"]["prompt_tokens"] > 0
        answer = {"role": "assistant", "tool_calls": [{"id": calls[0]["id"]}]}
        tool = {"role": "tool", "tool_call_id": calls[0]["id"], "content": "out"}
        _, raw = _post(
            fake.base_url, "/v1/chat/completions", {**body, "stream": False, "messages": [*messages, answer, tool]}
        )
        message = json.loads(raw)["choices"][0]["message"]
        assert (message["content"], message["reasoning_content"]) == ("Fine.", "hm")
        error_body = {**body, "messages": [{"role": "user", "content": "[[script:e]]"}]}
        status, raw = _post(fake.base_url, "/v1/chat/completions", error_body)
        assert status == 400 and json.loads(raw)["error"]["message"] == "x"


# --------------------------------------------------------------------------- the recordings


def _lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (CLAUDE_RECORDINGS / f"{name}.ndjson").read_text().splitlines()]


def test_recordings_show_the_shapes_the_translator_relies_on() -> None:
    bash = _lines("bash")
    assert bash[0]["subtype"] == "init" and bash[-1]["type"] == "result" and not bash[-1]["is_error"]
    assert [line["type"] for line in bash[1:-1]] == ["assistant", "user", "assistant"]
    parallel = [line for line in _lines("parallel") if line["type"] == "assistant"]
    assert len({line["message"]["id"] for line in parallel[:3]}) == 1  # one line per content block
    for name in ("api_error_500", "connection_refused"):
        result = _lines(name)[-1]
        assert (result["subtype"], result["is_error"], result["terminal_reason"]) == ("success", True, "api_error")
    denied = _lines("denied")[-1]
    assert denied["permission_denials"][0]["tool_name"] == "Bash"
    assert any(line["type"] == "stream_event" for line in _lines("partial"))
    assert _lines("structured")[-1]["structured_output"] == {"summary": "ok"}
    assert _lines("max_turns")[-1]["subtype"] == "error_max_turns"


# --------------------------------------------------------------------------- the real claude CLI


def _claude() -> str:
    found = find_claude()
    if found is None:
        reason = "claude CLI not found (BOXWRIGHT_CLAUDE_BIN, PATH, /opt/boxwright-agents/node_modules/.bin/claude)"
        missing(reason)
    return found


def _run_claude(fake: FakeModelServer, tmp_path: Path, prompt: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    argv = [_claude(), "-p", prompt, "--output-format", "stream-json", "--verbose", *args]
    proc = subprocess.run(
        argv, cwd=cwd, env=claude_env(home, fake.base_url), capture_output=True, text=True, timeout=60
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_claude_runs_a_scripted_bash_call(tmp_path: Path) -> None:
    script = [ToolCall("Bash", {"command": "echo hi > f.txt", "description": "write f.txt"}), Text("Created f.txt.")]
    with FakeModelServer({"bash": script}) as fake:
        rc, lines = _run_claude(fake, tmp_path, "[[script:bash]] create f.txt", "--allowedTools", "Bash")
    assert rc == 0
    assert (tmp_path / "cwd" / "f.txt").read_text() == "hi\n"
    assert lines[-1]["type"] == "result" and lines[-1]["result"] == "Created f.txt."
    first, second = fake.model_requests()
    assert (first.script, first.step, second.step) == ("bash", 0, 1)
    assert first.headers["x-api-key"] == REDACTED and first.headers["user-agent"].startswith("claude-cli/")
    call_id = next(line for line in lines if line["type"] == "assistant")["message"]["content"][0]["id"]
    results = [
        b
        for m in second.body["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert [r["tool_use_id"] for r in results] == [call_id]
    assert results[0]["is_error"] is False


def test_claude_reports_http_500_as_error_result(tmp_path: Path) -> None:
    with FakeModelServer({"err": [HttpError(500, "scripted boom")]}) as fake:
        rc, lines = _run_claude(fake, tmp_path, "[[script:err]] fail")
    assert rc == 1
    result = lines[-1]
    assert result["type"] == "result" and result["is_error"] is True
    assert result["api_error_status"] == 500 and "scripted boom" in result["result"]
    assert len(fake.model_requests()) == 1  # CLAUDE_CODE_MAX_RETRIES=0


def test_claude_shows_thinking_then_text(tmp_path: Path) -> None:
    with FakeModelServer({"think": [Thinking("Two plus two is four.", "2 + 2 = 4.")]}) as fake:
        rc, lines = _run_claude(fake, tmp_path, "[[script:think]] add")
    assert rc == 0
    blocks = [b for line in lines if line["type"] == "assistant" for b in line["message"]["content"]]
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["thinking"] == "Two plus two is four." and blocks[0]["signature"]
    assert lines[-1]["result"] == "2 + 2 = 4." and lines[-1]["is_error"] is False
