"""One app host for the co-located takeover test: ``SandboxService`` (mode ``colocated``) and its routes under uvicorn.

    python -m tests.support.colocated_app --db F --port P --name NAME --calls FILE --image IMAGE --label L --case C

Every host started over the same SQLite file shares runs, records, logs, locks and sandbox records. Its run
factory gives the real ``claude`` in the runner image (Docker, co-located) and one host tool, ``get_todos``,
which appends ``NAME status`` to FILE and answers ``served by NAME``: a test sees which host served a call.
Its containers carry the labels ``L=1`` and ``CASE_LABEL=C`` (tests/support/docker.py; a test finds its own).
The runner secret comes from ``$BOXWRIGHT_RUNNER_SECRET`` and the model endpoint from ``$ANTHROPIC_*``.
Prints ``listening <port>`` once it serves on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import uvicorn
from starlette.applications import Starlette

from boxwright.definition import Lifecycle, define_sandbox
from boxwright.middleware import sandbox_routes
from boxwright.middleware.service import RunSpec, StartRunRequest
from boxwright.providers.docker import docker_sandbox
from boxwright.tool_bridge import tool
from boxwright.workspace import define_workspace
from tests.support.docker import CASE_LABEL, claude_in_image, repo_setup
from tests.support.sqlite_service import sqlite_service


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--db", "--name", "--calls", "--image", "--label", "--case"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lease-ms", type=int, default=1500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the todos of the app (state on this host)."""
        with open(args.calls, "a") as calls:
            calls.write(f"{args.name} {status}\n")
        return f"- ship it [{status}], served by {args.name}"

    sandbox = define_sandbox(
        "colocated-takeover",
        docker_sandbox(args.image, labels={args.label: "1", CASE_LABEL: args.case}),
        define_workspace(setup=repo_setup()),
        lifecycle=Lifecycle(destroy_on_complete=True),
    )
    harness = claude_in_image()

    def factory(_start: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=harness, tools=[get_todos], mode="colocated")

    service = sqlite_service(
        args.db, factory, lease_ttl_ms=args.lease_ms, runner_secret=os.environ["BOXWRIGHT_RUNNER_SECRET"]
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
