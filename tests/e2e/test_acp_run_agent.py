"""Real ACP agents (claude-agent-acp, codex-acp, Gemini CLI --acp) through run_agent, against the fake model.

Each agent, in a local-process and a bubblewrap sandbox: runs a shell command that edits a file of a
cloned repository (the diff is asserted), calls a host Python tool over the bridge (its result reaches
the fake model's next request), and is cancelled mid-command with no process left. The policy
``allow echo *, deny rm *, default ask`` through ``session/request_permission``: test_policy_run_agent.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import EnsureContext, Lifecycle, define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    encode_event,
)
from boxwright.harnesses.acp import AcpHarness, acp
from boxwright.harnesses.gemini_cli import gemini_cli
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge import tool
from boxwright.workspace import define_workspace, git_source
from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
from tests.support.require import AGENT_BIN, agent_cli, missing

AGENTS = "/opt/boxwright-agents"
EDIT = "sed -i 's/hello/hello from acp/' README.md"
PROVIDERS = ["local-process", "bubblewrap"]
ACP_AGENTS = ["claude-agent-acp", "codex-acp", "gemini"]
RUN_TIMEOUT = 120.0  # seconds; a healthy run takes 2-6 s here


def _shell(agent: str, command: str) -> ToolCall:
    if agent == "gemini":
        return ToolCall("run_shell_command", {"command": command, "description": "run it"})
    if agent == "codex-acp":
        return ToolCall("exec_command", {"cmd": command})
    return ToolCall("Bash", {"command": command, "description": "run it"})


def _bridge_call(agent: str) -> ToolCall:
    if agent == "gemini":
        return ToolCall("mcp_boxwright_get_todos", {"status": "open"})
    if agent == "codex-acp":
        return ToolCall("get_todos", {"status": "open"}, namespace="mcp__boxwright")
    return ToolCall("mcp__boxwright__get_todos", {"status": "open"})


def _harness(agent: str, model: FakeModelServer, home: Path, *, ask: bool = False, kind: str = "") -> AcpHarness:
    """``home`` is on the host; a bubblewrap agent gets a fresh one in its sandbox's own /tmp instead."""
    binary = agent_cli(agent)
    agent_home = "/tmp/agent-home" if kind == "bubblewrap" else str(home)
    # Every process the agent starts inherits this: how the test finds anything left behind.
    mark = {"BOXWRIGHT_TEST_MARK": str(home.parent)}
    if agent == "gemini":
        env = {**mark, "HOME": agent_home, "GEMINI_API_KEY": "sk-test", "GOOGLE_GEMINI_BASE_URL": model.base_url}
        return gemini_cli("gemini-2.5-flash", executable=binary, env=env)
    if agent == "claude-agent-acp":
        env = {
            **mark,
            "HOME": agent_home,
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "IS_SANDBOX": "1",  # measured: as root the adapter's bundled CLI refuses to start without it
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        return acp([binary], name=agent, env=env)
    # All config by -c, so CODEX_HOME may be any fresh directory (made by the wrapper, in the sandbox).
    config = {
        "model": '"gpt-5.5"',
        "model_provider": '"fake"',
        "model_providers.fake.name": '"Fake"',
        "model_providers.fake.base_url": f'"{model.base_url}/v1"',
        "model_providers.fake.env_key": '"FAKE_API_KEY"',
        "model_providers.fake.wire_api": '"responses"',
        "model_providers.fake.request_max_retries": "0",
        "model_providers.fake.stream_max_retries": "0",
        # Our sandbox is the layer that holds: codex's own bwrap is off; ``untrusted`` makes it ask us.
        "sandbox_mode": '"danger-full-access"',
        "approval_policy": '"untrusted"' if ask else '"never"',
    }
    argv = ["sh", "-c", 'mkdir -p "$CODEX_HOME" "$TMPDIR" && exec "$0" "$@"', binary]
    for key, value in config.items():
        argv += ["-c", f"{key}={value}"]
    env = {
        **mark,
        "HOME": agent_home,
        "CODEX_HOME": f"{agent_home}/codex",
        "FAKE_API_KEY": "sk-test",
        "TMPDIR": f"{agent_home}/tmp",
    }
    return acp(argv, name=agent, env=env)


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@e.com"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


@contextlib.contextmanager
def _model(scripts: dict[str, list[Step]]) -> Iterator[FakeModelServer]:
    server = FakeModelServer(scripts)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _provider(kind: str, tmp_path: Path, origin: Path) -> object:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "sandboxes")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    binds = [str(origin), AGENTS]
    return bubblewrap_sandbox(base_dir=tmp_path / "sandboxes", ro_binds=[b for b in binds if os.path.isdir(b)])


async def _collect(events: object) -> list[Event]:
    async def drain() -> list[Event]:
        return [event async for event in events]  # type: ignore[attr-defined]

    return await asyncio.wait_for(drain(), RUN_TIMEOUT)


def _types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def _agent_pids(tmp_path: Path) -> list[str]:
    """Live processes whose command line or environment mention this test's directory (agents, shells, sleeps)."""
    mine = str(tmp_path)
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (mine in cmdline or mine in environ):
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def _none_left(tmp_path: Path, settle: float = 5.0) -> list[str]:
    deadline = time.monotonic() + settle
    while (found := _agent_pids(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.fixture(autouse=True)
def _agents_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # codex-acp finds its platform binary, claude-agent-acp finds node, through PATH.
    monkeypatch.setenv("PATH", f"{AGENT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")


@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize("agent", ACP_AGENTS)
def test_acp_agent_edits_the_repo_with_a_shell_command(agent: str, kind: str, tmp_path: Path, origin: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with _model({"edit": [_shell(agent, EDIT), Text("I edited it.")]}) as model:
        sandbox = define_sandbox(
            "acp", _provider(kind, tmp_path, origin), define_workspace(source=git_source(f"file://{origin}"))
        )  # type: ignore[arg-type]
        store = MemoryInstanceStore()

        async def main() -> tuple[list[Event], str]:
            events = await _collect(
                run_agent(
                    sandbox,
                    _harness(agent, model, home, kind=kind),
                    "[[script:edit]] change the greeting in README.md",
                    thread_id="t-acp",
                    run_id="r-acp",
                    store=store,
                )
            )
            again = await sandbox.ensure_existing(EnsureContext(thread_id="t-acp", run_id="check", store=store))
            assert again is not None
            readme = await again.handle.fs.read("/workspace/README.md")
            await again.handle.destroy()
            return events, readme

        events, readme = asyncio.run(main())
        types = _types(events)
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", events[-1]
        assert types.count("RUN_STARTED") == 1 and "RUN_ERROR" not in types
        session = [e for e in events if isinstance(e, CustomEvent) and e.name == f"{agent}.session-id"]
        assert len(session) == 1 and session[0].value["sessionId"]
        start = next(e for e in events if isinstance(e, ToolCallStartEvent))
        assert start.tool_call_name == "execute"
        result = next(e for e in events if isinstance(e, ToolCallResultEvent))
        assert result.tool_call_id == start.tool_call_id and result.state != "output-error"
        assert "I edited it." in "".join(getattr(e, "delta", "") for e in events if e.type == "TEXT_MESSAGE_CONTENT")
        assert readme == "hello from acp\n"
        diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
        assert "-hello" in diff and "+hello from acp" in diff and "README.md" in diff
        finished = events[-1]
        assert isinstance(finished, RunFinishedEvent) and finished.finish_reason == "stop"
        assert "I edited it." not in str(model.model_requests()[0].body)
    assert _none_left(tmp_path) == []


@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize("agent", ACP_AGENTS)
def test_acp_agent_calls_a_host_python_tool_over_the_bridge(
    agent: str, kind: str, tmp_path: Path, origin: Path
) -> None:
    calls: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the app's todos."""
        calls.append(status)
        return f"- write the spec [{status}]\n- ship it [{status}]"

    home = tmp_path / "home"
    home.mkdir()
    with _model({"todos": [_bridge_call(agent), Text("You have two todos.")]}) as model:
        sandbox = define_sandbox(
            "acp", _provider(kind, tmp_path, origin), lifecycle=Lifecycle(destroy_on_complete=True)
        )  # type: ignore[arg-type]
        events = asyncio.run(
            _collect(
                run_agent(
                    sandbox,
                    _harness(agent, model, home, kind=kind),
                    "[[script:todos]] what is on my list?",
                    thread_id="t-tools",
                    tools=[get_todos],
                    store=MemoryInstanceStore(),
                )
            )
        )
        requests = model.model_requests()
    types = _types(events)
    assert types[-1] == "RUN_FINISHED", types
    assert calls == ["open"], "the host tool ran once, with the agent's arguments"
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "write the spec" in str(result.content)
    assert "write the spec [open]" in str(requests[-1].body), "the tool's result reached the model"
    assert b"Bearer" not in b"".join(encode_event(e) for e in events)
    assert _none_left(tmp_path) == []


@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize("agent", ACP_AGENTS)
def test_cancelled_acp_run_leaves_no_process(agent: str, kind: str, tmp_path: Path, origin: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    marker = f"sleep 600 # {tmp_path.name}"
    with _model({"slow": [_shell(agent, marker), Text("never")]}) as model:
        sandbox = define_sandbox("acp", _provider(kind, tmp_path, origin))  # type: ignore[arg-type]
        controller = AbortController()

        async def main() -> list[Event]:
            events: list[Event] = []

            async def drive() -> None:
                async for event in run_agent(
                    sandbox,
                    _harness(agent, model, home, kind=kind),
                    "[[script:slow]] wait a long time",
                    thread_id="t-cancel",
                    store=MemoryInstanceStore(),
                    signal=controller.signal,
                ):
                    events.append(event)

            async def abort_once_the_command_runs() -> None:
                # Gemini CLI reports a tool call only once it has finished: wait for the model's tool call instead.
                await asyncio.to_thread(model.wait_for_request, lambda r: r.step == 0, RUN_TIMEOUT)
                await asyncio.sleep(3.0)
                controller.abort("boxwright:cancel-requested")

            watcher = asyncio.ensure_future(abort_once_the_command_runs())
            try:
                await asyncio.wait_for(drive(), RUN_TIMEOUT)
            finally:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
            return events

        started = time.monotonic()
        events = asyncio.run(main())
        took = time.monotonic() - started
    types = _types(events)
    assert types[-1] == "RUN_ERROR" and types.count("RUN_ERROR") == 1, types
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "cancelled"
    assert took < 60, took
    assert _none_left(tmp_path) == []
    base = tmp_path / "sandboxes"
    assert not base.exists() or os.listdir(base) == [], "a cancelled run destroys its sandbox"


def test_a_journaled_acp_run_in_bubblewrap_talks_through_the_relay(tmp_path: Path, origin: Path) -> None:
    # Every bubblewrap command has its own pid namespace: the relay, not a pid, stops the agent (relay.py).
    agent = "claude-agent-acp"
    home = tmp_path / "home"
    home.mkdir()
    with _model({"edit": [_shell(agent, EDIT), Text("I edited it.")]}) as model:
        sandbox = define_sandbox(
            "acp",
            _provider("bubblewrap", tmp_path, origin),
            define_workspace(source=git_source(f"file://{origin}")),
            lifecycle=Lifecycle(destroy_on_complete=True),
        )  # type: ignore[arg-type]
        events = asyncio.run(
            _collect(
                run_agent(
                    sandbox,
                    _harness(agent, model, home, kind="bubblewrap"),
                    "[[script:edit]] change the greeting in README.md",
                    thread_id="t-relay",
                    run_id=f"r-relay-{tmp_path.name}",
                    store=MemoryInstanceStore(),
                    journal=JournalOptions(),
                )
            )
        )
    types = _types(events)
    assert types[-1] == "RUN_FINISHED" and "RUN_ERROR" not in types, events[-1]
    assert types.count("TOOL_CALL_START") == 1 and types.count("TOOL_CALL_RESULT") == 1
    diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
    assert "+hello from acp" in diff
    assert _none_left(tmp_path) == []
