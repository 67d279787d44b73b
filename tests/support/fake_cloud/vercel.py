"""A fake Vercel Sandbox API, as the ``vercel-sandbox`` SDK 0.10.0 (``vercel.sandbox``) calls it.

Follows ``vercel-sandbox`` 0.10.0 (``vercel/sandbox/_internal/api_client.py``, ``service.py``,
``text_reader.py``, ``log_stream.py``); the subset boxwright's provider drives:

- Auth: ``Authorization: Bearer <token>`` and ``?teamId=`` on every request (401 otherwise;
  errors are ``{"error": {"code", "message"}}`` with their status, which the SDK raises as
  ``SandboxApiError(status_code)``); every sandbox belongs to the request's project.
- ``POST /v3/sandboxes`` {projectId, name, ports, tags, persistent, timeout, resources} ->
  {sandbox, session, routes} (``running``; 409 on a taken name); ``GET /v2/sandboxes/{name}
  ?projectId=&resume=`` (404 once deleted; ``resume=true`` starts a new session of a stopped
  persistent sandbox, its filesystem kept); ``GET /v2/sandboxes?project=&tags=k:v&limit=
  &cursor=`` pages of at most ``page_size`` (``pagination.next``); ``DELETE
  /v2/sandboxes/{name}``.
- ``POST /v2/sandboxes/sessions/{sid}/cmd`` {command, args, cwd, env, sudo} -> {command}
  (detached: the command runs on; 410 when the session is stopped); ``GET .../cmd/{cid}?wait=``
  -> {command} with ``exitCode`` once it ended; ``GET .../cmd/{cid}/logs`` -> NDJSON
  ``{"stream": "stdout"|"stderr", "data": text}`` from the start, following until the exit;
  ``POST .../cmd/{cid}/kill`` {signal} signals the command's own pid (not its group: whether
  Vercel's kill reaches a forked child is what the seed calls unmeasured, so the fake takes
  the narrow reading).
- Exposed ports: ``https://<subdomain>.vercel.fake`` routes (public, no auth, as Vercel's
  exposed-port domains are); ``Host: <subdomain>.vercel.fake`` is proxied to the port.

Commands run as ``vercel-sandbox`` (cwd ``/vercel/sandbox``) through the in-VM agent (``agent.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .backend import FakeCloud, FakeService, Machine, Process, ServerThread, forward, machine_address, vendor_front

USER = "vercel-sandbox"
HOME = "/vercel/sandbox"
DOMAIN = "vercel.fake"


@dataclass
class Command:
    id: str
    name: str
    args: list[str]
    cwd: str
    session: str
    process: Process
    started_at: int = field(default_factory=lambda: int(time.time() * 1000))
    logs: list[tuple[str, str]] = field(default_factory=list)
    exit_code: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class FakeSandbox:
    machine: Machine
    name: str
    project: str
    ports: list[int]
    tags: dict[str, str]
    persistent: bool
    session: str
    status: str = "running"
    routes: dict[int, str] = field(default_factory=dict)  # port -> subdomain
    created_at: int = field(default_factory=lambda: int(time.time() * 1000))


class FakeVercel(FakeService):
    """The fake cloud. ``start()`` serves it; ``api_url`` goes into the SDK's ``base_url``."""

    def __init__(
        self, image: str, *, token: str = "vercel_fake_token", team: str = "team_fake", project: str = "prj_fake"
    ) -> None:
        self.cloud = FakeCloud(image, USER, HOME, recycle=True)  # wipe and pool a destroyed machine
        self.token = token
        self.team = team
        self.project = project
        self.page_size = 2
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.commands_by_id: dict[str, Command] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.bodies: list[str] = []  # every JSON body as received: tests scan these
        self.create_delay = 0.0  # seconds the create call takes after the machine exists
        self._gone: list[Machine] = []
        self._tasks: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, seen on the first create
        self.server = ServerThread(self._app())

    @property
    def api_url(self) -> str:
        return self.server.url

    def machines(self) -> list[Machine]:
        return [s.machine for s in self.sandboxes.values()]

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        api = Starlette(
            routes=[
                Route("/v3/sandboxes", self.create, methods=["POST"]),
                Route("/v2/sandboxes", self.list, methods=["GET"]),
                Route("/v2/sandboxes/{name}", self.get, methods=["GET"]),
                Route("/v2/sandboxes/{name}", self.delete, methods=["DELETE"]),
                Route("/v2/sandboxes/sessions/{sid}/cmd", self.run, methods=["POST"]),
                Route("/v2/sandboxes/sessions/{sid}/cmd/{cid}", self.get_command, methods=["GET"]),
                Route("/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs", self.command_logs, methods=["GET"]),
                Route("/v2/sandboxes/sessions/{sid}/cmd/{cid}/kill", self.kill, methods=["POST"]),
            ]
        )
        return vendor_front(api, DOMAIN, self.proxy, self.requests)

    def _denied(self, request: Request) -> Response | None:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "forbidden", "Not authorized")
        if request.query_params.get("teamId") != self.team:
            return _error(403, "forbidden", "wrong team")
        return None

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = (await request.body()).decode()
        self.bodies.append(raw)
        return dict(json.loads(raw)) if raw else {}

    def _session_json(self, box: FakeSandbox) -> dict[str, Any]:
        return {
            "id": box.session,
            "sourceSandboxName": box.name,
            "projectId": box.project,
            "status": box.status,
            "cwd": HOME,
            "region": "iad1",
            "memory": 2048,
            "vcpus": 1,
            "timeout": 300000,
            "requestedAt": box.created_at,
            "startedAt": box.created_at,
        }

    def _sandbox_json(self, box: FakeSandbox) -> dict[str, Any]:
        return {
            "name": box.name,
            "currentSessionId": box.session,
            "status": box.status,
            "persistent": box.persistent,
            "projectId": box.project,
            "cwd": HOME,
            "region": "iad1",
            "memory": 2048,
            "vcpus": 1,
            "tags": box.tags,
            "createdAt": box.created_at,
            "updatedAt": box.created_at,
        }

    def _full(self, box: FakeSandbox) -> dict[str, Any]:
        routes = [{"url": f"https://{sub}.{DOMAIN}", "port": p, "subdomain": sub} for p, sub in box.routes.items()]
        return {"sandbox": self._sandbox_json(box), "session": self._session_json(box), "routes": routes}

    def _box(self, request: Request) -> FakeSandbox | Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        box = self.sandboxes.get(request.path_params["name"])
        if box is None:
            return _error(404, "not_found", "Sandbox not found")
        return box

    async def create(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        self._loop = asyncio.get_running_loop()
        body = await self._body(request)
        name = str(body.get("name") or f"sbx_{uuid.uuid4().hex[:16]}")
        if name in self.sandboxes:
            return _error(409, "conflict", f"Sandbox {name} already exists")
        if body.get("networkPolicy") not in (None, "allow-all"):
            return _error(400, "bad_request", "the fake serves allow-all only")
        machine = await self.cloud.create()
        box = FakeSandbox(
            machine,
            name,
            str(body.get("projectId") or self.project),
            [int(p) for p in body.get("ports") or []],
            {str(k): str(v) for k, v in (body.get("tags") or {}).items()},
            bool(body.get("persistent", True)),
            f"sess_{uuid.uuid4().hex[:16]}",
        )
        box.routes = {p: f"sb-{uuid.uuid4().hex[:10]}-{p}" for p in box.ports}
        self.sandboxes[name] = box
        await machine.run(["mkdir", "-p", HOME], user="root", record=False)
        await machine.run(["chown", USER, HOME, "/vercel"], user="root", record=False)
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(self._full(box))

    async def list(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        project = request.query_params.get("project") or self.project
        tag = request.query_params.get("tags")
        key, _, value = (tag or "").partition(":")
        size = min(int(request.query_params.get("limit") or 50), self.page_size)
        start = int(request.query_params.get("cursor") or 0)
        rows = [
            b
            for n, b in sorted(self.sandboxes.items())
            if b.project == project and (tag is None or b.tags.get(key) == value)
        ]
        page = rows[start : start + size]
        more = start + size < len(rows)
        return JSONResponse(
            {
                "sandboxes": [self._sandbox_json(b) for b in page],
                "pagination": {"count": len(page), "next": str(start + size) if more else None},
            }
        )

    async def get(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        if box.status == "stopped" and request.query_params.get("resume") == "true" and box.persistent:
            box.session = f"sess_{uuid.uuid4().hex[:16]}"  # a new session on the same filesystem
            box.status = "running"
            return JSONResponse({**self._full(box), "resumed": True})
        return JSONResponse(self._full(box))

    async def delete(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        del self.sandboxes[box.name]
        self._gone.append(box.machine)
        await self.cloud.remove(box.machine.id)
        box.status = "stopped"
        return JSONResponse({"sandbox": self._sandbox_json(box)})

    def stop(self, name: str) -> None:
        """The session ends (idle timeout): its processes go, a persistent sandbox's filesystem stays."""
        box = self.sandboxes[name]
        box.status = "stopped"
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(
            box.machine.run(["pkill", "-KILL", "-u", USER], user="root", record=False), self._loop
        )
        fut.result(30)

    # -- commands ----------------------------------------------------------------------------------

    def _session(self, request: Request) -> FakeSandbox | Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        sid = request.path_params["sid"]
        box = next((b for b in self.sandboxes.values() if b.session == sid), None)
        if box is None:
            return _error(404, "not_found", "Session not found")
        if box.status != "running":
            return _error(410, "session_stopped", "The session is stopped")
        return box

    def _command_json(self, command: Command) -> dict[str, Any]:
        return {
            "command": {
                "id": command.id,
                "name": command.name,
                "args": command.args,
                "cwd": command.cwd,
                "sessionId": command.session,
                "exitCode": command.exit_code,
                "startedAt": command.started_at,
            }
        }

    async def run(self, request: Request) -> Response:
        box = self._session(request)
        if isinstance(box, Response):
            return box
        body = await self._body(request)
        argv = [str(body["command"]), *[str(a) for a in body.get("args") or []]]
        cwd = str(body.get("cwd") or HOME)
        env = {str(k): str(v) for k, v in (body.get("env") or {}).items()}
        user = "root" if body.get("sudo") else USER
        try:
            process = await box.machine.start(argv, env=env, cwd=cwd, user=user)
        except OSError as exc:
            return _error(400, "bad_request", f"could not start: {exc}")
        command = Command(f"cmd_{uuid.uuid4().hex[:16]}", argv[0], argv[1:], cwd, box.session, process)
        self.commands_by_id[command.id] = command
        task = asyncio.ensure_future(self._pump(command))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return JSONResponse(self._command_json(command))

    async def _pump(self, command: Command) -> None:
        import codecs

        decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
        while (item := await command.process.output.get()) is not None:
            text = decoders[item[0]].decode(item[1])
            if text:
                command.logs.append((item[0], text))
                command.changed.set()
        for stream, decoder in decoders.items():
            if tail := decoder.decode(b"", final=True):
                command.logs.append((stream, tail))
        command.exit_code = await command.process.exit_code
        command.changed.set()

    def _command(self, request: Request) -> Command | Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        command = self.commands_by_id.get(request.path_params["cid"])
        if command is None or command.session != request.path_params["sid"]:
            return _error(404, "not_found", "Command not found")
        return command

    async def get_command(self, request: Request) -> Response:
        command = self._command(request)
        if isinstance(command, Response):
            return command
        if request.query_params.get("wait") == "true":
            while command.exit_code is None:
                command.changed.clear()
                if command.exit_code is None:
                    await command.changed.wait()
        return JSONResponse(self._command_json(command))

    async def command_logs(self, request: Request) -> Response:
        command = self._command(request)
        if isinstance(command, Response):
            return command

        async def lines() -> AsyncIterator[bytes]:
            sent = 0
            while True:
                while sent < len(command.logs):
                    stream, data = command.logs[sent]
                    sent += 1
                    yield (json.dumps({"stream": stream, "data": data}) + "\n").encode()
                if command.exit_code is not None and sent >= len(command.logs):
                    return
                command.changed.clear()
                if sent >= len(command.logs) and command.exit_code is None:
                    await command.changed.wait()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def kill(self, request: Request) -> Response:
        command = self._command(request)
        if isinstance(command, Response):
            return command
        body = await self._body(request)
        await command.process.signal(int(body.get("signal") or 15))
        return JSONResponse(self._command_json(command))

    # -- exposed ports -----------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str, headers: dict[str, str]) -> None:
        sub = host.removesuffix("." + DOMAIN)
        box, port = next(((b, p) for b in self.sandboxes.values() for p, s in b.routes.items() if s == sub), (None, 0))
        if box is None:
            await PlainTextResponse("no such route", status_code=404)(scope, receive, send)
            return
        await forward(scope, receive, send, f"http://{await machine_address(box.machine)}:{port}{scope['path']}")


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
