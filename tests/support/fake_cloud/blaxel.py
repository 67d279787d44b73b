"""A fake Blaxel: the control plane and the sandbox API, as the ``blaxel`` SDK 0.4.24 calls them.

Follows ``blaxel`` 0.4.24 (``blaxel/core/client/api/compute/*``, ``blaxel/core/sandbox/default/*``):

- Control plane (``X-Blaxel-Authorization: Bearer <key>`` and ``X-Blaxel-Workspace`` checked):
  ``POST /sandboxes`` (Sandbox: metadata.name/labels, spec.runtime image/memory/ttl/envs,
  spec.region) -> 200 Sandbox with ``metadata.url`` (the sandbox API), 409 for a name in use;
  ``GET /sandboxes/{name}`` -> 200 / 404; a deleted sandbox stays readable as ``TERMINATED``
  (Blaxel's terminated retention); ``DELETE /sandboxes/{name}`` -> 200 (status DELETING) / 404;
  ``GET /sandboxes`` (cursor, limit) -> ``{data, meta{hasMore, nextCursor}}``, paginated, without
  terminated records; ``GET/POST /sandboxes/{name}/previews[/{preview}]`` and
  ``POST .../previews/{preview}/tokens``.
- Sandbox API (``metadata.url`` = ``/sandbox/{name}``, same auth headers): ``POST /process``
  (ProcessRequest: command, env, workingDir, waitForCompletion, timeout). A command runs as the
  sandbox's process manager runs it: ``sh -c <command>`` as root in a session of its own, env
  merged over the sandbox env. With ``Accept: text/event-stream`` and waitForCompletion the answer
  is NDJSON (``application/x-ndjson``: ``{"type": "stdout"|"stderr", "data"}`` records, then
  ``{"type": "result", "data": "<ProcessResponse JSON>"}``); without, one ProcessResponse JSON
  once the command ended. A dropped client does not stop the command (it is the VM's process).
- Previews: ``/preview/{sandbox}/{port}/...`` proxies to the machine's port; a private preview
  needs ``X-Blaxel-Preview-Token`` with a token minted for it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .backend import FakeCloud, FakeService, Machine, ServerThread


@dataclass
class Box:
    machine: Machine | None
    record: dict[str, Any]
    previews: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, set[str]] = field(default_factory=dict)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": status, "message": message}, status_code=status)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FakeBlaxel(FakeService):
    """The fake cloud. ``start()`` serves it; ``api_url`` goes to the provider, ``api_key``/``workspace`` too."""

    def __init__(
        self, image: str, *, api_key: str = "bl_fake_key", workspace: str = "fake-ws", page_size: int = 2
    ) -> None:
        self.cloud = FakeCloud(image, "root", "/root", uid=0)
        self.api_key = api_key
        self.workspace = workspace
        self.page_size = page_size
        self.boxes: dict[str, Box] = {}
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[str] = []  # every request body the fake received (tests scan them for secrets)
        self.create_delay = 0.0  # seconds the create call takes after the machine exists
        self._gone: list[Machine] = []
        self.server = ServerThread(self._app())

    @property
    def api_url(self) -> str:
        return self.server.url

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        return Starlette(
            routes=[
                Route("/sandboxes", self.create, methods=["POST"]),
                Route("/sandboxes", self.list, methods=["GET"]),
                Route("/sandboxes/{name}", self.get, methods=["GET"]),
                Route("/sandboxes/{name}", self.delete, methods=["DELETE"]),
                Route("/sandboxes/{name}/previews", self.preview_create, methods=["POST"]),
                Route("/sandboxes/{name}/previews/{preview}", self.preview_get, methods=["GET"]),
                Route("/sandboxes/{name}/previews/{preview}/tokens", self.token_create, methods=["POST"]),
                Route("/sandbox/{name}/process", self.process, methods=["POST"]),
                Route("/preview/{name}/{port:int}/{rest:path}", self.preview_proxy, methods=["GET"]),
            ]
        )

    async def _authed(self, request: Request) -> Response | None:
        self.requests.append((request.method, request.url.path))
        self.bodies.append((await request.body()).decode(errors="replace"))
        if request.headers.get("x-blaxel-authorization") != f"Bearer {self.api_key}":
            return _error(401, "Unauthorized")
        if request.headers.get("x-blaxel-workspace") != self.workspace:
            return _error(403, "UNAUTHORIZED_WORKSPACE")
        return None

    def _live(self, name: str) -> Box | None:
        box = self.boxes.get(name)
        if box is None or box.machine is None or box.record["status"] != "DEPLOYED":
            return None
        return box

    async def create(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        body = await request.json()
        metadata = dict(body.get("metadata") or {})
        spec = dict(body.get("spec") or {})
        runtime = dict(spec.get("runtime") or {})
        name = metadata.get("name") or f"sandbox-{secrets.token_hex(4)}"
        existing = self.boxes.get(name)
        if existing is not None and existing.record["status"] != "TERMINATED":
            return _error(409, f"Sandbox {name} already exists")
        envs = {e["name"]: e["value"] for e in runtime.get("envs") or []}
        machine = await self.cloud.create(env=envs, sandbox_id=name)
        record = {
            "metadata": {
                "name": name,
                "labels": metadata.get("labels") or {},
                "url": f"{self.server.url}/sandbox/{name}",
                "workspace": self.workspace,
                "createdAt": _now(),
            },
            "spec": {"runtime": runtime, "region": spec.get("region") or "us-pdx-1"},
            "status": "DEPLOYED",
        }
        self.boxes[name] = Box(machine, record)
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(record)

    async def get(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self.boxes.get(request.path_params["name"])
        if box is None:
            return _error(404, "Sandbox not found")
        return JSONResponse(box.record)

    async def delete(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self.boxes.get(request.path_params["name"])
        if box is None or box.record["status"] == "TERMINATED":
            return _error(404, "Sandbox not found")
        answer = {**box.record, "status": "DELETING"}
        # The record stays readable as TERMINATED for a while (Blaxel's terminated retention).
        box.record["status"] = "TERMINATED"
        if box.machine is not None:
            self._gone.append(box.machine)
            await self.cloud.remove(box.machine.id)
            box.machine = None
        return JSONResponse(answer)

    async def list(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        live = [b.record for b in self.boxes.values() if b.record["status"] != "TERMINATED"]
        start = int(request.query_params.get("cursor") or 0)
        limit = min(int(request.query_params.get("limit") or 50), self.page_size)
        page = live[start : start + limit]
        more = start + limit < len(live)
        meta = {"hasMore": more, "nextCursor": str(start + limit) if more else ""}
        return JSONResponse({"data": page, "meta": meta})

    # -- previews --------------------------------------------------------------------------------

    def _preview(self, name: str, preview: dict[str, Any]) -> dict[str, Any]:
        port = preview["spec"]["port"]
        return {
            "metadata": {"name": preview["metadata"]["name"], "resourceName": name, "resourceType": "sandbox"},
            "spec": {
                "port": port,
                "public": bool(preview["spec"].get("public")),
                "url": f"{self.server.url}/preview/{name}/{port}",
            },
            "status": "DEPLOYED",
        }

    async def preview_create(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self._live(request.path_params["name"])
        if box is None:
            return _error(404, "Sandbox not found")
        made = self._preview(request.path_params["name"], await request.json())
        box.previews[made["metadata"]["name"]] = made
        return JSONResponse(made)

    async def preview_get(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self._live(request.path_params["name"])
        preview = box.previews.get(request.path_params["preview"]) if box else None
        if preview is None:
            return _error(404, "Preview not found")
        return JSONResponse(preview)

    async def token_create(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self._live(request.path_params["name"])
        preview_name = request.path_params["preview"]
        if box is None or preview_name not in box.previews:
            return _error(404, "Preview not found")
        body = await request.json()
        token = secrets.token_hex(16)
        box.tokens.setdefault(preview_name, set()).add(token)
        return JSONResponse(
            {
                "metadata": {"name": f"token-{token[:6]}", "previewName": preview_name},
                "spec": {"token": token, "expiresAt": (body.get("spec") or {}).get("expiresAt"), "expired": False},
            }
        )

    async def preview_proxy(self, request: Request) -> Response:
        box = self._live(request.path_params["name"])
        port = request.path_params["port"]
        preview = next((p for p in (box.previews.values() if box else ()) if p["spec"]["port"] == port), None)
        if box is None or box.machine is None or preview is None:
            return _error(404, "Preview not found")
        if not preview["spec"]["public"]:
            token = request.headers.get("x-blaxel-preview-token")
            if token not in box.tokens.get(preview["metadata"]["name"], set()):
                return _error(401, "a private preview needs X-Blaxel-Preview-Token")
        cloud = box.machine.cloud
        info = await cloud.call(cloud.api.inspect_container, box.machine.container)
        address = (info.get("NetworkSettings") or {}).get("IPAddress")
        async with httpx.AsyncClient(timeout=10) as client:
            try:
                upstream = await client.get(f"http://{address}:{port}/{request.path_params['rest']}")
            except httpx.HTTPError as exc:
                return _error(502, f"port {port} is not open: {exc}")
        return Response(upstream.content, status_code=upstream.status_code)

    # -- processes -------------------------------------------------------------------------------

    async def process(self, request: Request) -> Response:
        if (denied := await self._authed(request)) is not None:
            return denied
        box = self._live(request.path_params["name"])
        if box is None or box.machine is None:
            return _error(404, "Sandbox not found")
        body = await request.json()
        command = str(body["command"])
        cwd = str(body.get("workingDir") or "/")
        env = {str(k): str(v) for k, v in (body.get("env") or {}).items()}
        try:
            started = await box.machine.start(["sh", "-c", command], env=env, cwd=cwd)
        except OSError as exc:
            return _error(400, str(exc))
        name = str(body.get("name") or f"proc-{secrets.token_hex(4)}")
        begun = _now()
        out, err = bytearray(), bytearray()

        def result(code: int) -> dict[str, Any]:
            return {
                "command": command,
                "completedAt": _now(),
                "exitCode": code,
                "logs": (out + err).decode(errors="replace"),
                "name": name,
                "pid": str(started.pid),
                "startedAt": begun,
                "status": "completed" if code == 0 else "failed",
                "stderr": err.decode(errors="replace"),
                "stdout": out.decode(errors="replace"),
                "workingDir": cwd,
            }

        if "text/event-stream" in request.headers.get("accept", "") and body.get("waitForCompletion"):

            async def records() -> Any:
                while (item := await started.output.get()) is not None:
                    (err if item[0] == "stderr" else out).extend(item[1])
                    text = item[1].decode(errors="replace")
                    yield json.dumps({"type": item[0], "data": text}) + "\n"
                code = await started.exit_code
                yield json.dumps({"type": "result", "data": json.dumps(result(code))}) + "\n"

            return StreamingResponse(records(), media_type="application/x-ndjson")
        timeout = float(body.get("timeout") or 0) or None
        deadline = time.monotonic() + timeout if timeout else None
        while (item := await started.output.get()) is not None:
            (err if item[0] == "stderr" else out).extend(item[1])
            if deadline is not None and time.monotonic() > deadline:
                break
        code = await started.exit_code
        return JSONResponse(result(code))
