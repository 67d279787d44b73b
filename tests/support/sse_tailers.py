"""Many concurrent SSE tailers of one live coordinator run, for the load bench and its bounded test.

``tail_one_run(url, tailers=N, lines=L)`` starts a run of ``TIMED_AGENT`` (a command harness agent
that waits for a go file, then prints ``L`` lines each stamped with ``time.time()``), opens ``N``
SSE tails of it (raw asyncio sockets: one connection each, no client library in the way), waits
until every tail is connected and has read the run's first events, samples the coordinator's
RSS, lets the agent go and reads every tail to its status frame. Delivery latency is a line's
arrival at a tailer minus the agent's stamp (one machine, one clock: loopback only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

# Prints its lines only once the go file exists, so every tailer is connected before the first one.
TIMED_AGENT = r"""
import os, sys, time
words = sys.stdin.read().split()
go, lines, gap = words[0], int(words[1]), float(words[2])
deadline = time.time() + 120
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
for i in range(lines):
    print(f"line {i} at {time.time():.6f}", flush=True)
    time.sleep(gap)
"""


def allow_open_files(tailers: int) -> None:
    """Raise this process's soft open-file limit (children inherit it) to what ``tailers`` tails need.

    Each tail is a socket here and one in the coordinator (each process has its own limit); a shell's
    default soft limit (often 1024) is below 1,000 tailers' worth, the hard limit rarely is.
    """
    import resource

    needed = tailers + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise RuntimeError(f"{tailers} tailers need {needed} open files; the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def timed_agent(tmp: Path) -> str:
    path = tmp / "timed_agent.py"
    path.write_text(TIMED_AGENT)
    return f"{sys.executable} {path}"


@dataclass
class TailResult:
    tailers: int
    lines: int
    complete: int  # tailers that got every line, exactly once, and the status frame
    latencies: list[float] = field(default_factory=list)  # seconds, every line at every tailer
    rss_before: int = 0  # bytes, the coordinator before the tails
    rss_tailing: int = 0  # bytes, with every tail connected
    failures: list[str] = field(default_factory=list)
    connect_s: float = 0.0
    deliver_s: float = 0.0
    run_id: str = ""
    thread_id: str = ""

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def per_tailer_bytes(self) -> float:
        return (self.rss_tailing - self.rss_before) / max(1, self.tailers)

    def summary(self) -> str:
        return (
            f"{self.complete}/{self.tailers} tailers got all {self.lines} lines; "
            f"latency p50 {self.percentile(0.5) * 1000:.1f} ms, p95 {self.percentile(0.95) * 1000:.1f} ms, "
            f"p99 {self.percentile(0.99) * 1000:.1f} ms (mean {statistics.fmean(self.latencies or [0]) * 1000:.1f}); "
            f"memory {self.per_tailer_bytes / 1024:.1f} KiB per tailer "
            f"(RSS {self.rss_before / 2**20:.1f} -> {self.rss_tailing / 2**20:.1f} MiB); "
            f"connect {self.connect_s:.1f} s, deliver {self.deliver_s:.1f} s"
        )


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class _Tail:
    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.got: list[int] = []
        self.latencies: list[float] = []
        self.status: str | None = None
        self.ids: list[str] = []


async def _one_tail(url: str, path: str, headers: dict[str, str], tail: _Tail) -> None:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode())
        await writer.drain()
        status_line = await reader.readline()
        if b" 200 " not in status_line:
            raise RuntimeError(f"tail refused: {status_line!r}")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # the response headers
        tail.connected.set()
        event: str | None = None
        # Chunked transfer: chunk-size lines are not SSE fields (no colon), so a line parser skips them.
        while True:
            raw = await reader.readline()
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("id:"):
                tail.ids.append(line[3:].strip())
            elif line.startswith("data:"):
                data = line[5:].strip()
                if event == "status":
                    tail.status = json.loads(data)["status"]
                    return
                decoded = json.loads(data)
                if decoded.get("type") == "TEXT_MESSAGE_CONTENT":
                    now = time.time()
                    for text in decoded["delta"].splitlines():
                        words = text.split()
                        if len(words) == 4 and words[0] == "line":
                            tail.got.append(int(words[1]))
                            tail.latencies.append(now - float(words[3]))
            elif not line:
                event = None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def tail_one_run(
    url: str,
    *,
    pid: int,
    headers: dict[str, str],
    go_file: Path,
    tailers: int,
    lines: int,
    gap: float = 0.02,
    timeout: float = 120.0,
) -> TailResult:
    """Start one run on the coordinator at ``url`` (process ``pid``) and tail it ``tailers`` times."""
    thread, run = f"t-load-{time.time_ns()}", f"r-load-{time.time_ns()}"
    body = {"threadId": thread, "runId": run, "messages": [{"role": "user", "content": f"{go_file} {lines} {gap}"}]}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        started = await http.post(f"{url}/runs", json=body)
        if started.status_code != 202:
            raise RuntimeError(f"trigger refused: {started.status_code} {started.text}")
    result = TailResult(tailers=tailers, lines=lines, complete=0, run_id=run, thread_id=thread)
    await asyncio.sleep(0.5)
    result.rss_before = rss_of(pid)
    path = f"/runs/{run}/events?threadId={thread}"
    tails = [_Tail() for _ in range(tailers)]
    began = time.monotonic()
    deadline = began + timeout
    tasks = [asyncio.ensure_future(_one_tail(url, path, headers, t)) for t in tails]
    try:
        waits = [asyncio.ensure_future(t.connected.wait()) for t in tails]
        await asyncio.wait(waits, timeout=timeout)
        for wait in waits:
            wait.cancel()
        result.connect_s = time.monotonic() - began
        connected = sum(t.connected.is_set() for t in tails)
        if connected < tailers:
            result.failures.append(f"only {connected} of {tailers} tails connected in {timeout} s")
        await asyncio.sleep(0.5)  # every tail has read what is stored and waits on the live end
        result.rss_tailing = rss_of(pid)
        go_file.touch()
        began = time.monotonic()
        done, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
        result.deliver_s = time.monotonic() - began
        if pending:
            result.failures.append(f"{len(pending)} tails had not ended by the bound")
        for task in done:
            if task.exception() is not None:
                result.failures.append(f"{type(task.exception()).__name__}: {task.exception()}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for tail in tails:
        result.latencies += tail.latencies
        if tail.got == list(range(lines)) and tail.status == "completed" and len(tail.ids) == len(set(tail.ids)):
            result.complete += 1
        elif len(result.failures) < 5:
            result.failures.append(f"a tail got {len(tail.got)} lines, status {tail.status}")
    return result
