"""One app process of the chaos test: the shipped pieces and nothing else.

    python -m tests.e2e.chaos_app --db F --base-dir D --claude BIN --home H [--lease-ms N]

``SandboxService`` with its default settings (default quiet window, default journal) plus
``sandbox_routes`` under uvicorn (``serve_asgi``), over one SQLite file; the run factory gives
every run the real ``claude`` in a local-process sandbox. The model endpoint and key come from
this process's environment (``ANTHROPIC_BASE_URL``, ...), as in a deployed app. Prints
``listening <port>`` once it serves on 127.0.0.1. Everything it knows lives in the SQLite file,
so any number of these processes share runs, and one can be killed at any moment (also from
inside, at a named point: ``BOXWRIGHT_FAULT``, see ``boxwright._faults``).
"""

from __future__ import annotations

import argparse
import asyncio

from starlette.applications import Starlette

from boxwright.definition import define_sandbox
from boxwright.harnesses.claude_code import claude_code
from boxwright.middleware import RunSpec, SandboxService, StartRunRequest, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import serve_asgi


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--db", "--base-dir", "--claude", "--home"):
        parser.add_argument(name, required=True)
    parser.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_TTL_MS)
    args = parser.parse_args()

    db = open_database(args.db)
    runs, log = sqlite_run_backend(db)
    sandbox = define_sandbox("chaos", local_process_sandbox(base_dir=args.base_dir))
    harness = claude_code("claude-sonnet-4-5", executable=args.claude, env={"HOME": args.home})

    def factory(_request: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=harness)

    service = SandboxService(
        runs,
        log,
        locks=SqliteLockStore(db),
        store=SqliteInstanceStore(db),
        factory=factory,
        lease_ttl_ms=args.lease_ms,
    )
    server = await serve_asgi(Starlette(routes=sandbox_routes(service)))
    print(f"listening {server.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
