"""Wall time of one trivial real-CLI run through run_agent, against the same CLI command run bare, per harness.

Each harness's real CLI runs against the same scripted fake model (one text reply), in one process,
interleaved round by round. "bare" starts exactly the argv and env the harness plans, with asyncio, and
reads stdout to the end; for an ACP agent (claude-agent-acp, codex-acp, gemini) bare is the smallest
client that gets the turn done (initialize, authenticate if the harness does, session/new, session/prompt,
then SIGTERM: ACP agents never exit by themselves). "run_agent" adds ensure(), the workspace watcher,
translation, the diff and the lifecycle. grok is the recording-faithful fake CLI (tests/fixtures/fake_grok.py):
no real grok is installable here. Goal (issues 11 and 16): ratio <= 1.1 for claude on local-process,
<= 1.2 for every harness. bench/run_tail.py isolates the end of a run.

Run: .venv/bin/python bench/harness_overhead.py [--rounds 10] [--harness claude-code,codex,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boxwright.agent import run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import RunFinishedEvent, create_run_scoped_id_gen
from boxwright.harnesses.acp import AcpHarness
from boxwright.harnesses.base import HarnessContext
from boxwright.harnesses.claude_code import claude_code
from boxwright.harnesses.codex import codex
from boxwright.harnesses.grok_build import grok_build
from boxwright.harnesses.opencode import opencode
from boxwright.providers import local_process_sandbox
from boxwright.providers.local_process import CAPABILITIES
from boxwright.stores.memory import MemoryInstanceStore
from tests.fixtures import find_claude
from tests.fixtures.fake_model import FakeModelServer, Text
from tests.fixtures.record_agents import find_agent, opencode_config, opencode_env
from tests.support.agent_harnesses import claude_agent_acp_for, codex_acp_for, gemini_for

FAKE_GROK = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "fake_grok.py"

PROMPT = "[[script:hello]] say hello"


@dataclass
class Subject:
    """One harness as benchmarked: how to build it for a fake model and a HOME, and what a good bare run prints."""

    name: str
    find: Callable[[], str | None]
    build: Callable[[str, str, str], Any]  # (executable, model base URL, home) -> harness
    host_env: Callable[[str], dict[str, str]]
    success: bytes


def _codex(executable: str, base_url: str, home: str) -> Any:
    tmp = os.path.join(os.path.dirname(home), "codex-tmp")
    env = {"HOME": home, "CODEX_HOME": home, "TMPDIR": tmp, "CODEX_API_KEY": "sk-test"}
    return codex("gpt-5.5", executable=executable, base_url=base_url + "/v1", max_retries=0, env=env)


def _opencode(executable: str, base_url: str, home: str) -> Any:
    return opencode(
        "fake/fake-model", executable=executable, config=opencode_config(base_url), env=opencode_env(Path(home))
    )


SUBJECTS = [
    Subject(
        "claude-code",
        find_claude,
        lambda exe, url, home: claude_code(executable=exe, env={"HOME": home}),
        lambda url: {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-test"},
        b'"subtype":"success"',
    ),
    Subject("codex", lambda: find_agent("codex"), _codex, lambda url: {}, b'"type":"turn.completed"'),
    Subject("opencode", lambda: find_agent("opencode"), _opencode, lambda url: {}, b'"reason":"stop"'),
    Subject(
        "claude-agent-acp",
        lambda: find_agent("claude-agent-acp"),
        lambda exe, url, home: claude_agent_acp_for(url, home, exe),
        lambda url: {},
        b'"stopReason":"end_turn"',
    ),
    Subject(
        "codex-acp",
        lambda: find_agent("codex-acp"),
        lambda exe, url, home: codex_acp_for(url, home, exe),
        lambda url: {},
        b'"stopReason":"end_turn"',
    ),
    Subject(
        "gemini",
        lambda: find_agent("gemini"),
        lambda exe, url, home: gemini_for(url, home, exe),
        lambda url: {},
        b'"stopReason":"end_turn"',
    ),
    Subject(
        "grok-fake",
        lambda: f"{sys.executable} {FAKE_GROK}",
        lambda exe, url, home: grok_build(executable=exe, env={"HOME": home}),
        lambda url: {},
        b'"type": "end"',
    ),
]


async def _acp_turn(harness: AcpHarness, proc: asyncio.subprocess.Process, workdir: str) -> bytes:
    """The smallest ACP client: one turn, every permission allowed; returns what the agent printed."""
    assert proc.stdin is not None and proc.stdout is not None
    seen = bytearray()

    async def ask(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        await proc.stdin.drain()
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the agent exited during {method}")
            seen.extend(line)
            message = json.loads(line)
            if message.get("id") == rid and "method" not in message:
                return message  # type: ignore[no-any-return]
            if "method" in message and "id" in message:  # a permission request: allow it
                options = message.get("params", {}).get("options", [])
                chosen = next((o["optionId"] for o in options if o.get("kind") == "allow_once"), None)
                result = {"outcome": {"outcome": "selected", "optionId": chosen}}
                reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
                proc.stdin.write(json.dumps(reply).encode() + b"\n")
                await proc.stdin.drain()

    caps = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
    await ask(1, "initialize", {"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "bench"}})
    rid = 2
    if harness.auth_method is not None:
        await ask(rid, "authenticate", {"methodId": harness.auth_method})
        rid += 1
    session = (await ask(rid, "session/new", {"cwd": workdir, "mcpServers": []}))["result"]["sessionId"]
    prompt = [{"type": "text", "text": PROMPT}]
    await ask(rid + 1, "session/prompt", {"sessionId": session, "prompt": prompt})
    return bytes(seen)


async def bare(subject: Subject, harness: Any, host_env: dict[str, str], workdir: str) -> float:
    ctx = HarnessContext(
        run_id="bare",
        thread_id="t",
        prompt=PROMPT,
        system_prompt=None,
        capabilities=CAPABILITIES,
        provider="local-process",
        gen_id=create_run_scoped_id_gen("bare"),
        host_env=host_env,
        file_suffix="bare",
    )
    plan = harness.plan(ctx)
    started = time.perf_counter()
    if isinstance(harness, AcpHarness):
        proc = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            plan.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=workdir,
            env={**os.environ, **plan.env},
            start_new_session=True,  # codex-acp's node launcher keeps its binary as a child: stop the group
        )
        try:
            out = await _acp_turn(harness, proc, workdir)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            await proc.wait()
        elapsed = time.perf_counter() - started
        assert subject.success in out, out[-500:]
        return elapsed
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        plan.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=workdir,
        env={**os.environ, **plan.env},
    )
    out, _ = await proc.communicate((plan.stdin or "").encode())
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0 and subject.success in out, out[-500:]
    return elapsed


async def ours(harness: Any, host_env: dict[str, str], base: str, n: int) -> float:
    sandbox = define_sandbox(
        "bench", local_process_sandbox(base_dir=base), lifecycle=Lifecycle(destroy_on_complete=True)
    )
    started = time.perf_counter()
    last = None
    async for event in run_agent(
        sandbox, harness, PROMPT, thread_id=f"t{n}", store=MemoryInstanceStore(), host_env=host_env
    ):
        last = event
    elapsed = time.perf_counter() - started
    assert isinstance(last, RunFinishedEvent), last
    return elapsed


async def measure(subject: Subject, executable: str, rounds: int) -> tuple[float, float]:
    with FakeModelServer({"hello": [Text("Hello!")]}) as model, tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        workdir = os.path.join(tmp, "bare")
        os.makedirs(workdir)
        harness = subject.build(executable, model.base_url, home)
        host_env = subject.host_env(model.base_url)
        await bare(subject, harness, host_env, workdir)  # warm the binary's page cache and the CLI's HOME
        a, b = [], []
        for n in range(rounds):
            b.append(await bare(subject, harness, host_env, workdir))
            a.append(await ours(harness, host_env, os.path.join(tmp, "sb"), n))
    return statistics.median(a), statistics.median(b)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--harness", default=",".join(s.name for s in SUBJECTS), help="comma-separated names")
    args = parser.parse_args()
    wanted = [name.strip() for name in args.harness.split(",") if name.strip()]
    unknown = set(wanted) - {s.name for s in SUBJECTS}
    if unknown:
        raise SystemExit(f"unknown harness(es): {', '.join(sorted(unknown))}")
    print(f"one trivial run per round, {args.rounds} rounds, median; local-process")
    print(f"  {'harness':16s} {'bare':>10s} {'run_agent':>10s} {'ratio':>6s}")
    for subject in (s for s in SUBJECTS if s.name in wanted):
        executable = subject.find()
        if executable is None:
            print(f"  {subject.name:16s} not installed (see deploy/agents/package.json)")
            continue
        ma, mb = await measure(subject, executable, args.rounds)
        print(f"  {subject.name:16s} {mb * 1e3:8.1f}ms {ma * 1e3:8.1f}ms {ma / mb:6.2f}", flush=True)
    print("  goal: ratio <= 1.2 for every harness (claude-code: <= 1.1)")


if __name__ == "__main__":
    asyncio.run(main())
