"""Cost of a sandbox exec and of streaming through a spawned process, against plain asyncio.

For each provider, side by side in one process:
  exec      handle.process.exec("true")             vs  asyncio.create_subprocess_exec of the same argv
  stream    100 MB through a spawned `cat` (stdin -> stdout, read concurrently)
                                                    vs  the same with a bare asyncio subprocess
The baseline starts exactly the argv the provider starts (`sh -c true`, or `bwrap ... sh -c true`),
so the ratio is our overhead, not the isolation's; bubblewrap's own cost is printed against `sh -c`.

Run: .venv/bin/python bench/exec_overhead.py [--execs 200] [--megabytes 100]
Goals (issue 2): exec ratio <= 1.3, streaming throughput ratio >= 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import SandboxHandle

CHUNK = b"x" * 65535 + b"\n"


async def bare_exec(argv: Sequence[str], cwd: str, env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    await proc.communicate()


async def bare_stream(argv: Sequence[str], cwd: str, env: dict[str, str], total: int) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=cwd, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def write() -> None:
        for _ in range(total // len(CHUNK)):
            stdin.write(CHUNK)
            await stdin.drain()
        stdin.close()

    async def read() -> int:
        got = 0
        while data := await stdout.read(65536):
            got += len(data)
        return got

    _, got = await asyncio.gather(write(), read())
    await proc.wait()
    return got


async def handle_stream(handle: SandboxHandle, total: int) -> int:
    proc = await handle.process.spawn("cat")

    async def write() -> None:
        for _ in range(total // len(CHUNK)):
            await proc.stdin.write(CHUNK)
        await proc.stdin.end()

    async def read() -> int:
        got = 0
        async for text in proc.stdout:
            got += len(text)
        return got

    _, got = await asyncio.gather(write(), read())
    await proc.wait()
    return got


async def timed(fn: Callable[[], Awaitable[object]], n: int) -> float:
    """Median seconds of n calls, interleaving is done by the caller."""
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


async def bench_provider(label: str, handle: SandboxHandle, execs: int, megabytes: int) -> None:
    launch = handle.process._launch  # type: ignore[attr-defined]
    argv, cwd, env = launch("true", None, None)
    sh_argv = ["sh", "-c", "true"]
    # Interleave rounds so drift in machine load hits both sides alike.
    ours, base, sh = [], [], []
    for _ in range(5):
        ours.append(await timed(lambda: handle.process.exec("true"), execs // 5))
        base.append(await timed(lambda: bare_exec(argv, cwd, dict(env)), execs // 5))
        sh.append(await timed(lambda: bare_exec(sh_argv, cwd, dict(env)), execs // 5))
    o, b, s = statistics.median(ours), statistics.median(base), statistics.median(sh)
    print(
        f"{label:14s} exec true      ours {o * 1e3:7.2f} ms   bare asyncio {b * 1e3:7.2f} ms   ratio {o / b:5.2f}"
        f"   (bare `sh -c true` {s * 1e3:6.2f} ms)"
    )

    total = megabytes * 1024 * 1024
    cat_argv, _, cat_env = launch("cat", None, None)
    rates_ours, rates_base = [], []
    for _ in range(3):
        t = time.perf_counter()
        got = await handle_stream(handle, total)
        rates_ours.append(got / (time.perf_counter() - t))
        t = time.perf_counter()
        got_b = await bare_stream(cat_argv, cwd, dict(cat_env), total)
        rates_base.append(got_b / (time.perf_counter() - t))
        assert got == got_b, (got, got_b)
    ro, rb = statistics.median(rates_ours), statistics.median(rates_base)
    print(
        f"{label:14s} stream {megabytes} MB  ours {ro / 1e6:7.1f} MB/s bare asyncio {rb / 1e6:7.1f} MB/s "
        f"ratio {ro / rb:5.2f}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()
    providers = [("local-process", local_process_sandbox())]
    if probe().available:
        providers.append(("bubblewrap", bubblewrap_sandbox()))
    else:
        print(f"bubblewrap     skipped: {probe().reason}")
    for label, provider in providers:
        handle = await provider.create()
        try:
            await bench_provider(label, handle, args.execs, args.megabytes)
        finally:
            await handle.destroy()


if __name__ == "__main__":
    asyncio.run(main())
