"""The official AG-UI and TanStack AI clients against boxwright's standard endpoint (issue 18).

A boxwright app (``tests/agui/app.py``: ``SandboxService`` + ``sandbox_routes`` under uvicorn over
SQLite) runs the real ``claude`` against the fake model; ``tests/agui/clients.mjs`` drives the
pinned ``@ag-ui/client`` ``HttpAgent`` (whose own pipeline verifies every event: RUN_STARTED first,
every content event inside its START/END, nothing after the terminal event) and TanStack AI's
``ChatClient``. Each test compares what the client rebuilt with the run's stored log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright import events as ev
from boxwright.events import Event
from boxwright.runs import format_offset
from tests.fixtures import DEFAULT_CLAUDE_BIN, find_claude
from tests.fixtures.fake_model import FakeModelServer, HttpError, Step, Text, ToolCall, _handler_for
from tests.support.replicas import record_row, stored_log, wait_for
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]
AGUI_DIR = ROOT / "tests" / "agui"
NPM_ENV = "BOXWRIGHT_AGUI_NPM"
DEFAULT_NPM_DIR = "/opt/boxwright-agui"
AGENT_BIN = str(Path(DEFAULT_CLAUDE_BIN).parent)
LEASE_MS = 1500
PAUSE = "\u23f8"  # a text delta holding this makes the fake model wait for the test before the rest
MARKER = f"9{uuid.uuid4().int % 10**8:08d}"  # `sleep 600.<marker>`: a tool process nobody else runs

SCRIPTS: dict[str, list[Step]] = {
    "full": [
        ToolCall("Bash", {"command": "echo hello-agui", "description": "say hello"}, text="Let me look around."),
        ToolCall("mcp__boxwright__get_todos", {"status": "open"}),
        Text("You have two todos: write the spec, ship it."),
    ],
    "slow": [
        # Not a bare sleep: claude refuses a standalone long sleep as a tool call.
        ToolCall("Bash", {"command": f"echo waiting && sleep 600.{MARKER} && echo done", "description": "wait"}),
        Text("never said"),
    ],
    "broken": [HttpError(400, "the fake model refuses this request")],
    "frontend": [
        ToolCall("mcp__boxwright__get_weather", {"city": "Paris"}),
        Text("never said: the client has the turn"),
    ],
    "frontend-answered": [Text("It is 21 degrees in Paris.")],
    "approval": [
        ToolCall("mcp__boxwright__ask_person", {"kind": "command", "target": "rm -rf build", "reason": "clean up"}),
        Text("The person allowed it, so I cleaned up."),
    ],
    "handover": [Text(f"Taking over {PAUSE} mid message, then the rest of the answer arrives from the successor.")],
}


class PausingModel(FakeModelServer):
    """The fake model, holding a streamed text right after the delta that carries ``PAUSE`` until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(SCRIPTS)
        self.gate = threading.Event()
        self.paused = threading.Event()

    def start(self) -> str:
        if self._httpd is None:
            from http.server import ThreadingHTTPServer

            model = self

            class Handler(_handler_for(self)):  # type: ignore[misc]
                def _event(self, name: str | None, obj: Any) -> None:
                    super()._event(name, obj)
                    delta = obj.get("delta") if isinstance(obj, dict) else None
                    if name == "content_block_delta" and isinstance(delta, dict) and PAUSE in delta.get("text", ""):
                        model.paused.set()
                        model.gate.wait(120)

            self._stopping.clear()
            httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            httpd.daemon_threads = True
            self._httpd = httpd
            self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
            self._thread.start()
        return self.base_url

    def stop(self) -> None:
        self.gate.set()
        super().stop()


class AppProcess:
    """``tests/agui/app.py`` as a real process over ``tmp/agui.db``."""

    def __init__(self, name: str, tmp: Path, claude: str, model: FakeModelServer) -> None:
        self.name = name
        self.db = tmp / "agui.db"
        self.log_path = tmp / f"{name}.log"
        home = tmp / f"home-{name}"  # concurrent claude processes must not share one ~/.claude.json
        home.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PATH": f"{AGENT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        env.pop("BOXWRIGHT_FAULT", None)
        argv = [sys.executable, "-m", "tests.agui.app", "--db", str(tmp / "agui.db"), "--base-dir", str(tmp / "sb")]
        argv += ["--claude", claude, "--home", str(home), "--lease-ms", str(LEASE_MS)]
        with open(self.log_path, "ab") as stderr:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening "), f"{name} did not start: {line!r}\n{self.logs()}"
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _node_modules() -> Path:
    root = Path(os.environ.get(NPM_ENV, DEFAULT_NPM_DIR))
    if shutil.which("node") is None:
        missing("`node` is not installed (Debian: apt-get install nodejs npm)")
    if not (root / "node_modules" / "@ag-ui" / "client").is_dir():
        missing(f"the AG-UI clients are not installed in {root} (cp tests/agui/package.json there; npm install)")
    return root / "node_modules"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, PausingModel, str]]:
    """The node project (clients.mjs beside the pinned node_modules), the fake model and the claude binary."""
    node_modules = _node_modules()
    claude = find_claude()
    if claude is None:
        missing("the `claude` CLI is not installed (npm install @anthropic-ai/claude-code)")
    tmp = tmp_path_factory.mktemp("agui")
    project = tmp / "clients"
    project.mkdir()
    shutil.copy(AGUI_DIR / "clients.mjs", project / "clients.mjs")
    (project / "node_modules").symlink_to(node_modules, target_is_directory=True)
    model = PausingModel()
    model.start()
    try:
        yield project, model, claude
    finally:
        model.stop()


@pytest.fixture(scope="module")
def shared(stack: tuple[Path, PausingModel, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    """One app process for the tests that kill nothing (each starts its own threads and runs)."""
    _project, model, claude = stack
    proc = AppProcess("shared", tmp_path_factory.mktemp("agui-app"), claude, model)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def app(tmp: Path, claude: str, model: FakeModelServer, name: str = "a") -> Iterator[AppProcess]:
    proc = AppProcess(name, tmp, claude, model)
    try:
        yield proc
    finally:
        proc.stop()


def node(project: Path, scenario: str, args: dict[str, Any], timeout: float = 120) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["node", str(project / "clients.mjs"), scenario, json.dumps(args)],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def result_of(proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, f"node exited {proc.returncode}\n{err.decode(errors='replace')[-3000:]}"
    parsed: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return parsed


def stored(db: Path, run_id: str) -> list[tuple[str, Event]]:
    """Every stored (offset, event) of a run, read straight from the SQLite file."""
    return [(format_offset(run_id, seq), event) for seq, event in stored_log(db, run_id)]


def expected_messages(events: list[Event]) -> dict[str, Any]:
    """What a client must rebuild from a run's events: texts by message id, tool calls, tool results."""
    texts: dict[str, str] = {}
    calls: dict[str, tuple[str, str]] = {}
    results: dict[str, str] = {}
    for event in events:
        if isinstance(event, ev.TextMessageStartEvent):
            texts.setdefault(event.message_id, "")
        elif isinstance(event, ev.TextMessageContentEvent):
            texts[event.message_id] = texts.get(event.message_id, "") + event.delta
        elif isinstance(event, ev.ToolCallStartEvent):
            calls[event.tool_call_id] = (event.tool_call_name, "")
        elif isinstance(event, ev.ToolCallArgsEvent):
            name, args = calls[event.tool_call_id]
            calls[event.tool_call_id] = (name, args + event.delta)
        elif isinstance(event, ev.ToolCallResultEvent):
            content = event.content
            results[event.tool_call_id] = content if isinstance(content, str) else json.dumps(content)
    return {"texts": texts, "calls": calls, "results": results}


def rebuilt(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The same view of the messages ``HttpAgent`` rebuilt."""
    texts = {m["id"]: m.get("content") or "" for m in messages if m["role"] == "assistant" and m.get("content")}
    calls = {
        c["id"]: (c["function"]["name"], c["function"]["arguments"])
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("toolCalls") or []
    }
    results = {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}
    return {"texts": texts, "calls": calls, "results": results}


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
    return found


def _ids(name: str) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"t-{name}-{suffix}", f"r-{name}-{suffix}"


def _assert_client_saw_the_log(result: dict[str, Any], log: list[tuple[str, Event]]) -> None:
    assert result["error"] is None or result["error"]["name"] != "AGUIError", result["error"]
    assert [e["type"] for e in result["events"]] == [e.type for _, e in log], "every stored event, once, in order"


def test_httpagent_verifies_and_rebuilds_a_run_with_text_a_shell_tool_and_a_host_tool(
    stack: tuple[Path, PausingModel, str], shared: AppProcess
) -> None:
    project, _model, _claude = stack
    thread_id, run_id = _ids("full")
    with contextlib.nullcontext(shared) as a:
        result = result_of(
            node(
                project,
                "httpagent",
                {"url": a.url, "threadId": thread_id, "runId": run_id, "prompt": "[[script:full]] what is on my list?"},
            )
        )
        log = stored(shared.db, run_id)
        logs = a.logs()
    assert result["error"] is None, (result["error"], logs)
    _assert_client_saw_the_log(result, log)
    types = [e.type for _, e in log]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    want = expected_messages([e for _, e in log])
    got = rebuilt(result["messages"])
    assert got == want, (got, want)
    names = sorted(name for name, _ in want["calls"].values())
    assert names == ["Bash", "get_todos"], names  # the host tool under its own name
    assert any("hello-agui" in r for r in want["results"].values()), "the shell tool's output came back"
    assert any("write the spec" in r for r in want["results"].values()), "the host tool's result came back"
    assert "two todos" in "".join(want["texts"].values())
    assert result["messages"][0] == {"id": "u-1", "role": "user", "content": "[[script:full]] what is on my list?"}
    assert (record_row(shared.db, run_id) or {}).get("status") == "completed"


def test_httpagent_verifies_a_cancelled_run_and_a_failed_run(
    stack: tuple[Path, PausingModel, str], shared: AppProcess
) -> None:
    project, _model, _claude = stack
    db = shared.db
    cancelled_thread, cancelled = _ids("cancel")
    failed_thread, failed = _ids("fail")
    with contextlib.nullcontext(shared) as a:
        client = node(
            project,
            "httpagent",
            {"url": a.url, "threadId": cancelled_thread, "runId": cancelled, "prompt": "[[script:slow]] wait a while"},
        )
        wait_for("claude's tool call running", lambda: _processes_with(f"sleep 600.{MARKER}"), 90)
        response = httpx.post(f"{a.url}/runs/{cancelled}/cancel", timeout=30)
        assert response.status_code == 202, response.text
        cancel_result = result_of(client)
        fail_result = result_of(
            node(
                project,
                "httpagent",
                {"url": a.url, "threadId": failed_thread, "runId": failed, "prompt": "[[script:broken]] fail please"},
            )
        )
        cancel_log, fail_log = stored(db, cancelled), stored(db, failed)
        logs = a.logs()
    for result, log, code in ((cancel_result, cancel_log, "cancelled"), (fail_result, fail_log, None)):
        _assert_client_saw_the_log(result, log)
        # The verifier accepts a run that ends in RUN_ERROR (with a tool call or a message left open).
        assert result["error"] is None, (result["error"], logs)
        assert result["events"][-1]["type"] == "RUN_ERROR"
        assert log[0][1].type == "RUN_STARTED" and log[-1][1].type == "RUN_ERROR", [e.type for _, e in log]
        if code is not None:
            assert isinstance(log[-1][1], ev.RunErrorEvent) and log[-1][1].code == code
        assert rebuilt(result["messages"]) == expected_messages([e for _, e in log])
    assert (record_row(db, cancelled) or {}).get("status") == "aborted"
    assert (record_row(db, failed) or {}).get("status") == "failed"
    wait_for("the cancelled tool's process gone", lambda: not _processes_with(f"sleep 600.{MARKER}"), 15)


def test_httpagent_verifies_a_run_taken_over_by_a_second_process_mid_message(
    stack: tuple[Path, PausingModel, str], tmp_path: Path
) -> None:
    """A dies inside a text message; the client's answer continues on B's tail route (Last-Event-ID), B
    takes the run over from its journal, and the client's verifier accepts the whole spliced stream. A
    second client joining B mid-message (the same RunAgentInput, Last-Event-ID) gets the message re-opened."""
    project, model, claude = stack
    db = tmp_path / "agui.db"
    thread_id, run_id = _ids("handover")
    model.gate.clear()
    model.paused.clear()
    prompt = "[[script:handover]] tell me something"
    with app(tmp_path, claude, model, "a") as a, app(tmp_path, claude, model, "b") as b:
        client = node(
            project,
            "httpagent",
            {"url": a.url, "threadId": thread_id, "runId": run_id, "prompt": prompt, "resume": b.url},
        )

        def mid_message() -> list[tuple[str, Event]] | None:
            log = stored(db, run_id)
            return log if any(PAUSE in getattr(e, "delta", "") for _, e in log) else None

        before = wait_for("the first half of the message stored", mid_message, 90)
        pause_at, opened = next((o, e) for o, e in before if PAUSE in getattr(e, "delta", ""))
        assert isinstance(opened, ev.TextMessageContentEvent)
        # The model holds the rest of the message: A dies inside it, whatever else it logged meanwhile.
        a.kill()
        assert not any(isinstance(e, ev.TextMessageEndEvent) for _, e in stored(db, run_id)), "A died mid-message"
        model.gate.set()  # the agent, outliving A in its sandbox, gets the rest of the answer
        result = result_of(client)
        wait_for("B's terminal record", lambda: (record_row(db, run_id) or {}).get("status") == "completed", 60)
        log = stored(db, run_id)
        # A fresh client joining at the mid-message offset: RUN_STARTED and TEXT_MESSAGE_START come first.
        joined = result_of(
            node(
                project,
                "httpagent",
                {
                    "url": b.url,
                    "threadId": thread_id,
                    "runId": run_id,
                    "prompt": prompt,
                    "headers": {"Last-Event-ID": pause_at},
                },
            )
        )
        logs = f"A: {a.logs()}\nB: {b.logs()}"
    assert result["error"] is None, (result, logs)
    # The client's answer broke when A died and went on from the last id it had, one A had stored.
    resumed_from = result["splices"][-1].get("resumeFrom") if result["splices"] else None
    assert resumed_from in {offset for offset, _ in before}, result["splices"]
    _assert_client_saw_the_log(result, log)
    assert (record_row(db, run_id) or {}).get("driver_epoch") == 2, "B drove the rest"
    text = "".join(getattr(e, "delta", "") for _, e in log if e.type == "TEXT_MESSAGE_CONTENT")
    handover = SCRIPTS["handover"][0]
    assert isinstance(handover, Text) and text == handover.text, "every delta once, across the handover"
    assert rebuilt(result["messages"]) == expected_messages([e for _, e in log])
    assert joined["error"] is None, joined["error"]
    after = [e for offset, e in log if offset > pause_at]
    assert [e["type"] for e in joined["events"]] == ["RUN_STARTED", "TEXT_MESSAGE_START", *[e.type for e in after]]
    rest = "".join(getattr(e, "delta", "") for e in after if e.type == "TEXT_MESSAGE_CONTENT")
    assert rebuilt(joined["messages"])["texts"] == {opened.message_id: rest}


def test_tanstack_chat_client_rebuilds_the_run_over_sse_and_over_the_durable_stream(
    stack: tuple[Path, PausingModel, str], shared: AppProcess
) -> None:
    project, _model, _claude = stack
    thread_id, _ = _ids("tanstack")
    prompt = "[[script:full]] what is on my list?"
    with contextlib.nullcontext(shared) as a:
        first = result_of(node(project, "tanstack", {"url": a.url, "threadId": thread_id, "prompt": prompt}))
        run_id = first["runId"]
        assert run_id, first
        both = result_of(
            node(
                project,
                "tanstack",
                {"url": a.url, "threadId": f"{thread_id}-2", "prompt": prompt, "durableRunId": run_id},
            )
        )
        log = stored(shared.db, run_id)
        logs = a.logs()
    print("tanstack timings (ms):", first["timings"], both["timings"])
    want = expected_messages([e for _, e in log])
    for view in (first["sse"], both["durable"]):
        assert view["error"] is None, (view["error"], logs)
        parts = [p for m in view["messages"] if m["role"] == "assistant" for p in m["parts"]]
        said = "".join(p.get("content", "") for p in parts if p["type"] == "text")
        assert said == "".join(want["texts"].values()), (said, want["texts"])
        called = sorted(p["name"] for p in parts if p["type"] == "tool-call")
        assert called == sorted(name for name, _ in want["calls"].values()), parts


def test_a_frontend_tool_is_called_by_the_agent_and_answered_by_the_client(
    stack: tuple[Path, PausingModel, str], shared: AppProcess
) -> None:
    """AG-UI semantics: the run ends after the frontend tool call (RUN_FINISHED, that call pending); the
    client's next RunAgentInput carries the tool result and starts the next run, which uses it."""
    project, model, _claude = stack
    db = shared.db
    thread_id, run_id = _ids("frontend")
    tools = [
        {
            "name": "get_weather",
            "description": "The weather in a city, as the user's device reports it.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    args = {
        "url": "",
        "threadId": thread_id,
        "runIds": [run_id, f"{run_id}-2"],
        "prompt": "[[script:frontend]] what is the weather in Paris?",
        "tools": tools,
        "answer": "[[script:frontend-answered]] 21 degrees and sunny",
    }
    with contextlib.nullcontext(shared) as a:
        result = result_of(node(project, "turns", {**args, "url": a.url}))
        first_log, second_log = stored(db, run_id), stored(db, f"{run_id}-2")
        requests = model.model_requests()
        logs = a.logs()
    first, second = result["runs"]
    assert first["error"] is None and second["error"] is None, (first["error"], second["error"], logs)
    _assert_client_saw_the_log(first, first_log)
    _assert_client_saw_the_log(second, second_log)
    call = next(e for _, e in first_log if isinstance(e, ev.ToolCallStartEvent))
    assert call.tool_call_name == "get_weather", call
    # The run ended right after the call: RUN_FINISHED with the call pending, no result, nothing after.
    types = [e.type for _, e in first_log]
    assert types[-2:] == ["TOOL_CALL_END", "RUN_FINISHED"] and "TOOL_CALL_RESULT" not in types, types
    assert first["finished"] == {"outcome": "success", "pending": [call.tool_call_id]}, first["finished"]
    assert (record_row(db, run_id) or {}).get("status") == "completed"
    assert json.loads(rebuilt(first["messages"])["calls"][call.tool_call_id][1]) == {"city": "Paris"}
    # The next run got the client's answer and finished the turn with it.
    assert "21 degrees and sunny" in json.dumps(requests[-1].body["messages"])
    said = "".join(rebuilt(second["messages"])["texts"].values())
    assert "It is 21 degrees in Paris." in said, said
    assert (record_row(db, f"{run_id}-2") or {}).get("status") == "completed"
    assert not any("never said" in getattr(e, "delta", "") for _, e in first_log)


def test_an_approval_request_is_an_ag_ui_interrupt_and_the_clients_resume_answers_it(
    stack: tuple[Path, PausingModel, str], shared: AppProcess
) -> None:
    """The agent asks a person (the ask_person host tool, the policy says ask): the client's run finishes
    with an interrupt; its next input's resume answers it, and that run is the same agent going on."""
    project, _model, _claude = stack
    thread_id, run_id = _ids("approval")
    args = {
        "url": shared.url,
        "threadId": thread_id,
        "runIds": [run_id, f"{run_id}-resumed"],
        "prompt": "[[script:approval]] clean up the build",
        "payload": {"decision": "allow"},
    }
    result = result_of(node(project, "turns", args))
    log = stored(shared.db, run_id)
    first, second = result["runs"]
    assert first["error"] is None and second["error"] is None, (first, second, shared.logs())
    assert first["finished"]["outcome"] == "interrupt", first["finished"]
    (asked,) = first["finished"]["interrupts"]
    requested = next(e for _, e in log if isinstance(e, ev.CustomEvent) and e.name == "approval-requested")
    assert isinstance(requested.value, dict) and asked["id"] == requested.value["approvalId"]
    assert asked["reason"] == "approval" and "rm -rf build" in asked["message"]
    # The first answer stops at the question; the second is the same run's log from there, under its own id.
    types = [e["type"] for e in first["events"]]
    assert types[-2:] == ["CUSTOM", "RUN_FINISHED"], types
    resumed = [e["type"] for e in second["events"]]
    assert resumed[0] == "RUN_STARTED" and second["events"][0]["runId"] == f"{run_id}-resumed"
    assert resumed[-1] == "RUN_FINISHED" and second["events"][-1]["runId"] == f"{run_id}-resumed"
    stored_types = [e.type for _, e in log]
    assert types[:-1] + resumed[1:] == stored_types, "the two answers split the one run's log"
    resolved = next(e for _, e in log if isinstance(e, ev.CustomEvent) and e.name == "approval-resolved")
    assert (
        isinstance(resolved.value, dict) and resolved.value["decision"] == "allow" and resolved.value["by"] == "person"
    )
    said = "".join(rebuilt(second["messages"])["texts"].values())
    assert "The person allowed it" in said, said
    assert (record_row(shared.db, run_id) or {}).get("status") == "completed"
