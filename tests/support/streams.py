"""Durable Streams test pieces: the pinned npm install, and `boxwright serve --streams` as a real process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware

from boxwright.definition import define_sandbox
from boxwright.events import TextMessageContentEvent, TextMessageEndEvent, TextMessageStartEvent, encode_event
from boxwright.harnesses.command import command_harness
from boxwright.middleware import RunSpec, SandboxMiddleware, SandboxService, StartRunRequest, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.runs import EventLog
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import serve_asgi
from tests.support.require import missing

REPO = Path(__file__).resolve().parents[2]
STREAMS_DIR = REPO / "tests" / "streams"
NPM_ENV = "BOXWRIGHT_STREAMS_NPM"
DEFAULT_NPM_DIR = "/opt/boxwright-streams"


def streams_npm() -> Path:
    """The node_modules of tests/streams/package.json (.ci/run installs it), or a named skip/failure."""
    root = Path(os.environ.get(NPM_ENV, DEFAULT_NPM_DIR))
    if shutil.which("node") is None:
        missing("`node` is not installed (Debian: apt-get install nodejs npm)")
    if not (root / "node_modules" / "@durable-streams" / "server-conformance-tests").is_dir():
        missing(
            f"the Durable Streams npm pieces are not installed in {root} "
            "(cp tests/streams/package.json there; npm install)"
        )
    return root / "node_modules"


def scratch_project(tmp: Path, node_modules: Path, *files: str) -> Path:
    """A folder with the given tests/streams files and a link to the installed node_modules."""
    project = tmp / "ds-npm"
    project.mkdir(exist_ok=True)
    for name in files:
        shutil.copy(STREAMS_DIR / name, project / name)
    link = project / "node_modules"
    if not link.exists():
        link.symlink_to(node_modules, target_is_directory=True)
    return project


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.options(url, timeout=1.0)
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing answered at {url} within {timeout} s")


@contextlib.contextmanager
def streams_server(
    db: Path, *, long_poll_timeout: float = 0.5, max_body: int | None = None, store: str | None = None
) -> Iterator[str]:
    """`boxwright serve --streams` on a free 127.0.0.1 port over SQLite at ``db`` (or the store URL ``store``,
    passed as ``--store``); yields its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "boxwright", "serve", "--streams", "--port", str(port), "--db", str(db)]
    if store is not None:
        argv += ["--store", store]
    argv += ["--long-poll-timeout", str(long_poll_timeout)]
    if max_body is not None:
        argv += ["--max-body", str(max_body)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


# -- a live boxwright run behind the service routes -----------------------------------------------


def delta_script(deltas: int, gap: float) -> str:
    """A shell agent printing one AG-UI text message as ``deltas`` NDJSON deltas, ``gap`` seconds apart."""
    start = encode_event(TextMessageStartEvent(message_id="m", role="assistant")).decode()
    lines = [f"printf '%s\\n' '{start}'"]
    for i in range(deltas):
        delta = encode_event(TextMessageContentEvent(message_id="m", delta=f"d{i} ")).decode()
        lines.append(f"printf '%s\\n' '{delta}'; sleep {gap}")
    lines.append(f"printf '%s\\n' '{encode_event(TextMessageEndEvent(message_id='m')).decode()}'")
    return "; ".join(lines)


@dataclass
class RunStack:
    service: SandboxService
    log: EventLog
    url: str
    client: httpx.AsyncClient

    async def start(self, script: str) -> str:
        body = {"prompt": script, "threadId": f"t-{uuid.uuid4().hex[:8]}"}
        response = await self.client.post("/runs", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["runId"])

    async def stored(self, run_id: str) -> list[tuple[str, bytes]]:
        """Every stored (offset, event JSON) of a run, straight from the log."""
        return [(offset, encode_event(event)) async for offset, event in self.log.read(run_id, "-1", live=False)]


@contextlib.asynccontextmanager
async def run_stack(tmp_path: Path) -> AsyncIterator[RunStack]:
    """SQLite runs and logs, a service whose factory runs the prompt as a shell agent, under uvicorn."""
    db = open_database(tmp_path / "runs.db")
    runs, events = sqlite_run_backend(db)
    sandbox = define_sandbox("streams", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    def factory(request: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=command_harness(request.prompt))

    service = SandboxService(runs, events, store=MemoryInstanceStore(), factory=factory)
    app = Starlette(routes=sandbox_routes(service), middleware=[Middleware(SandboxMiddleware, service=service)])
    server = await serve_asgi(app)
    client = httpx.AsyncClient(base_url=server.url, timeout=30)
    try:
        yield RunStack(service, events, server.url, client)
    finally:
        await client.aclose()
        await server.close()
        await service.aclose(cancel=True)
        await db.close()
