"""Wall time of one trivial real-CLI run through run_agent, against the same `claude` command run bare.

Both sides run the real `claude` CLI against the same scripted fake model (one text reply), in one process,
interleaved round by round. "bare" starts exactly the argv and env the harness plans, with asyncio, and
reads stdout to the end; "run_agent" adds ensure(), the workspace watcher, translation, the diff and the
lifecycle. Goal (issue 11): ratio <= 1.1 on local-process. bench/run_tail.py isolates the end of a run.

Run: .venv/bin/python bench/harness_overhead.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boxwright.agent import run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import RunFinishedEvent, create_run_scoped_id_gen
from boxwright.harnesses.base import HarnessContext
from boxwright.harnesses.claude_code import claude_code
from boxwright.providers import local_process_sandbox
from boxwright.providers.local_process import CAPABILITIES
from boxwright.stores.memory import MemoryInstanceStore
from tests.fixtures import find_claude
from tests.fixtures.fake_model import FakeModelServer, Text

PROMPT = "[[script:hello]] say hello"


async def bare(claude: str, home: str, host_env: dict[str, str], workdir: str) -> float:
    harness = claude_code(executable=claude, env={"HOME": home})
    ctx = HarnessContext(
        run_id="bare",
        thread_id="t",
        prompt=PROMPT,
        system_prompt=None,
        capabilities=CAPABILITIES,
        provider="local-process",
        gen_id=create_run_scoped_id_gen("bare"),
        host_env=host_env,
    )
    plan = harness.plan(ctx)
    started = time.perf_counter()
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
    assert proc.returncode == 0 and b'"subtype":"success"' in out, out[-500:]
    return elapsed


async def ours(claude: str, home: str, host_env: dict[str, str], base: str, n: int) -> float:
    sandbox = define_sandbox(
        "bench", local_process_sandbox(base_dir=base), lifecycle=Lifecycle(destroy_on_complete=True)
    )
    harness = claude_code(executable=claude, env={"HOME": home})
    started = time.perf_counter()
    last = None
    async for event in run_agent(
        sandbox, harness, PROMPT, thread_id=f"t{n}", store=MemoryInstanceStore(), host_env=host_env
    ):
        last = event
    elapsed = time.perf_counter() - started
    assert isinstance(last, RunFinishedEvent), last
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    claude = find_claude()
    if claude is None:
        raise SystemExit("claude CLI not found: npm install @anthropic-ai/claude-code (see deploy/agents)")
    with FakeModelServer({"hello": [Text("Hello!")]}) as model, tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        workdir = os.path.join(tmp, "bare")
        os.makedirs(workdir)
        host_env = {"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "sk-test"}
        await bare(claude, home, host_env, workdir)  # warm the binary's page cache
        a, b = [], []
        for n in range(args.rounds):
            b.append(await bare(claude, home, host_env, workdir))
            a.append(await ours(claude, home, host_env, os.path.join(tmp, "sb"), n))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"claude run, {args.rounds} rounds (median)")
    print(f"  bare asyncio subprocess   {mb * 1e3:8.1f} ms")
    print(f"  run_agent (local-process) {ma * 1e3:8.1f} ms")
    print(f"  ratio                     {ma / mb:8.2f}   (goal <= 1.1)")


if __name__ == "__main__":
    asyncio.run(main())
