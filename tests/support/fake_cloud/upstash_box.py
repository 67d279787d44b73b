"""A fake Upstash Box: the REST API and the exec-session WebSocket, as the ``upstash-box`` SDK 0.4.0 calls them.

Follows ``upstash-box`` 0.4.0 (``upstash_box/_async/client.py``, ``_exec_session.py``, ``_common.py``):

- Auth: ``X-Box-Api-Key`` on every request (a bad key is 401 ``{"error": ...}``; errors are
  ``{"error": message}`` with their status, which the SDK raises as ``BoxError(status_code)``).
- ``POST /v2/box`` (runtime, size, env_vars, labels, network_policy {mode}) -> BoxData
  (``running``); ``POST /v2/box/from-snapshot`` (+ snapshot_id); ``GET /v2/box/{id}`` (404 once
  deleted); ``GET /v2/box?label=``; ``DELETE /v2/box/{id}``; ``GET /v2/box/{id}/status``;
  ``POST /v2/box/{id}/pause`` / ``resume``; ``POST /v2/box/{id}/exec`` ({command: argv,
  folder}) -> {exit_code, output, error}; ``POST /v2/box/{id}/snapshots`` ({name}) -> Snapshot
  (``ready``), ``GET`` lists them; ``POST /v2/box/{id}/preview`` ({port, bearer_token,
  basic_auth}) -> {url, port, token | username + password}.
- ``/v2/box/{id}/exec-session`` (WebSocket, JSON frames): ``start`` {cmd (run as ``bash -lc``),
  cwd, env ["K=V"]} -> ``started`` {pid, execId}; ``stdout``/``stderr`` {data: base64};
  ``stdin`` {data: base64}, ``stdin_close``; ``signal`` {signal} and ``terminate`` go to the
  process tree (its group: a forked child gets them, as the seed measured); ``exit`` {code}
  (128 + N after a signal). A dropped connection kills the command (the session owns it).
- Preview traffic: ``Host: <id>-<port>.box.fake`` is proxied to the machine's port, checking
  the bearer token or Basic credentials when the URL was made with them.

The box home is ``/workspace/home``; commands run as root through the in-VM agent (``agent.py``).
"""

from __future__ import annotations

import asyncio
import base64
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

from .backend import FakeCloud, FakeService, Machine, Process, ServerThread, forward, machine_address, vendor_front

HOME = "/workspace/home"
DOMAIN = "box.fake"
_SIGNALS = {"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12, "TSTP": 20}


@dataclass
class Box:
    machine: Machine
    runtime: str
    size: str
    labels: list[str]
    network_policy: dict[str, Any]
    status: str = "running"
    previews: dict[int, dict[str, Any]] = field(default_factory=dict)
    created_at: int = field(default_factory=lambda: int(time.time() * 1000))


class FakeUpstashBox(FakeService):
    """The fake cloud. ``start()`` serves it; ``base_url`` goes into the SDK's options."""

    def __init__(self, image: str, *, api_key: str = "box_fake_key") -> None:
        self.cloud = FakeCloud(image, "root", HOME, uid=0)
        self.api_key = api_key
        self.boxes: dict[str, Box] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}  # id -> snapshot record (with its image)
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[dict[str, Any]] = []  # every create body as received
        self.create_delay = 0.0  # seconds the create call takes after the machine exists
        self._gone: list[Machine] = []
        self.server = ServerThread(self._app())

    @property
    def base_url(self) -> str:
        return self.server.url

    def machines(self) -> list[Machine]:
        return [b.machine for b in self.boxes.values()]

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        api = Starlette(
            routes=[
                Route("/v2/box", self.create, methods=["POST"]),
                Route("/v2/box", self.list, methods=["GET"]),
                Route("/v2/box/from-snapshot", self.from_snapshot, methods=["POST"]),
                Route("/v2/box/{id}", self.get, methods=["GET"]),
                Route("/v2/box/{id}", self.delete, methods=["DELETE"]),
                Route("/v2/box/{id}/status", self.status, methods=["GET"]),
                Route("/v2/box/{id}/pause", self.pause, methods=["POST"]),
                Route("/v2/box/{id}/resume", self.resume, methods=["POST"]),
                Route("/v2/box/{id}/exec", self.exec, methods=["POST"]),
                Route("/v2/box/{id}/snapshots", self.snapshot, methods=["POST"]),
                Route("/v2/box/{id}/snapshots", self.list_snapshots, methods=["GET"]),
                Route("/v2/box/{id}/preview", self.preview, methods=["POST"]),
                WebSocketRoute("/v2/box/{id}/exec-session", self.session),
            ]
        )
        return vendor_front(api, DOMAIN, self.proxy, self.requests, query=False)

    def _auth(self, request: Request) -> Response | None:
        if request.headers.get("x-box-api-key") != self.api_key:
            return JSONResponse({"error": "invalid API key"}, status_code=401)
        return None

    def _box(self, request: Request) -> Box | Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        box = self.boxes.get(request.path_params["id"])
        if box is None or box.status == "deleted":
            return JSONResponse({"error": "box not found"}, status_code=404)
        return box

    def _json(self, box_id: str, box: Box) -> dict[str, Any]:
        return {
            "id": box_id,
            "status": box.status,
            "created_at": box.created_at,
            "updated_at": box.created_at,
            "labels": box.labels,
            "size": box.size,
            "runtime": box.runtime,
            "network_policy": box.network_policy,
        }

    async def _make(self, body: dict[str, Any], image: str | None) -> Response:
        self.bodies.append(body)
        policy = dict(body.get("network_policy") or {"mode": "allow-all"})
        machine = await self.cloud.create(
            image=image, env=dict(body.get("env_vars") or {}), network=policy.get("mode") != "deny-all"
        )
        box = Box(
            machine,
            str(body.get("runtime") or "node"),
            str(body.get("size") or "small"),
            list(body.get("labels") or []),
            policy,
        )
        self.boxes[machine.id] = box
        await machine.run(["mkdir", "-p", HOME], user="root", record=False)
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(self._json(machine.id, box))

    async def create(self, request: Request) -> Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        return await self._make(await request.json(), None)

    async def from_snapshot(self, request: Request) -> Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        body = await request.json()
        snapshot = self.snapshots.get(str(body.get("snapshot_id")))
        if snapshot is None or snapshot["status"] != "ready":
            return JSONResponse({"error": "snapshot not found"}, status_code=404)
        return await self._make(body, snapshot["image"])

    async def list(self, request: Request) -> Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        label = request.query_params.get("label")
        rows = [
            self._json(i, b)
            for i, b in self.boxes.items()
            if b.status != "deleted" and (label is None or label in b.labels)
        ]
        return JSONResponse(rows)

    async def get(self, request: Request) -> Response:
        box = self._box(request)
        return box if isinstance(box, Response) else JSONResponse(self._json(request.path_params["id"], box))

    async def delete(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        box.status = "deleted"
        self._gone.append(box.machine)
        await self.cloud.remove(box.machine.id)
        return JSONResponse({"id": request.path_params["id"], "status": "deleted"})

    async def status(self, request: Request) -> Response:
        box = self._box(request)
        return box if isinstance(box, Response) else JSONResponse({"status": box.status})

    async def pause(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        box.status = "paused"
        return JSONResponse({})

    async def resume(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        box.status = "running"
        return JSONResponse({})

    async def exec(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        if box.status != "running":
            return JSONResponse({"error": "box is not running"}, status_code=409)
        body = await request.json()
        folder = str(body.get("folder") or "")
        cwd = folder if folder.startswith("/") else f"{HOME}/{folder}".rstrip("/")
        try:
            code, out, err = await box.machine.run([str(a) for a in body["command"]], cwd=cwd)
        except OSError as exc:
            return JSONResponse({"error": f"exec failed: {exc}"}, status_code=400)
        return JSONResponse(
            {"exit_code": code, "output": out.decode(errors="replace"), "error": err.decode(errors="replace")}
        )

    async def snapshot(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        body = await request.json()
        image = await self.cloud.commit(box.machine, "boxwright-fake-upstash-snapshot")
        record = {
            "id": f"snap_{uuid.uuid4().hex[:12]}",
            "name": str(body.get("name") or ""),
            "box_id": request.path_params["id"],
            "size_bytes": 1024,
            "status": "ready",
            "created_at": int(time.time() * 1000),
        }
        self.snapshots[record["id"]] = {**record, "image": image}
        return JSONResponse(record)

    async def list_snapshots(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        mine = [
            {k: v for k, v in s.items() if k != "image"}
            for s in self.snapshots.values()
            if s["box_id"] == request.path_params["id"]
        ]
        return JSONResponse({"snapshots": mine})

    async def preview(self, request: Request) -> Response:
        box = self._box(request)
        if isinstance(box, Response):
            return box
        body = await request.json()
        port = int(body["port"])
        if not 0 < port < 65536:
            return JSONResponse({"error": "invalid port"}, status_code=400)
        made: dict[str, Any] = {"url": f"https://{request.path_params['id']}-{port}.{DOMAIN}", "port": port}
        if body.get("bearer_token"):
            made["token"] = secrets.token_hex(12)
        if body.get("basic_auth"):
            made["username"], made["password"] = "box", secrets.token_hex(8)
        box.previews[port] = made
        return JSONResponse(made)

    # -- exec sessions -----------------------------------------------------------------------------

    async def session(self, websocket: WebSocket) -> None:
        if websocket.headers.get("x-box-api-key") != self.api_key:
            await websocket.close(code=1008, reason="invalid API key")
            return
        box = self.boxes.get(websocket.path_params["id"])
        if box is None or box.status != "running":
            await websocket.close(code=1008, reason="box not found")
            return
        await websocket.accept()
        try:
            start = json.loads(await websocket.receive_text())
        except (WebSocketDisconnect, ValueError):
            return
        env = dict(item.partition("=")[::2] for item in (start.get("env") or []))
        argv = list(start["argv"]) if start.get("argv") else ["bash", "-lc", str(start.get("cmd") or "")]
        try:
            process = await box.machine.start(argv, env=env, cwd=str(start.get("cwd") or HOME), stdin=True)
        except OSError as exc:
            await websocket.send_text(json.dumps({"type": "error", "message": str(exc)}))
            await websocket.close()
            return
        upstream = asyncio.ensure_future(self._upstream(websocket, box.machine, process))
        try:
            await websocket.send_text(json.dumps({"type": "started", "pid": process.pid, "execId": uuid.uuid4().hex}))
            while (item := await process.output.get()) is not None:
                data = base64.b64encode(item[1]).decode()
                await websocket.send_text(json.dumps({"type": item[0], "data": data}))
            code = await process.exit_code
            await websocket.send_text(json.dumps({"type": "exit", "code": code}))
            await websocket.close()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            if not process.exit_code.done():  # the session owns its process: a dropped link kills it
                with contextlib.suppress(Exception):
                    await box.machine.ask({"op": "signal", "pid": -process.pid, "sig": 9}, check=False)

    async def _upstream(self, websocket: WebSocket, machine: Machine, process: Process) -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                if not process.exit_code.done():  # the session owns its process: a dropped link kills it
                    await machine.ask({"op": "signal", "pid": -process.pid, "sig": 9}, check=False)
                return
            try:
                frame = json.loads(message.get("text") or message.get("bytes") or b"")
            except ValueError:
                continue
            kind = frame.get("type")
            if kind == "stdin" and process.stdin_open:
                with contextlib.suppress(OSError):
                    await process.write(base64.b64decode(frame.get("data") or ""))
            elif kind == "stdin_close":
                process.close_stdin()
            elif kind in ("signal", "terminate") and not process.exit_code.done():
                signo = _SIGNALS.get(str(frame.get("signal") or "TERM").upper(), 15)
                # The process tree (its group), as the box agent does.
                await machine.ask({"op": "signal", "pid": -process.pid, "sig": signo}, check=False)
                if kind == "terminate":
                    grace = float(frame.get("graceMs") or 2000) / 1000
                    asyncio.get_running_loop().call_later(
                        grace,
                        lambda: asyncio.ensure_future(
                            machine.ask({"op": "signal", "pid": -process.pid, "sig": 9}, check=False)
                        ),
                    )

    # -- preview traffic -----------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str, headers: dict[str, str]) -> None:
        label = host.removesuffix("." + DOMAIN)
        box_id, _, port_text = label.rpartition("-")
        box = self.boxes.get(box_id)
        made = box.previews.get(int(port_text)) if box is not None and port_text.isdigit() else None
        if box is None or made is None:
            await Response("no such preview", status_code=404)(scope, receive, send)
            return
        given = headers.get("authorization", "")
        if made.get("token") and given != f"Bearer {made['token']}":
            await Response("unauthorized", status_code=401)(scope, receive, send)
            return
        if made.get("username"):
            pair = base64.b64encode(f"{made['username']}:{made['password']}".encode()).decode()
            if given != f"Basic {pair}":
                await Response("unauthorized", status_code=401)(scope, receive, send)
                return
        await forward(scope, receive, send, f"http://{await machine_address(box.machine)}:{port_text}{scope['path']}")
