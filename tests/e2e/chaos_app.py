"""One boxwright app process for the chaos test: it triggers durable runs, tails them over SSE, and takes
over a run whose driver died when a client comes back for it.

    python -m tests.e2e.chaos_app --db F --base-dir D --claude BIN --home H --model-url U

Prints `listening <port>` once it serves on 127.0.0.1. Everything it knows lives in the SQLite file, so
any number of these processes can share runs; one of them can be killed at any moment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from boxwright.abort import AbortSignal
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import define_sandbox
from boxwright.events import Event
from boxwright.harnesses.claude_code import claude_code
from boxwright.middleware.delivery import sse_response
from boxwright.middleware.service import RecordDurability
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.takeover import align_to_stored_log, is_out_of_band, sandbox_run_driver
from boxwright.tool_bridge.asgi import serve_asgi

PROMPT = "[[script:chaos]] run the steps"


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--db", "--base-dir", "--claude", "--home", "--model-url"):
        parser.add_argument(name, required=True)
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--quiet-ms", type=int, default=300)
    args = parser.parse_args()

    db = open_database(args.db)
    runs, log = sqlite_run_backend(db)
    store, locks = SqliteInstanceStore(db), SqliteLockStore(db)
    sandbox = define_sandbox("chaos", local_process_sandbox(base_dir=args.base_dir))
    harness = claude_code("claude-sonnet-4-5", executable=args.claude, env={"HOME": args.home})
    host_env = {"ANTHROPIC_BASE_URL": args.model_url, "ANTHROPIC_API_KEY": "sk-test", "CLAUDE_CODE_MAX_RETRIES": "0"}
    driving: dict[str, asyncio.Task[object]] = {}

    def agent(run_id: str, thread_id: str, signal: AbortSignal, attach: bool) -> AsyncIterator[Event]:
        return run_agent(
            sandbox,
            harness,
            PROMPT,
            thread_id=thread_id,
            run_id=run_id,
            signal=signal,
            store=store,
            locks=locks,
            host_env=host_env,
            journal=JournalOptions(attach=attach, runs=runs),
            durability=RecordDurability(runs, run_id),
        )

    def replay(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[Event]:
        async def stored() -> list[Event]:
            return await log.snapshot(run_id)

        return align_to_stored_log(agent(run_id, thread_id, signal, True), stored, out_of_band=is_out_of_band)

    driver = sandbox_run_driver(runs, locks, log, replay, fence_quiet_ms=args.quiet_ms, lease_ttl_ms=args.lease_ms)

    def keep(run_id: str, work: asyncio.Task[object]) -> None:
        driving[run_id] = work
        work.add_done_callback(lambda _: driving.pop(run_id, None))

    async def trigger(request: Request) -> Response:
        body = await request.json()
        run_id, thread_id = body["runId"], body["threadId"]
        await runs.create_or_resume(run_id, thread_id)

        async def drive() -> object:
            return await driver.claim(
                run_id, lambda claim: driver.pipe(agent(run_id, thread_id, claim.signal, False), run_id, thread_id)
            )

        keep(run_id, asyncio.ensure_future(drive()))
        return JSONResponse({"runId": run_id}, status_code=202)

    async def events(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        record = await runs.get(run_id)
        if record is not None and record.status == "running" and run_id not in driving:
            # A client came back for a run nobody here drives: take it over if its driver is gone.
            keep(run_id, asyncio.ensure_future(driver.resume(run_id)))
        return await sse_response(log, runs, run_id, request)

    app = Starlette(routes=[Route("/runs", trigger, methods=["POST"]), Route("/runs/{run_id}/events", events)])
    server = await serve_asgi(app)
    print(f"listening {server.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
