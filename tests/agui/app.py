"""One boxwright app process for the AG-UI client tests: the shipped routes (``/agui`` among them) and nothing else.

    python -m tests.agui.app --db F --base-dir D --claude BIN --home H [--lease-ms N]

``SandboxService`` + ``sandbox_routes`` under uvicorn over one SQLite file (runs, logs, locks, so a
second process takes a run over), the real ``claude`` in a local-process sandbox (the model endpoint
comes from the environment, as in a deployed app), and two host tools the agent reaches through the MCP
bridge: ``get_todos`` and ``ask_person`` (the service's approval desk; the policy asks about ``rm *``).
Prints ``listening <port>`` once it serves on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio

from starlette.applications import Starlette

from boxwright.definition import define_sandbox
from boxwright.harnesses.claude_code import claude_code
from boxwright.middleware import RunSpec, SandboxService, StartRunRequest, sandbox_routes
from boxwright.middleware.approvals import ask_person_tool
from boxwright.policy import define_sandbox_policy
from boxwright.providers import local_process_sandbox
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge import tool
from boxwright.tool_bridge.asgi import serve_asgi

TODOS = ("write the spec", "ship it")
# What the agent must ask a person about first (through the ask_person host tool).
POLICY = define_sandbox_policy(ask=["rm *"])


@tool(read_only=True)
def get_todos(status: str = "open") -> str:
    """List the app's todos (state on the host, reached through the bridge)."""
    return "\n".join(f"- {todo} [{status}]" for todo in TODOS)


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--db", "--base-dir", "--claude", "--home"):
        parser.add_argument(name, required=True)
    parser.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_TTL_MS)
    args = parser.parse_args()

    db = open_database(args.db)
    runs, log = sqlite_run_backend(db)
    sandbox = define_sandbox("agui", local_process_sandbox(base_dir=args.base_dir))
    harness = claude_code("claude-sonnet-4-5", executable=args.claude, env={"HOME": args.home})

    def factory(_request: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=harness, tools=[get_todos, ask_person_tool(service.approvals, POLICY)])

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
