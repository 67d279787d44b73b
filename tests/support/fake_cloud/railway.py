"""A fake Railway: the public GraphQL API's sandbox operations and the ``/ws/exec`` bridge.

Railway has no Python SDK; the client under test is ``boxwright/providers/railway.py``.
This fake follows Railway's CLI 4.x/5.x sources (``src/gql/{mutations,queries}/strings/Sandbox*.graphql``,
``GenerateShellToken``, ``src/controllers/sandbox_exec.rs``, schema ``SandboxCreateInput``) and
the seed's Railway section:

- GraphQL (``POST /graphql/v2``; ``Authorization: Bearer <account token>`` or
  ``Project-Access-Token: <project token>``; a bad token is ``200 {"errors": [Not Authorized]}``
  as Railway answers): ``sandboxCreate(input)`` (environmentId, region, idleTimeoutMinutes,
  networkIsolation, variables, domains [{port}] (PRIVATE only, at most 10), resources,
  sourceSandboxId = fork, template {name} = boot a checkpoint) answers ``CREATING`` and the
  sandbox turns ``RUNNING`` once its machine booted; ``sandbox(environmentId, id)`` (a
  destroyed one stays as a ``DESTROYED`` tombstone; unknown ids are "Sandbox not found");
  ``sandboxes(environmentId, first, after)`` (cursor pages); ``sandboxDestroy``;
  ``sandboxHeartbeat``; ``sandboxCheckpointCreate`` (a name replaces an existing one);
  ``generateShellToken(input {environmentId, instanceId, kind, scope})`` (5 minutes).
- The exec bridge (``/ws/exec``, subprotocols ``railway-shell`` + the shell token): first
  frame ``init_exec {command, env, durable}``; the command runs as ``sh -c`` as root in its
  own process group, sandbox variables under the frame's env; binary frames tagged 0x01
  stdout, 0x03 stderr down and 0x02 stdin up; ``stdin_close``; ``signal {signal}`` goes to
  the whole process group (as the seed measured); ``durable_session`` is announced for a
  durable exec; ``exit {exit_code}`` (128 + N after a signal) ends the session. A dropped
  connection kills a non-durable command; a durable one keeps running.
- Domains: ``Host: <prefix>.up.railway.fake`` is proxied to the machine's port, with no auth.

Commands run through the machine's in-VM agent (``agent.py``), which sees true wait statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .backend import FakeCloud, FakeService, Machine, Process, ServerThread, forward, machine_address

DOMAIN = "up.railway.fake"
_SIGNALS = {"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "QUIT": 3}


@dataclass
class Sandbox:
    id: str
    status: str
    environment: str
    region: str
    idle_timeout: int | None
    network: str
    variables: dict[str, str]
    domains: list[dict[str, Any]]
    resources: dict[str, Any]
    machine: Machine | None = None
    source: str | None = None
    heartbeats: int = 0
    created_at: float = field(default_factory=time.time)


class FakeRailway(FakeService):
    """The fake cloud. ``start()`` serves it; ``endpoint``/``exec_url`` go into the provider's options."""

    def __init__(
        self,
        image: str,
        *,
        api_token: str = "rw-fake-account-token",
        project_token: str = "rw-fake-project-token",
        environment: str = "env-fake-0001",
        page_size: int = 2,
    ) -> None:
        self.cloud = FakeCloud(image, "root", "/root", uid=0)
        self.api_token = api_token
        self.project_token = project_token
        self.environment = environment
        self.page_size = page_size
        self.sandboxes: dict[str, Sandbox] = {}
        self.checkpoints: dict[str, str] = {}  # name -> image
        self.tokens: dict[str, tuple[str, float]] = {}  # shell token -> (sandbox id, expiry)
        self.operations: list[str] = []
        self.inputs: list[dict[str, Any]] = []  # every sandboxCreate input as received
        self.create_delay = 0.0  # seconds a sandbox stays CREATING after its machine exists
        self._gone: list[Machine] = []
        self._booting: set[asyncio.Future[None]] = set()
        self.server = ServerThread(self._app())

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"{self.server.url}/graphql/v2"

    @property
    def exec_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/ws/exec"

    @property
    def url(self) -> str:
        return self.server.url

    def machines(self) -> list[Machine]:
        return [s.machine for s in self.sandboxes.values() if s.machine is not None]

    def expire(self, sandbox_id: str) -> None:
        """What Railway's idle timeout does: the sandbox is destroyed (from the test thread)."""
        sandbox = self.sandboxes[sandbox_id]
        future = asyncio.run_coroutine_threadsafe(self._destroy(sandbox), self._loop)
        future.result(30)

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        api = Starlette(
            routes=[
                Route("/graphql/v2", self.graphql, methods=["POST"]),
                WebSocketRoute("/ws/exec", self.exec),
            ]
        )

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            self._loop = asyncio.get_running_loop()
            headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
            host = headers.get("host", "")
            if scope["type"] == "http" and host.endswith("." + DOMAIN):
                await self.proxy(scope, receive, send, host)
                return
            await api(scope, receive, send)

        return app

    def _authorized(self, request: Request) -> bool:
        bearer = request.headers.get("authorization", "")
        return bearer == f"Bearer {self.api_token}" or request.headers.get("project-access-token") == self.project_token

    def _json(self, sandbox: Sandbox) -> dict[str, Any]:
        return {
            "id": sandbox.id,
            "status": sandbox.status,
            "region": sandbox.region,
            "environmentId": sandbox.environment,
            "idleTimeoutMinutes": sandbox.idle_timeout,
            "networkIsolation": sandbox.network,
            "domains": sandbox.domains,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sandbox.created_at)),
        }

    async def graphql(self, request: Request) -> Response:
        body = await request.json()
        operation = str(body.get("operationName") or "")
        self.operations.append(operation)
        if not self._authorized(request):
            return JSONResponse({"errors": [{"message": "Not Authorized"}], "data": None})
        variables = dict(body.get("variables") or {})
        handler = getattr(self, f"_op_{operation}", None)
        if handler is None:
            return JSONResponse({"errors": [{"message": f"Cannot query operation {operation!r}"}]}, status_code=400)
        env = variables.get("environmentId") or (variables.get("input") or {}).get("environmentId")
        if env != self.environment:
            return JSONResponse({"errors": [{"message": "Environment not found"}], "data": None})
        try:
            data = await handler(variables)
        except LookupError as exc:
            return JSONResponse({"errors": [{"message": str(exc.args[0])}], "data": None})
        except ValueError as exc:
            return JSONResponse({"errors": [{"message": str(exc)}], "data": None})
        return JSONResponse({"data": data})

    def _find(self, sandbox_id: str) -> Sandbox:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise LookupError("Sandbox not found")
        return sandbox

    async def _op_SandboxCreate(self, variables: dict[str, Any]) -> dict[str, Any]:
        given = dict(variables["input"])
        self.inputs.append(given)
        source = given.get("sourceSandboxId")
        template = (given.get("template") or {}).get("name")
        image: str | None = None
        network, domains, idle = given.get("networkIsolation") or "ISOLATED", given.get("domains") or [], None
        region = given.get("region") or "us-west2"
        if source is not None:
            parent = self._find(str(source))
            if parent.status != "RUNNING" or parent.machine is None:
                raise ValueError(f"Sandbox {source} is not running")
            image = await self.cloud.commit(parent.machine, "boxwright-fake-railway-fork")
            # A fork keeps the parent's network mode, domains and idle timeout, and runs where it does.
            network, idle, region = parent.network, parent.idle_timeout, parent.region
            domains = [{"port": d["port"]} for d in parent.domains]
        elif template is not None:
            image = self.checkpoints.get(str(template))
            if image is None:
                raise LookupError(f"Checkpoint {template} not found")
            if given.get("region"):
                raise ValueError("region cannot be set when booting from a checkpoint")
        if domains and network != "PRIVATE":
            raise ValueError("Sandbox domains require networkIsolation PRIVATE")
        if len(domains) > 10:
            raise ValueError("At most 10 sandbox domains")
        sandbox = Sandbox(
            id=str(uuid.uuid4()),
            status="CREATING",
            environment=self.environment,
            region=region,
            idle_timeout=given.get("idleTimeoutMinutes", idle),
            network=network,
            variables=dict(given.get("variables") or {}),
            domains=[
                {"prefix": p, "port": int(d["port"]), "domain": f"{p}.{DOMAIN}"}
                for d in domains
                for p in [secrets.token_hex(5)]
            ],
            resources=dict(given.get("resources") or {}),
            source=source,
        )
        self.sandboxes[sandbox.id] = sandbox
        boot = asyncio.ensure_future(self._boot(sandbox, image))
        self._booting.add(boot)
        boot.add_done_callback(self._booting.discard)
        return {"sandboxCreate": self._json(sandbox)}

    async def _boot(self, sandbox: Sandbox, image: str | None) -> None:
        try:
            machine = await self.cloud.create(image=image, env=sandbox.variables, sandbox_id=sandbox.id)
        except Exception:
            sandbox.status = "FAILED"
            return
        sandbox.machine = machine
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        if sandbox.status == "CREATING":
            sandbox.status = "RUNNING"
        else:  # destroyed while it booted
            await self._destroy(sandbox)

    async def _op_Sandbox(self, variables: dict[str, Any]) -> dict[str, Any]:
        return {"sandbox": self._json(self._find(str(variables["id"])))}

    async def _op_Sandboxes(self, variables: dict[str, Any]) -> dict[str, Any]:
        rows = sorted(self.sandboxes.values(), key=lambda s: (s.created_at, s.id))
        start = int(variables.get("after") or 0)
        size = min(int(variables.get("first") or self.page_size), self.page_size)
        page = rows[start : start + size]
        more = start + size < len(rows)
        return {
            "sandboxes": {
                "edges": [{"node": self._json(s), "cursor": str(start + i + 1)} for i, s in enumerate(page)],
                "pageInfo": {"hasNextPage": more, "endCursor": str(start + size) if more else None},
            }
        }

    async def _destroy(self, sandbox: Sandbox) -> None:
        sandbox.status = "DESTROYED"
        sandbox.domains = []
        for token, (owner, _) in list(self.tokens.items()):
            if owner == sandbox.id:
                del self.tokens[token]
        if sandbox.machine is not None:
            self._gone.append(sandbox.machine)
            await self.cloud.remove(sandbox.machine.id)

    async def _op_SandboxDestroy(self, variables: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._find(str(variables["id"]))
        if sandbox.status not in ("DESTROYED", "DESTROYING"):
            await self._destroy(sandbox)
        return {"sandboxDestroy": {"id": sandbox.id, "status": sandbox.status}}

    async def _op_SandboxHeartbeat(self, variables: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._find(str(variables["id"]))
        if sandbox.status != "RUNNING":
            raise LookupError("Sandbox not found")
        sandbox.heartbeats += 1
        return {
            "sandboxHeartbeat": {"id": sandbox.id, "status": sandbox.status, "idleTimeoutMinutes": sandbox.idle_timeout}
        }

    async def _op_SandboxCheckpointCreate(self, variables: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._find(str(variables["sandboxId"]))
        if sandbox.status != "RUNNING" or sandbox.machine is None:
            raise LookupError("Sandbox not found")
        name = str(variables["name"])
        old = self.checkpoints.get(name)
        self.checkpoints[name] = await self.cloud.commit(sandbox.machine, "boxwright-fake-railway-checkpoint")
        if old is not None:  # a capture under an existing name replaces it
            await self.cloud.remove_image(old)
        return {
            "sandboxCheckpointCreate": {
                "id": str(uuid.uuid4()),
                "key": name,
                "createdAt": "2026-01-01T00:00:00Z",
                "environmentId": self.environment,
            }
        }

    async def _op_GenerateShellToken(self, variables: dict[str, Any]) -> dict[str, Any]:
        given = variables["input"]
        sandbox = self._find(str(given["instanceId"]))
        if sandbox.status != "RUNNING" or given.get("scope") != "shell":
            raise LookupError("Sandbox not found")
        token = f"eyJhbGciOiJIUzI1NiJ9.{secrets.token_hex(16)}.{secrets.token_hex(16)}"
        self.tokens[token] = (sandbox.id, time.time() + 300)
        return {"generateShellToken": token}

    # -- the exec bridge ---------------------------------------------------------------------------

    async def _deny(self, websocket: WebSocket, status: int, message: str) -> None:
        try:
            await websocket.send_denial_response(Response(message, status_code=status))
        except RuntimeError:  # a server without the denial extension
            await websocket.close(code=1008, reason=message)

    async def exec(self, websocket: WebSocket) -> None:
        protocols = list(websocket.scope.get("subprotocols") or [])
        if len(protocols) < 2 or protocols[0] != "railway-shell":
            await self._deny(websocket, 400, "expected subprotocols railway-shell, <token>")
            return
        owner = self.tokens.get(protocols[-1])
        if owner is None or owner[1] < time.time():
            await self._deny(websocket, 401, "invalid or expired shell token")
            return
        sandbox = self.sandboxes.get(owner[0])
        if sandbox is None or sandbox.status != "RUNNING" or sandbox.machine is None or not sandbox.machine.running:
            await self._deny(websocket, 404, "sandbox not found")
            return
        await websocket.accept(subprotocol="railway-shell")
        try:
            init = json.loads(await websocket.receive_text())
        except (WebSocketDisconnect, ValueError):
            return
        data = init.get("data") or {}
        if init.get("type") != "init_exec" or not data.get("command"):
            await websocket.close(code=1008, reason="the first frame must be init_exec with a command")
            return
        machine = sandbox.machine
        try:
            process = await machine.start(
                ["sh", "-c", str(data["command"])],
                env=dict(data.get("env") or {}),
                stdin=True,
            )
        except OSError as exc:
            await websocket.send_bytes(b"\x03" + f"exec: {exc}\n".encode())
            await websocket.send_text(json.dumps({"type": "exit", "data": {"exit_code": 127}}))
            await websocket.close()
            return
        durable = bool(data.get("durable"))
        upstream = asyncio.ensure_future(self._upstream(websocket, machine, process, durable))
        try:
            if durable:
                name = f"ds-{secrets.token_hex(6)}"
                session = {"type": "durable_session", "data": {"durable_session_name": name}}
                await websocket.send_text(json.dumps(session))
            while (item := await process.output.get()) is not None:
                await websocket.send_bytes((b"\x03" if item[0] == "stderr" else b"\x01") + item[1])
            code = await process.exit_code
            await websocket.send_text(json.dumps({"type": "exit", "data": {"exit_code": code}}))
            await websocket.close()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            if not process.exit_code.done() and not durable:
                # A plain exec dies with its connection.
                with contextlib.suppress(Exception):
                    await machine.ask({"op": "signal", "pid": -process.pid, "sig": 9}, check=False)

    async def _upstream(self, websocket: WebSocket, machine: Machine, process: Process, durable: bool) -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                if not durable and not process.exit_code.done():  # a plain exec dies with its connection
                    await machine.ask({"op": "signal", "pid": -process.pid, "sig": 9}, check=False)
                return
            raw = message.get("bytes")
            if raw:
                if raw[0] == 0x02 and len(raw) > 1 and process.stdin_open:
                    with contextlib.suppress(OSError):
                        await process.write(raw[1:])
                continue
            text = message.get("text")
            if not text:
                continue
            with contextlib.suppress(ValueError):
                frame = json.loads(text)
                if frame.get("type") == "stdin_close":
                    process.close_stdin()
                elif frame.get("type") == "signal":
                    signo = _SIGNALS.get(str((frame.get("data") or {}).get("signal", "")).upper())
                    if signo is not None and process.pid and not process.exit_code.done():
                        # The process group, as the bridge does: a forked child gets it too.
                        await machine.ask({"op": "signal", "pid": -process.pid, "sig": signo}, check=False)

    # -- domains ---------------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str) -> None:
        for sandbox in self.sandboxes.values():
            for domain in sandbox.domains:
                if domain["domain"] == host and sandbox.machine is not None:
                    # Streamed both ways with the request's method, query, headers and body, as Railway's edge.
                    address = await machine_address(sandbox.machine)
                    await forward(scope, receive, send, f"http://{address}:{domain['port']}{scope['path']}")
                    return
        await Response("Application not found", status_code=404)(scope, receive, send)
