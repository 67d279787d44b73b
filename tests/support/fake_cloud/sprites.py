"""A fake Sprites control plane (Fly.io), as the ``sprites-py`` SDK 0.7.2 calls it.

Follows ``sprites-py`` 0.7.2 (``sprites/async_client.py``, ``async_sprite.py``, ``websocket.py``):

- Auth: ``Authorization: Bearer <token>`` on every request (the token is the whole
  ``org/projectNumber/tokenId/secret`` string); 401 otherwise, 404 for a missing sprite (the
  SDK raises ``AuthenticationError`` / ``NotFoundError`` from the status alone).
- ``POST /v1/sprites`` {name, labels, url_settings {auth}} -> sprite info (409 on a taken
  name); ``GET /v1/sprites?prefix=&max_results=&continuation_token=`` pages of at most
  ``page_size`` (``has_more``, ``next_continuation_token``); ``GET``/``PUT``/``DELETE``
  ``/v1/sprites/{name}`` (PUT takes url_settings and labels; DELETE answers 204).
- ``POST /v1/sprites/{name}/checkpoint`` {comment} and ``POST .../checkpoints/{id}/restore``
  answer NDJSON progress lines (``{"type": "info"|"complete"|"error", ...}``);
  ``GET .../checkpoints`` lists ``{id, create_time, comment}``. A checkpoint is a copy of the
  sprite's writable home kept inside the sprite (it dies with the sprite, as Sprites' do); a
  restore kills the sprite's processes and puts the copy back, in place.
- ``/v1/sprites/{name}/exec`` (WebSocket): ``cmd`` (repeated: argv), ``env`` (``K=V``),
  ``dir``, ``stdin=true`` in the query; binary frames, first byte the stream: 0 stdin,
  1 stdout, 2 stderr, 3 exit (one byte: the code), 4 stdin EOF. The command's session
  outlives the socket: a client that hangs up does not kill it (Sprites' detachable sessions).
- Preview traffic: ``Host: <name>.sprites.fake`` reaches the sprite's HTTP port (8080), only
  with the org token as a bearer unless the sprite's URL auth is ``public``.

Commands run as ``sprite`` (home ``/home/sprite``) through the in-VM agent (``agent.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .backend import FakeCloud, FakeService, Machine, Process, ServerThread, forward, machine_address, vendor_front

USER = "sprite"
HOME = "/home/sprite"
DOMAIN = "sprites.fake"
HTTP_PORT = 8080
_CHECKPOINTS = "/var/lib/fake-sprite-checkpoints"


@dataclass
class FakeSprite:
    machine: Machine
    name: str
    labels: list[str]
    auth: str
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


class FakeSprites(FakeService):
    """The fake cloud. ``start()`` serves it; ``api_url`` goes into the SDK's ``base_url``."""

    def __init__(self, image: str, *, token: str = "fake-org/1/tok_fake/s3cr3t", page_size: int = 2) -> None:
        self.cloud = FakeCloud(image, USER, HOME, recycle=True)  # wipe and pool a destroyed machine
        self.token = token
        self.page_size = page_size
        self.sprites: dict[str, FakeSprite] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path with query): tests scan these for secrets
        self.bodies: list[str] = []  # every JSON body as received
        self.create_delay = 0.0  # seconds the create call takes after the machine exists
        self._gone: list[Machine] = []
        self.server = ServerThread(self._app())

    @property
    def api_url(self) -> str:
        return self.server.url

    def machines(self) -> list[Machine]:
        return [s.machine for s in self.sprites.values()]

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        api = Starlette(
            routes=[
                Route("/v1/sprites", self.create, methods=["POST"]),
                Route("/v1/sprites", self.list, methods=["GET"]),
                Route("/v1/sprites/{name}", self.get, methods=["GET"]),
                Route("/v1/sprites/{name}", self.update, methods=["PUT"]),
                Route("/v1/sprites/{name}", self.delete, methods=["DELETE"]),
                Route("/v1/sprites/{name}/checkpoint", self.checkpoint, methods=["POST"]),
                Route("/v1/sprites/{name}/checkpoints", self.list_checkpoints, methods=["GET"]),
                Route("/v1/sprites/{name}/checkpoints/{cid}/restore", self.restore, methods=["POST"]),
                WebSocketRoute("/v1/sprites/{name}/exec", self.exec),
            ]
        )
        return vendor_front(api, DOMAIN, self.proxy, self.requests)

    def _authorized(self, headers: Any) -> bool:
        return bool(headers.get("authorization") == f"Bearer {self.token}")

    def _sprite(self, request: Request) -> FakeSprite | Response:
        if not self._authorized(request.headers):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        sprite = self.sprites.get(request.path_params["name"])
        if sprite is None:
            return JSONResponse({"error": "sprite not found"}, status_code=404)
        return sprite

    def _json(self, sprite: FakeSprite) -> dict[str, Any]:
        return {
            "id": f"sprite-{sprite.machine.id}",
            "name": sprite.name,
            "organization": self.token.split("/")[0],
            "status": "running" if sprite.machine.running else "cold",
            "url": f"http://{sprite.name}.{DOMAIN}",
            "url_settings": {"auth": sprite.auth},
            "labels": sprite.labels,
            "created_at": sprite.created_at,
            "updated_at": sprite.created_at,
        }

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = (await request.body()).decode()
        self.bodies.append(raw)
        return dict(json.loads(raw)) if raw else {}

    async def create(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        body = await self._body(request)
        name = str(body.get("name") or "")
        if not name:
            return JSONResponse({"error": "name is required"}, status_code=400)
        if name in self.sprites:
            return JSONResponse({"error": f"sprite {name} already exists"}, status_code=409)
        machine = await self.cloud.create()
        auth = str((body.get("url_settings") or {}).get("auth") or "sprite")
        sprite = FakeSprite(machine, name, [str(x) for x in body.get("labels") or []], auth)
        self.sprites[name] = sprite
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(self._json(sprite), status_code=201)

    async def list(self, request: Request) -> Response:
        if not self._authorized(request.headers):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        prefix = request.query_params.get("prefix") or ""
        size = min(int(request.query_params.get("max_results") or 100), self.page_size)
        start = int(request.query_params.get("continuation_token") or 0)
        names = sorted(n for n in self.sprites if n.startswith(prefix))
        page = names[start : start + size]
        more = start + size < len(names)
        return JSONResponse(
            {
                "sprites": [self._json(self.sprites[n]) for n in page],
                "has_more": more,
                "next_continuation_token": str(start + size) if more else None,
            }
        )

    async def get(self, request: Request) -> Response:
        sprite = self._sprite(request)
        return sprite if isinstance(sprite, Response) else JSONResponse(self._json(sprite))

    async def update(self, request: Request) -> Response:
        sprite = self._sprite(request)
        if isinstance(sprite, Response):
            return sprite
        body = await self._body(request)
        if "url_settings" in body:
            sprite.auth = str((body["url_settings"] or {}).get("auth") or sprite.auth)
        if "labels" in body:
            sprite.labels = [str(x) for x in body["labels"] or []]
        return JSONResponse(self._json(sprite))

    async def delete(self, request: Request) -> Response:
        sprite = self._sprite(request)
        if isinstance(sprite, Response):
            return sprite
        del self.sprites[sprite.name]
        self._gone.append(sprite.machine)
        await self.cloud.remove(sprite.machine.id)
        return Response(status_code=204)

    async def checkpoint(self, request: Request) -> Response:
        sprite = self._sprite(request)
        if isinstance(sprite, Response):
            return sprite
        body = await self._body(request)
        cid = f"v{len(sprite.checkpoints) + 1}"
        # Stored under this sprite's name: a pooled machine may hold an earlier sprite's checkpoints.
        store = f"{_CHECKPOINTS}/{sprite.name}-{cid}"
        save = f"mkdir -p {_CHECKPOINTS} && rm -rf {store} && cp -a {HOME} {store}"
        code, _, err = await sprite.machine.run(["sh", "-c", save], user="root", record=False)
        if code != 0:
            return _ndjson({"type": "error", "error": err.decode(errors="replace")})
        sprite.checkpoints.append(
            {
                "id": cid,
                "create_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "comment": body.get("comment"),
            }
        )
        return _ndjson({"type": "info", "data": "Creating checkpoint..."}, {"type": "complete", "data": cid})

    async def list_checkpoints(self, request: Request) -> Response:
        sprite = self._sprite(request)
        return sprite if isinstance(sprite, Response) else JSONResponse(sprite.checkpoints)

    async def restore(self, request: Request) -> Response:
        sprite = self._sprite(request)
        if isinstance(sprite, Response):
            return sprite
        cid = request.path_params["cid"]
        if not any(c["id"] == cid for c in sprite.checkpoints):
            return JSONResponse({"error": "checkpoint not found"}, status_code=404)
        # The environment restarts: every process of the sprite's user goes, the overlay is put back.
        store = f"{_CHECKPOINTS}/{sprite.name}-{cid}"
        reset = f"pkill -KILL -u {USER}; rm -rf {HOME} && cp -a {store} {HOME} && chown -R {USER} {HOME}"
        code, _, err = await sprite.machine.run(["sh", "-c", reset], user="root", record=False)
        if code != 0:
            return _ndjson({"type": "error", "error": err.decode(errors="replace")})
        return _ndjson({"type": "info", "data": "Restoring..."}, {"type": "complete", "data": f"Restored {cid}"})

    # -- exec sessions -----------------------------------------------------------------------------

    async def exec(self, websocket: WebSocket) -> None:
        if not self._authorized(websocket.headers):
            await websocket.close(code=1008, reason="unauthorized")
            return
        sprite = self.sprites.get(websocket.path_params["name"])
        if sprite is None:
            await websocket.close(code=1008, reason="sprite not found")
            return
        query = websocket.query_params.multi_items()
        argv = [v for k, v in query if k == "cmd"]
        env = dict(v.partition("=")[::2] for k, v in query if k == "env")
        cwd = next((v for k, v in query if k == "dir"), HOME)
        await websocket.accept()
        try:
            process = await sprite.machine.start(argv, env=env, cwd=cwd, stdin=True)
        except OSError as exc:
            await websocket.send_bytes(b"\x02" + str(exc).encode())
            await websocket.send_bytes(b"\x03\x7f")
            await websocket.close()
            return
        upstream = asyncio.ensure_future(self._upstream(websocket, process))
        try:
            while (item := await process.output.get()) is not None:
                await websocket.send_bytes((b"\x02" if item[0] == "stderr" else b"\x01") + item[1])
            code = await process.exit_code
            await websocket.send_bytes(b"\x03" + bytes([code & 0xFF]))
            await websocket.close()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the session lives on: a hung-up client does not end the command
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream

    async def _upstream(self, websocket: WebSocket, process: Process) -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("bytes") or b""
            if not frame:
                continue
            if frame[0] == 0 and process.stdin_open:
                with contextlib.suppress(OSError):
                    await process.write(frame[1:])
            elif frame[0] == 4:
                process.close_stdin()

    # -- preview traffic -----------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str, headers: dict[str, str]) -> None:
        sprite = self.sprites.get(host.removesuffix("." + DOMAIN))
        if sprite is None:
            await PlainTextResponse("no such sprite", status_code=404)(scope, receive, send)
            return
        if sprite.auth != "public" and headers.get("authorization") != f"Bearer {self.token}":
            await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
            return
        await forward(
            scope, receive, send, f"http://{await machine_address(sprite.machine)}:{HTTP_PORT}{scope['path']}"
        )


def _ndjson(*lines: dict[str, Any]) -> Response:
    return Response("".join(json.dumps(line) + "\n" for line in lines), media_type="application/x-ndjson")
