"""One boxwright app replica for multi-process tests: ``SandboxService`` and its routes under uvicorn.

    python -m tests.support.replica_app --db F --base-dir D --agent CMD --port P [--lease-ms N]

Every replica started over the same SQLite file shares runs, records, logs and locks with the
others; the agent is a shell command (``command_harness``) in a local-process sandbox, run
journaled (durable), so it outlives a replica that is killed or stopped. Prints ``listening <port>``
once it serves on 127.0.0.1. ``BOXWRIGHT_FAULT`` (``boxwright._faults``) may kill it at a named point.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import uvicorn
from starlette.applications import Starlette

from boxwright.definition import define_sandbox
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.middleware.service import StartRunRequest
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--db", "--base-dir", "--agent"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lease-ms", type=int, default=1500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    db = open_database(args.db)
    runs, log = sqlite_run_backend(db)
    sandbox = define_sandbox("replica", local_process_sandbox(base_dir=args.base_dir))
    harness = command_harness(args.agent)

    def factory(_start: StartRunRequest) -> tuple[object, object]:
        return sandbox, harness

    service = SandboxService(
        runs,
        log,
        locks=SqliteLockStore(db),
        store=SqliteInstanceStore(db),
        factory=factory,  # type: ignore[arg-type]
        lease_ttl_ms=args.lease_ms,
    )
    app = Starlette(routes=sandbox_routes(service))
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    # uvicorn says it listens by a flag only, set once its sockets are bound.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    print(f"listening {args.port}", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main())
