"""The end of a run: last agent output to RUN_FINISHED, for the command harness, against the bare command.

"bare" runs ``sh -c 'echo hi'`` with asyncio and measures from its last stdout chunk to its exit; "run_agent"
runs the same command through ``run_agent`` (local-process, file events on, the default) and measures, as
its consumer sees it, from the event carrying the agent's last output (its text) to RUN_FINISHED: the
agent's exit, the watcher's last look, the diff and the lifecycle. Goal (issue 11): tail under 20 ms.

Run: .venv/bin/python bench/run_tail.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boxwright.agent import run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import RunFinishedEvent, TextMessageContentEvent
from boxwright.harnesses.command import command_harness
from boxwright.providers import local_process_sandbox
from boxwright.stores.memory import MemoryInstanceStore

COMMAND = "echo hi"


async def bare(workdir: str) -> tuple[float, float]:
    """(last output to exit, whole run), seconds."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", COMMAND, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=workdir
    )
    assert proc.stdout is not None
    last = started
    while chunk := await proc.stdout.read(65536):
        assert chunk
        last = time.perf_counter()
    await proc.wait()
    ended = time.perf_counter()
    return ended - last, ended - started


async def ours(base: str, n: int) -> tuple[float, float]:
    sandbox = define_sandbox(
        "tail", local_process_sandbox(base_dir=base), lifecycle=Lifecycle(destroy_on_complete=True)
    )
    started = time.perf_counter()
    said: float | None = None
    finished: float | None = None
    stream = run_agent(sandbox, command_harness(COMMAND), "go", thread_id=f"t{n}", store=MemoryInstanceStore())
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            if isinstance(event, TextMessageContentEvent):
                said = time.perf_counter()
            elif isinstance(event, RunFinishedEvent):
                finished = time.perf_counter()
    assert said is not None and finished is not None, "the run said nothing or did not finish"
    return finished - said, finished - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = str(Path(tmp) / "bare")
        Path(workdir).mkdir()
        await bare(workdir)
        await ours(str(Path(tmp) / "sb"), -1)  # warm imports and caches
        bare_tail, bare_all, our_tail, our_all = [], [], [], []
        for n in range(args.rounds):
            tail, whole = await bare(workdir)
            bare_tail.append(tail)
            bare_all.append(whole)
            tail, whole = await ours(str(Path(tmp) / "sb"), n)
            our_tail.append(tail)
            our_all.append(whole)
    ms = 1e3
    print(f"command harness {COMMAND!r}, {args.rounds} rounds (median)")
    print("                              tail (last output -> end)   whole run")
    print(
        f"  bare sh -c                  {statistics.median(bare_tail) * ms:8.1f} ms          "
        f"{statistics.median(bare_all) * ms:8.1f} ms"
    )
    print(
        f"  run_agent (local-process)   {statistics.median(our_tail) * ms:8.1f} ms          "
        f"{statistics.median(our_all) * ms:8.1f} ms   (tail goal < 20 ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
