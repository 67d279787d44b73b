"""A fake Daytona: the REST API and the toolbox API, as the ``daytona`` SDK 0.226 calls them.

Follows ``daytona`` 0.226.1 (``daytona_api_client_async``, ``daytona_toolbox_api_client_async``):

- API under ``/api`` (``Authorization: Bearer``): ``POST /sandbox`` (name, snapshot, labels,
  env, secrets [{ENV: secretName}], public, networkBlockAll, autoStopInterval,
  autoDeleteInterval) -> Sandbox, state ``started``, ``toolboxProxyUrl``; ``GET/DELETE
  /sandbox/{idOrName}`` (404 when gone); ``POST /sandbox/{id}/start|stop``; ``POST
  /sandbox/{id}/snapshot`` {name}; ``GET /sandbox`` (labels JSON, cursor, limit ->
  {items, nextCursor}: paginated); ``GET /sandbox/{id}/ports/{port}/preview-url`` and
  ``signed-preview-url?expiresInSeconds``; ``POST /secret`` -> {id, name, placeholder},
  ``DELETE /secret/{id}``. ``/socket.io`` answers 404, so the SDK's event dispatcher
  fails and its waits poll.
- Toolbox under ``/toolbox/{sandboxId}``: ``POST /process/session``, ``DELETE
  /process/session/{sid}`` (SIGKILL to each of its commands' shell, the pid alone),
  ``POST /process/session/{sid}/exec`` {command, runAsync} -> {cmdId}, ``GET
  .../command/{cid}`` -> {id, command, exitCode}, the ``.../logs?follow=true`` WebSocket
  (binary frames prefixed ``\\x01\\x01\\x01`` stdout / ``\\x02\\x02\\x02`` stderr, closed at the
  end), ``POST .../input`` {data}; ``POST /files/folder``, ``POST /files/bulk-upload``
  (multipart ``files[i].path`` / ``files[i].file``), ``GET /files`` (list), ``GET /files/info``,
  ``DELETE /files`` (recursive), ``POST /files/move``.
- A session command runs as ``sh -c <command>`` as ``daytona`` in ``/home/daytona``, through
  the machine's agent (true exit statuses). Secrets: the sandbox env holds the secret's
  placeholder, never its value (Daytona swaps it into outbound HTTPS, which the fake does not).
- Previews: ``<port>-<id>.proxy.daytona.fake`` needs ``X-Daytona-Preview-Token`` unless
  public; ``<port>-<signed token>.proxy.daytona.fake`` carries its token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal as signals
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from .backend import FakeCloud, FakeService, Machine, Process, ServerThread, forward, machine_address

PROXY_DOMAIN = "proxy.daytona.fake"
STDOUT = b"\x01\x01\x01"
STDERR = b"\x02\x02\x02"


@dataclass
class Command:
    id: str
    command: str
    process: Process
    log: list[tuple[str, bytes]] = field(default_factory=list)
    exit_code: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Box:
    id: str
    name: str
    machine: Machine
    labels: dict[str, str]
    env: dict[str, str]
    public: bool
    block_all: bool
    auto_stop: int | None
    auto_delete: int | None
    snapshot: str | None
    state: str = "started"
    preview_token: str = field(default_factory=lambda: secrets.token_hex(8))
    sessions: dict[str, dict[str, Command]] = field(default_factory=dict)
    created: float = field(default_factory=time.time)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"statusCode": status, "message": message, "error": message}, status_code=status)


class FakeDaytona(FakeService):
    """The fake cloud. ``start()`` serves it; ``api_url`` goes into the SDK's config."""

    def __init__(self, image: str, *, api_key: str = "dtn_fake_key", page_size: int = 2) -> None:
        self.cloud = FakeCloud(image, "daytona", "/home/daytona", recycle=True)
        self.api_key = api_key
        self.page_size = page_size
        self.boxes: dict[str, Box] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.snapshots: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.create_bodies: list[str] = []
        self.create_delay = 0.0
        self._gone: list[Machine] = []
        self.server = ServerThread(self._app())

    @property
    def api_url(self) -> str:
        return f"{self.server.url}/api"

    def machines(self) -> list[Machine]:
        return [b.machine for b in self.boxes.values()]

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        t = "/toolbox/{sid}"
        s = t + "/process/session/{session}"
        app = Starlette(
            routes=[
                Route("/api/sandbox", self.create, methods=["POST"]),
                Route("/api/sandbox", self.list, methods=["GET"]),
                Route("/api/sandbox/{id}", self.get, methods=["GET"]),
                Route("/api/sandbox/{id}", self.delete, methods=["DELETE"]),
                Route("/api/sandbox/{id}/start", self.start_box, methods=["POST"]),
                Route("/api/sandbox/{id}/stop", self.stop_box, methods=["POST"]),
                Route("/api/sandbox/{id}/snapshot", self.snapshot, methods=["POST"]),
                Route("/api/sandbox/{id}/ports/{port:int}/preview-url", self.preview, methods=["GET"]),
                Route("/api/sandbox/{id}/ports/{port:int}/signed-preview-url", self.signed, methods=["GET"]),
                Route("/api/secret", self.secret_create, methods=["POST"]),
                Route("/api/secret/{id}", self.secret_delete, methods=["DELETE"]),
                Route(t + "/process/session", self.session_create, methods=["POST"]),
                Route(s, self.session_get, methods=["GET"]),
                Route(s, self.session_delete, methods=["DELETE"]),
                Route(s + "/exec", self.session_exec, methods=["POST"]),
                Route(s + "/command/{cmd}", self.command_get, methods=["GET"]),
                Route(s + "/command/{cmd}/input", self.command_input, methods=["POST"]),
                WebSocketRoute(s + "/command/{cmd}/logs", self.command_logs),
                Route(t + "/files", self.files_list, methods=["GET"]),
                Route(t + "/files", self.files_delete, methods=["DELETE"]),
                Route(t + "/files/info", self.files_info, methods=["GET"]),
                Route(t + "/files/move", self.files_move, methods=["POST"]),
                Route(t + "/files/folder", self.folder, methods=["POST"]),
                Route(t + "/files/bulk-upload", self.upload, methods=["POST"]),
            ]
        )

        async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                host = headers.get("host", "")
                if host.endswith("." + PROXY_DOMAIN):
                    await self.proxy(scope, receive, send, host, headers)
                    return
                self.requests.append((scope["method"], scope["path"]))
            await app(scope, receive, send)

        return outer

    def _authorized(self, headers: Any) -> bool:
        return headers.get("authorization") == f"Bearer {self.api_key}"

    def _find(self, key: str) -> Box | None:
        return self.boxes.get(key) or next((b for b in self.boxes.values() if b.name == key), None)

    def _dto(self, box: Box) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(box.created))
        env = dict(box.env)
        return {
            "id": box.id,
            "organizationId": "org-fake",
            "name": box.name,
            "snapshot": box.snapshot,
            "user": "daytona",
            "env": env,
            "labels": box.labels,
            "public": box.public,
            "networkBlockAll": box.block_all,
            "kvm": False,
            "target": "us",
            "cpu": 1,
            "gpu": 0,
            "memory": 1,
            "disk": 3,
            "state": box.state,
            "autoStopInterval": box.auto_stop,
            "autoDeleteInterval": box.auto_delete,
            "createdAt": stamp,
            "updatedAt": stamp,
            "toolboxProxyUrl": f"{self.server.url}/toolbox",
        }

    async def _box(self, request: Request) -> Box | Response:
        if not self._authorized(request.headers):
            return _error(401, "Unauthorized")
        box = self._find(request.path_params.get("id") or request.path_params.get("sid") or "")
        if box is None:
            return _error(404, "Sandbox not found")
        return box

    # -- API -------------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return _error(401, "Unauthorized")
        raw = await request.body()
        self.create_bodies.append(raw.decode())
        body = json.loads(raw)
        name = body.get("name") or None
        if name and self._find(name) is not None:
            return _error(409, f"Sandbox with name {name} already exists")
        snapshot = body.get("snapshot")
        image = self.snapshots.get(snapshot) if snapshot else None
        if snapshot and image is None and not snapshot.startswith("daytona-"):
            return _error(404, f"Snapshot {snapshot} not found")
        env = dict(body.get("env") or {})
        for entry in body.get("secrets") or []:
            for variable, secret_name in entry.items():
                found = next((s for s in self.secrets.values() if s["name"] == secret_name), None)
                if found is None:
                    return _error(400, f"Secret {secret_name} not found")
                env[variable] = found["placeholder"]
        block_all = bool(body.get("networkBlockAll"))
        machine = await self.cloud.create(image=image, env=env, network=not block_all)
        box = Box(
            machine.id,
            name or machine.id,
            machine,
            dict(body.get("labels") or {}),
            env,
            bool(body.get("public")),
            block_all,
            body.get("autoStopInterval"),
            body.get("autoDeleteInterval"),
            snapshot,
        )
        self.boxes[box.id] = box
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(self._dto(box))

    async def get(self, request: Request) -> Response:
        box = await self._box(request)
        return box if isinstance(box, Response) else JSONResponse(self._dto(box))

    async def delete(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        self.boxes.pop(box.id, None)
        self._gone.append(box.machine)
        await self.cloud.remove(box.machine.id)
        box.state = "destroyed"
        return JSONResponse(self._dto(box))

    async def start_box(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        if box.state != "started":
            await self.cloud.restart(box.machine)
            box.state = "started"
        return JSONResponse(self._dto(box))

    async def stop_box(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        if box.state == "started":
            await self.cloud.stop(box.machine)
            box.state = "stopped"
        return JSONResponse(self._dto(box))

    async def snapshot(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        name = (await request.json())["name"]
        if name in self.snapshots:
            return _error(409, f"Snapshot {name} already exists")
        self.snapshots[name] = await self.cloud.commit(box.machine, "boxwright-fake-daytona-snapshot")
        return JSONResponse(self._dto(box))

    async def list(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return _error(401, "Unauthorized")
        wanted = json.loads(request.query_params.get("labels") or "{}")
        rows = [b for _, b in sorted(self.boxes.items()) if all(b.labels.get(k) == v for k, v in wanted.items())]
        start = int(request.query_params.get("cursor") or 0)
        limit = min(int(request.query_params.get("limit") or self.page_size), self.page_size)
        page = rows[start : start + limit]
        cursor = str(start + limit) if start + limit < len(rows) else None
        return JSONResponse({"items": [self._dto(b) for b in page], "nextCursor": cursor})

    async def preview(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        port = request.path_params["port"]
        url = f"https://{port}-{box.id}.{PROXY_DOMAIN}"
        return JSONResponse({"sandboxId": box.id, "url": url, "token": box.preview_token})

    async def signed(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        port = request.path_params["port"]
        token = f"s{secrets.token_hex(10)}"
        self.secrets[f"preview:{token}"] = {"box": box.id, "name": "", "placeholder": ""}
        url = f"https://{port}-{token}.{PROXY_DOMAIN}"
        return JSONResponse({"sandboxId": box.id, "port": port, "token": token, "url": url})

    async def secret_create(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return _error(401, "Unauthorized")
        body = await request.json()
        if any(s["name"] == body["name"] for s in self.secrets.values()):
            return _error(409, f"Secret {body['name']} already exists")
        secret_id = uuid.uuid4().hex
        placeholder = f"dtn_secret_placeholder_{secrets.token_hex(6)}"
        self.secrets[secret_id] = {"name": body["name"], "value": body["value"], "placeholder": placeholder}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        return JSONResponse(
            {
                "id": secret_id,
                "name": body["name"],
                "placeholder": placeholder,
                "hosts": body.get("hosts") or [],
                "createdAt": stamp,
                "updatedAt": stamp,
            },
            status_code=201,
        )

    async def secret_delete(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return _error(401, "Unauthorized")
        if self.secrets.pop(request.path_params["id"], None) is None:
            return _error(404, "Secret not found")
        return Response(status_code=204)

    # -- toolbox ---------------------------------------------------------------------------------

    async def session_create(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        session = (await request.json())["sessionId"]
        if session in box.sessions:
            return _error(409, f"session {session} already exists")
        box.sessions[session] = {}
        return Response(status_code=201)

    def _session(self, box: Box, request: Request) -> dict[str, Command] | Response:
        found = box.sessions.get(request.path_params["session"])
        return _error(404, "session not found") if found is None else found

    async def session_get(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        session = self._session(box, request)
        if isinstance(session, Response):
            return session
        commands = [{"id": c.id, "command": c.command, "exitCode": c.exit_code} for c in session.values()]
        return JSONResponse({"sessionId": request.path_params["session"], "commands": commands})

    async def session_delete(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        session = box.sessions.pop(request.path_params["session"], None)
        if session is None:
            return _error(404, "session not found")
        for command in session.values():
            await command.process.signal(signals.SIGKILL)
        return Response(status_code=204)

    async def session_exec(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        session = self._session(box, request)
        if isinstance(session, Response):
            return session
        body = await request.json()
        try:
            process = await box.machine.start(["sh", "-c", body["command"]], stdin=True)
        except OSError as exc:
            return _error(400, str(exc))
        command = Command(uuid.uuid4().hex, body["command"], process)
        session[command.id] = command
        task = asyncio.ensure_future(self._pump(command))
        if body.get("runAsync") or body.get("async"):
            command.pump = task  # type: ignore[attr-defined]
            return JSONResponse({"cmdId": command.id})
        await task
        out = b"".join(d for k, d in command.log if k == "stdout").decode(errors="replace")
        err = b"".join(d for k, d in command.log if k == "stderr").decode(errors="replace")
        return JSONResponse(
            {"cmdId": command.id, "output": out + err, "stdout": out, "stderr": err, "exitCode": command.exit_code}
        )

    async def _pump(self, command: Command) -> None:
        while (item := await command.process.output.get()) is not None:
            command.log.append(item)
            command.changed.set()
        command.exit_code = await command.process.exit_code
        command.changed.set()

    def _command(self, box: Box, request: Request) -> Command | Response:
        session = self._session(box, request)
        if isinstance(session, Response):
            return session
        found = session.get(request.path_params["cmd"])
        return _error(404, "command not found") if found is None else found

    async def command_get(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        command = self._command(box, request)
        if isinstance(command, Response):
            return command
        return JSONResponse({"id": command.id, "command": command.command, "exitCode": command.exit_code})

    async def command_input(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        command = self._command(box, request)
        if isinstance(command, Response):
            return command
        if command.exit_code is not None:
            return _error(410, "command already completed")
        try:
            await command.process.write((await request.json())["data"].encode())
        except OSError as exc:
            return _error(410, f"session ended: {exc}")
        return Response(status_code=200)

    async def command_logs(self, websocket: WebSocket) -> None:
        if not self._authorized(websocket.headers):
            await websocket.close(code=4401)
            return
        box = self._find(websocket.path_params["sid"])
        session = box.sessions.get(websocket.path_params["session"]) if box else None
        command = session.get(websocket.path_params["cmd"]) if session else None
        await websocket.accept()
        if command is None:
            await websocket.close(code=4404)
            return
        sent = 0
        with contextlib.suppress(Exception):
            while True:
                while sent < len(command.log):
                    kind, data = command.log[sent]
                    sent += 1
                    await websocket.send_bytes((STDERR if kind == "stderr" else STDOUT) + data)
                if command.exit_code is not None and sent >= len(command.log):
                    break
                command.changed.clear()
                if sent < len(command.log) or command.exit_code is not None:
                    continue
                await command.changed.wait()
            await websocket.close()

    async def _fs(self, request: Request, argv: list[str]) -> tuple[Box, int, str, str] | Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        code, out, err = await box.machine.run(argv, record=False)
        return box, code, out.decode(errors="replace"), err.decode(errors="replace")

    @staticmethod
    def _info(line: str) -> dict[str, Any]:
        name, kind, mtime, mode, owner, group, size, path = line.split("|", 7)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(mtime)))
        return {
            "name": name,
            "isDir": kind == "d",
            "modTime": stamp,
            "mode": mode,
            "permissions": mode,
            "owner": owner,
            "group": group,
            "size": int(size),
            "path": path,
        }

    async def files_list(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        script = 'test -d "$1" || exit 2; find "$1" -mindepth 1 -maxdepth 1 -printf "%f|%y|%T@|%m|%u|%g|%s|%p\\n"'
        done = await self._fs(request, ["sh", "-c", script, "toolbox", path])
        if isinstance(done, Response):
            return done
        _, code, out, err = done
        if code == 2:
            return _error(404, f"directory not found: {path}")
        if code != 0:
            return _error(400, err)
        return JSONResponse([self._info(line) for line in out.splitlines() if line])

    async def files_info(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        script = 'test -e "$1" || test -L "$1" || exit 2; find "$1" -maxdepth 0 -printf "%f|%y|%T@|%m|%u|%g|%s|%p\\n"'
        done = await self._fs(request, ["sh", "-c", script, "toolbox", path])
        if isinstance(done, Response):
            return done
        _, code, out, err = done
        if code == 2:
            return _error(404, f"file not found: {path}")
        return JSONResponse(self._info(out.strip())) if code == 0 else _error(400, err)

    async def files_delete(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        recursive = request.query_params.get("recursive", "false").lower() == "true"
        script = (
            'test -e "$1" || test -L "$1" || exit 2; if [ "$2" = true ]; then rm -rf -- "$1"; else rm -f -- "$1"; fi'
        )
        done = await self._fs(request, ["sh", "-c", script, "toolbox", path, "true" if recursive else "false"])
        if isinstance(done, Response):
            return done
        _, code, _, err = done
        if code == 2:
            return _error(404, f"file not found: {path}")
        return Response(status_code=204) if code == 0 else _error(400, err)

    async def files_move(self, request: Request) -> Response:
        source, destination = request.query_params.get("source", ""), request.query_params.get("destination", "")
        done = await self._fs(request, ["mv", "--", source, destination])
        if isinstance(done, Response):
            return done
        _, code, _, err = done
        if code != 0:
            return _error(404 if "No such file" in err else 400, err)
        return Response(status_code=200)

    async def folder(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        path, mode = request.query_params.get("path", ""), request.query_params.get("mode", "755")
        code, _, err = await box.machine.run(["mkdir", "-p", "-m", mode, "--", path], record=False)
        return Response(status_code=200) if code == 0 else _error(400, err.decode(errors="replace"))

    async def upload(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        form = await request.form()
        paths: dict[str, str] = {}
        datas: dict[str, bytes] = {}
        for key, value in form.multi_items():
            index = key.split("]")[0].split("[")[-1]
            if key.endswith(".path"):
                paths[index] = str(value)
            elif hasattr(value, "read"):
                datas[index] = await value.read()
        for index, path in paths.items():
            script = 'cat > "$1"'
            code, _, err = await box.machine.run(
                ["sh", "-c", script, "toolbox", path], stdin=datas.get(index, b""), record=False
            )
            if code != 0:
                return _error(400, err.decode(errors="replace"))
        return Response(status_code=200)

    # -- previews ----------------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str, headers: dict[str, str]) -> None:
        port_text, _, key = host.removesuffix("." + PROXY_DOMAIN).partition("-")
        signed = self.secrets.get(f"preview:{key}")
        box = self.boxes.get(signed["box"]) if signed else self.boxes.get(key)
        if box is None or not port_text.isdigit():
            await _error(404, "sandbox not found")(scope, receive, send)
            return
        if not box.public and signed is None and headers.get("x-daytona-preview-token") != box.preview_token:
            await _error(401, "preview token required")(scope, receive, send)
            return
        # Streamed both ways with the request's method, query, headers and body, as Daytona's proxy does.
        await forward(scope, receive, send, f"http://{await machine_address(box.machine)}:{port_text}{scope['path']}")
