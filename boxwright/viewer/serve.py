"""The viewer on the embedded default: SQLite for every store, the local-process provider, one process.

``python -m boxwright.viewer`` (what ``make demo`` runs) serves ``viewer_app``: the service core's
routes and the page at ``/``, and prints the page's URL once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from boxwright.config import database_path
from boxwright.middleware import SandboxMiddleware, SandboxService, sandbox_routes
from boxwright.middleware.approvals import ApprovalDesk
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge.tools import Tool

from .app import ViewerRuns, viewer_routes
from .demo import DEFAULT_PACE_S, house_style


def viewer_app(
    db: str | os.PathLike[str] | None = None,
    *,
    demo_repo: str | os.PathLike[str] | None = None,
    sandbox_base: str | None = None,
    pace_s: float = DEFAULT_PACE_S,
    tools: Sequence[Tool] = (house_style,),
) -> Starlette:
    """A Starlette app: ``sandbox_routes`` + ``viewer_routes`` over one SQLite file (default ``$BOXWRIGHT_DB``).

    Its lifespan owns the service; at shutdown runs still going are cancelled (a one-process demo
    has no replica to hand them to) and the database is closed.
    """
    path = Path(db if db is not None else database_path()).absolute()
    database = open_database(path)
    runs, log = sqlite_run_backend(database)
    desk = ApprovalDesk()
    factory = ViewerRuns(
        desk, Path(demo_repo) if demo_repo else path.parent / "viewer-demo-repo", tools, sandbox_base, pace_s
    )
    service = SandboxService(
        runs,
        log,
        locks=SqliteLockStore(database),
        store=SqliteInstanceStore(database),
        factory=factory,
        on_close="cancel",
        approvals=desk,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[dict[str, Any]]:
        try:
            async with service.lifespan(app) as state:
                yield state
        finally:
            await database.close()

    app = Starlette(routes=[*sandbox_routes(service), *viewer_routes()], lifespan=lifespan)
    app.add_middleware(SandboxMiddleware, service=service)
    return app


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(
            f"boxwright viewer: cannot listen on {host}:{port}: {exc.strerror} (pick another --port)"
        ) from None
    sock.listen(128)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boxwright.viewer", description="Serve the run viewer page.")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: the page starts agents)"
    )
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("BOXWRIGHT_PORT", "4437")), help="port (4437; 0: any)"
    )
    parser.add_argument("--db", default=None, help="SQLite file (default: $BOXWRIGHT_DB or ./.boxwright/boxwright.db)")
    parser.add_argument("--pace", type=float, default=DEFAULT_PACE_S, help="seconds between the demo agent's steps")
    args = parser.parse_args(argv)
    app = viewer_app(args.db, pace_s=args.pace)
    sock = _listen(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    # Listening already: a browser opened on this line is queued until uvicorn accepts.
    print(f"boxwright viewer: http://{shown}:{port}/  (Ctrl-C stops it)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
