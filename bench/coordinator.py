"""The coordinator against the in-app service, in one process: trigger-to-first-event latency and runs per second.

Both serve the same command harness (``echo hi`` in a local-process sandbox) over HTTP on
127.0.0.1 with their own SQLite file: the coordinator (``create_coordinator_app``, its guarded
routes, scheduler and mounted callbacks, one replica) and the in-app ``SandboxService`` with
``sandbox_routes`` in a bare Starlette app. Latency: ``POST /runs`` until the first event of its
SSE tail arrives, rounds interleaved (coordinator, in-app, coordinator, ...) so machine load hits
both alike. Throughput: ``--concurrency`` clients each trigger a run and tail it to its status,
for ``--seconds``; completed runs per second. Prints medians and the coordinator / in-app ratios.

Run: .venv/bin/python bench/coordinator.py [--rounds 20] [--seconds 10] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from starlette.applications import Starlette

from boxwright.coordinator import CoordinatorConfig, StoreSet, create_coordinator_app
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge import serve_asgi

TOKEN = "bench-client-token-" + "z" * 16
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def coordinator(tmp: Path) -> AsyncIterator[str]:
    db = open_database(str(tmp / "coordinator.db"))
    runs, log = sqlite_run_backend(db)
    stores = StoreSet(runs, log, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close)
    config = CoordinatorConfig(
        sandboxes={"local": define_sandbox("bench", local_process_sandbox(base_dir=str(tmp / "c-boxes")))},
        harnesses={"command": command_harness("echo hi")},
        stores=stores,
        client_token=TOKEN,
        inactivity_timeout=0,
        sweep_interval=0,
    )
    server = await serve_asgi(create_coordinator_app(config), lifespan="on")
    try:
        yield server.url
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def in_app(tmp: Path) -> AsyncIterator[str]:
    async with open_database(str(tmp / "in-app.db")) as db:
        runs, log = sqlite_run_backend(db)
        sandbox = define_sandbox("bench", local_process_sandbox(base_dir=str(tmp / "a-boxes")))
        harness = command_harness("echo hi")
        service = SandboxService(
            runs,
            log,
            locks=SqliteLockStore(db),
            store=SqliteInstanceStore(db),
            factory=lambda _start: (sandbox, harness),
        )
        async with service:
            server = await serve_asgi(Starlette(routes=sandbox_routes(service)))
            try:
                yield server.url
            finally:
                await server.close()


async def one_run(http: httpx.AsyncClient, url: str, *, to_end: bool) -> float:
    """Seconds from ``POST /runs`` to the first event of its tail (to its status frame with ``to_end``)."""
    thread, run = f"t-{uuid.uuid4().hex[:12]}", f"r-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    posted = await http.post(f"{url}/runs", json={"threadId": thread, "runId": run, "prompt": "hi"})
    assert posted.status_code == 202, posted.text
    async with http.stream("GET", f"{url}/runs/{run}/events", params={"threadId": thread}) as response:
        assert response.status_code == 200
        status = False
        async for line in response.aiter_lines():
            if line.startswith("event: status"):
                status = True
            elif line.startswith("data:") and (status or not to_end):
                break
    return time.perf_counter() - started


async def throughput(url: str, seconds: float, concurrency: int) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        async with httpx.AsyncClient(headers=HEADERS, timeout=60) as http:
            while time.perf_counter() < deadline:
                await one_run(http, url, to_end=True)
                done += 1

    began = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(client())
    return done / (time.perf_counter() - began)


async def main(rounds: int, seconds: float, concurrency: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-coordinator-") as scratch:
        tmp = Path(scratch)
        async with coordinator(tmp) as c_url, in_app(tmp) as a_url:
            firsts: dict[str, list[float]] = {"coordinator": [], "in-app": []}
            async with httpx.AsyncClient(headers=HEADERS, timeout=60) as http:
                for url in (c_url, a_url):  # warm: imports, the first sandbox directory, SQLite pages
                    await one_run(http, url, to_end=True)
                for _ in range(rounds):
                    firsts["coordinator"].append(await one_run(http, c_url, to_end=False))
                    firsts["in-app"].append(await one_run(http, a_url, to_end=False))
            rates = {
                "coordinator": await throughput(c_url, seconds, concurrency),
                "in-app": await throughput(a_url, seconds, concurrency),
            }
    c, a = (statistics.median(firsts[k]) * 1000 for k in ("coordinator", "in-app"))
    print(f"trigger to first event, median of {rounds}: coordinator {c:.1f} ms, in-app {a:.1f} ms, ratio {c / a:.2f}")
    rc, ra = rates["coordinator"], rates["in-app"]
    print(f"sustained runs/s ({concurrency} clients, {seconds:.0f} s each): coordinator {rc:.1f}, in-app {ra:.1f}, "
          f"ratio {rc / ra:.2f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(asyncio.wait_for(main(args.rounds, args.seconds, args.concurrency), 600))
