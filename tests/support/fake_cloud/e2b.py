"""A fake E2B: the control-plane REST API and envd, as the ``e2b`` SDK 2.63 calls them.

Follows ``e2b`` 2.63.0 (``e2b/api/client/api/*``, ``e2b/envd/*``), envd version 0.5.8:

- API (``X-API-KEY``): ``POST /v2/sandboxes`` (templateID, envVars, metadata, timeout,
  allow_internet_access, network.allowPublicTraffic, autoPause) -> 201 Sandbox;
  ``POST /v2/sandboxes/{id}/connect`` -> 200 / 404; ``DELETE /sandboxes/{id}`` -> 204 / 404;
  ``GET /v2/sandboxes`` (metadata=urlencoded k=v, limit, nextToken; ``x-next-token`` header:
  paginated); ``POST /sandboxes/{id}/snapshots`` -> 201 {snapshotID, names};
  ``POST /sandboxes/{id}/fork`` -> 201 [{sandbox}]; ``DELETE /templates/{id}``.
- envd (one URL for every sandbox, routed by the ``E2b-Sandbox-Id`` header as on
  ``sandbox.e2b.app``; ``X-Access-Token`` checked): ``GET /health``; ``GET/POST /files``
  (octet-stream and multipart uploads); the Connect-RPC ``process.Process`` service (Start,
  Connect, List, SendInput, CloseStdin, SendSignal) served with the protobuf and connectrpc
  modules the SDK itself ships. A command runs as envd runs it: ``/bin/bash -l -c <cmd>``
  as the Basic-auth user (default ``user``, home ``/home/user``), sandbox envs under its
  own; ``SendSignal`` signals the pid alone (so a background child survives it, as the seed
  measured); a signal death ends with exit_code -1 and ``status "signal: killed"``.
- Port traffic: ``<port>-<id>.<domain>`` in the Host header is proxied to the machine's
  port; with public traffic off it needs ``e2b-traffic-access-token``.

Commands run through the machine's in-VM agent (``agent.py``), which sees true wait statuses.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import signal as signals
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .backend import FakeCloud, FakeService, Machine, ServerThread, forward, machine_address

ENVD_VERSION = "0.5.8"
DOMAIN = "e2b.fake"


@dataclass
class Box:
    machine: Machine
    template: str
    metadata: dict[str, str]
    envd_token: str
    traffic_token: str | None
    timeout: int
    end_at: float
    started_at: float = field(default_factory=time.time)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _signal_name(code: int) -> str:
    try:
        name = signals.Signals(code - 128).name.removeprefix("SIG")
    except ValueError:
        return str(code - 128)
    return {"KILL": "killed", "TERM": "terminated", "INT": "interrupt", "HUP": "hangup"}.get(name, name.lower())


class FakeE2B(FakeService):
    """The fake cloud. ``start()`` serves it; ``api_url``/``envd_url`` go into the SDK's options."""

    def __init__(self, image: str, *, api_key: str = "e2b_fake_key", page_size: int = 2) -> None:
        self.cloud = FakeCloud(image, "user", "/home/user", recycle=True)
        self.api_key = api_key
        self.page_size = page_size
        self.boxes: dict[str, Box] = {}
        self.snapshots: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.create_delay = 0.0  # seconds the create call takes after the machine exists
        self.start_delay = 0.0  # seconds envd takes to confirm a started process
        self.server = ServerThread(self._app())

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return self.server.url

    @property
    def envd_url(self) -> str:
        return self.server.url

    def commands(self) -> list[str]:
        """Every command line envd was asked to run (``bash -l -c`` argument), across all sandboxes."""
        seen: list[str] = []
        for machine in list(self.cloud.machines.values()) + list(self._gone_machines):
            seen.extend(" ".join(c.argv) for c in machine.commands)
        return seen

    _gone_machines: list[Machine]

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        self._gone_machines = []
        service = _Process(self)
        rpc = process_connect.ProcessASGIApplication(service)
        api = Starlette(
            routes=[
                Route("/v2/sandboxes", self.create, methods=["POST"]),
                Route("/v2/sandboxes", self.list, methods=["GET"]),
                Route("/v2/sandboxes/{id}/connect", self.connect, methods=["POST"]),
                Route("/sandboxes/{id}", self.kill, methods=["DELETE"]),
                Route("/sandboxes/{id}/snapshots", self.snapshot, methods=["POST"]),
                Route("/sandboxes/{id}/fork", self.fork, methods=["POST"]),
                Route("/templates/{id}", self.delete_template, methods=["DELETE"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/files", self.files_get, methods=["GET"]),
                Route("/files", self.files_post, methods=["POST"]),
            ]
        )

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            host = headers.get("host", "")
            if host.endswith("." + DOMAIN) and not host.startswith("api."):
                await self.proxy(scope, receive, send, host, headers)
                return
            self.requests.append((scope["method"], scope["path"]))
            if scope["path"].startswith("/process.Process/"):
                box = self._envd_box(headers)
                if isinstance(box, Response):
                    await box(scope, receive, send)
                    return
            await (rpc if scope["path"].startswith("/process.") else api)(scope, receive, send)

        return app

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("x-api-key") == self.api_key

    def _envd_box(self, headers: dict[str, str]) -> Box | Response:
        box = self.boxes.get(headers.get("e2b-sandbox-id", ""))
        if box is None or not box.machine.running:
            return _error(502, "The sandbox was not found")
        if headers.get("x-access-token") != box.envd_token:
            return _error(401, "invalid access token")
        return box

    def _sandbox_json(self, sandbox_id: str, box: Box) -> dict[str, Any]:
        return {
            "templateID": box.template,
            "sandboxID": sandbox_id,
            "clientID": "fake",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": box.envd_token,
            "trafficAccessToken": box.traffic_token,
            "domain": DOMAIN,
        }

    async def _new_box(
        self, template: str, env: dict[str, str], metadata: dict[str, str], network: bool, public: bool, timeout: int
    ) -> tuple[str, Box]:
        image = self.snapshots.get(template)
        if image is None and template != "base":
            raise LookupError(template)
        machine = await self.cloud.create(image=image, env=env, network=network)
        box = Box(
            machine,
            template,
            metadata,
            secrets.token_hex(8),
            None if public else secrets.token_hex(8),
            timeout,
            time.time() + timeout,
        )
        self.boxes[machine.id] = box
        return machine.id, box

    # -- API -------------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        body = await request.json()
        network = body.get("network") or {}
        try:
            sandbox_id, box = await self._new_box(
                str(body.get("templateID") or "base"),
                dict(body.get("envVars") or {}),
                dict(body.get("metadata") or {}),
                body.get("allow_internet_access", True) is not False,
                network.get("allowPublicTraffic", True) is not False,
                int(body.get("timeout") or 15),
            )
        except LookupError:
            return _error(404, f"template '{body.get('templateID')}' not found")
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return JSONResponse(self._sandbox_json(sandbox_id, box), status_code=201)

    async def connect(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        sandbox_id = request.path_params["id"]
        box = self.boxes.get(sandbox_id)
        if box is None or time.time() > box.end_at:
            return _error(404, f"sandbox {sandbox_id} not found")
        body = await request.json()
        if body.get("timeout"):
            box.end_at = max(box.end_at, time.time() + int(body["timeout"]))
        return JSONResponse(self._sandbox_json(sandbox_id, box), status_code=200)

    async def kill(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        box = self.boxes.pop(request.path_params["id"], None)
        if box is None:
            return _error(404, "sandbox not found")
        self._gone_machines.append(box.machine)
        await self.cloud.remove(box.machine.id)
        return Response(status_code=204)

    async def list(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        wanted = dict(urllib.parse.parse_qsl(request.query_params.get("metadata", "")))
        wanted = {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in wanted.items()}
        rows = [
            (sid, box)
            for sid, box in sorted(self.boxes.items())
            if all(box.metadata.get(k) == v for k, v in wanted.items())
        ]
        start = int(request.query_params.get("nextToken") or 0)
        limit = min(int(request.query_params.get("limit") or self.page_size), self.page_size)
        page = rows[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(rows) else {}
        body = [
            {
                "templateID": box.template,
                "sandboxID": sid,
                "clientID": "fake",
                "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(box.started_at)),
                "endAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(box.end_at)),
                "cpuCount": 2,
                "memoryMB": 512,
                "diskSizeMB": 1024,
                "state": "running",
                "envdVersion": ENVD_VERSION,
                "metadata": box.metadata,
            }
            for sid, box in page
        ]
        return JSONResponse(body, headers=headers)

    async def snapshot(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        box = self.boxes.get(request.path_params["id"])
        if box is None:
            return _error(404, "sandbox not found")
        image = await self.cloud.commit(box.machine, "boxwright-fake-e2b-snapshot")
        snapshot_id = f"snap-{uuid.uuid4().hex[:12]}"
        self.snapshots[snapshot_id] = image
        return JSONResponse({"snapshotID": snapshot_id, "names": [snapshot_id]}, status_code=201)

    async def fork(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        parent = self.boxes.get(request.path_params["id"])
        if parent is None:
            return _error(404, "sandbox not found")
        image = await self.cloud.commit(parent.machine, "boxwright-fake-e2b-fork")
        snapshot_id = f"fork-{uuid.uuid4().hex[:12]}"
        self.snapshots[snapshot_id] = image
        body = await request.json()
        sandbox_id, box = await self._new_box(
            snapshot_id,
            dict(parent.machine.env),
            dict(parent.metadata),
            parent.machine.network,
            parent.traffic_token is None,
            int(body.get("timeout") or parent.timeout),
        )
        return JSONResponse([{"sandbox": self._sandbox_json(sandbox_id, box)}], status_code=201)

    async def delete_template(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        image = self.snapshots.pop(request.path_params["id"], None)
        if image is None:
            return _error(404, "template not found")
        await self.cloud.remove_image(image)
        return Response(status_code=204)

    # -- envd HTTP -------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        box = self._envd_box(dict(request.headers))
        return box if isinstance(box, Response) else Response(status_code=204)

    def _user(self, request: Request) -> str:
        return request.query_params.get("username") or "user"

    def _path(self, box: Box, user: str, path: str) -> str:
        home = box.machine.home if user != "root" else "/root"
        return path if path.startswith("/") else f"{home}/{path}"

    async def files_get(self, request: Request) -> Response:
        box = self._envd_box(dict(request.headers))
        if isinstance(box, Response):
            return box
        user = self._user(request)
        path = self._path(box, user, request.query_params.get("path", ""))
        script = 'test -e "$1" || exit 2; test -d "$1" && exit 3; cat -- "$1"'
        code, out, err = await box.machine.run(["sh", "-c", script, "envd", path], user=user, record=False)
        if code == 2:
            return _error(404, f"path '{path}' does not exist")
        if code == 3:
            return _error(400, f"path '{path}' is a directory")
        if code != 0:
            return _error(500, err.decode(errors="replace"))
        return Response(out, media_type="application/octet-stream")

    async def files_post(self, request: Request) -> Response:
        box = self._envd_box(dict(request.headers))
        if isinstance(box, Response):
            return box
        user = self._user(request)
        uploads: list[tuple[str, bytes]] = []
        if request.headers.get("content-type", "").startswith("multipart/"):
            form = await request.form()
            for _, item in form.multi_items():
                if hasattr(item, "read"):
                    uploads.append((request.query_params.get("path") or str(item.filename), await item.read()))
        else:
            uploads.append((request.query_params.get("path", ""), await request.body()))
        written = []
        for raw_path, data in uploads:
            path = self._path(box, user, raw_path)
            script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
            code, _, err = await box.machine.run(
                ["sh", "-c", script, "envd", path], user=user, stdin=data, record=False
            )
            if code != 0:
                return _error(500 if b"ermission" not in err else 403, err.decode(errors="replace"))
            written.append({"name": path.rsplit("/", 1)[-1], "type": "file", "path": path})
        return JSONResponse(written)

    # -- port traffic ------------------------------------------------------------------------------

    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any, host: str, headers: dict[str, str]) -> None:
        label = host.removesuffix("." + DOMAIN)
        port_text, _, sandbox_id = label.partition("-")
        box = self.boxes.get(sandbox_id)
        if box is None or not port_text.isdigit():
            await _error(502, "The sandbox was not found")(scope, receive, send)
            return
        if box.traffic_token is not None and headers.get("e2b-traffic-access-token") != box.traffic_token:
            await _error(403, "missing or invalid traffic access token")(scope, receive, send)
            return
        # Streamed both ways with the request's method, query, headers and body, as E2B's edge proxies.
        await forward(scope, receive, send, f"http://{await machine_address(box.machine)}:{port_text}{scope['path']}")


def _user_of(ctx: Any) -> str:
    auth = ctx.request_headers.get("authorization") or ""
    if auth.lower().startswith("basic "):
        return base64.b64decode(auth[6:]).decode().partition(":")[0] or "user"
    return "user"


class _Process:
    """envd's ``process.Process`` service over the fake machines."""

    def __init__(self, fake: FakeE2B) -> None:
        self.fake = fake

    def _box(self, ctx: Any) -> Box:
        box = self.fake.boxes.get(ctx.request_headers.get("e2b-sandbox-id") or "")
        if box is None or not box.machine.running:
            raise ConnectError(Code.UNAVAILABLE, "The sandbox was not found")
        return box

    def _process(self, ctx: Any, selector: Any) -> Any:
        box = self._box(ctx)
        pid = selector.selector.value if selector is not None and selector.selector is not None else 0
        process = box.machine.processes.get(int(pid))
        if process is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        return process

    async def start(self, request: Any, ctx: Any) -> AsyncIterator[Any]:
        box = self._box(ctx)
        config = request.process
        cwd = config.cwd if config.has_field("cwd") else None
        try:
            process = await box.machine.start(
                [config.cmd, *config.args],
                user=_user_of(ctx),
                env=dict(config.envs),
                cwd=cwd,
                stdin=bool(request.stdin),
            )
        except OSError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"error starting process: {exc}") from exc
        event = process_pb.ProcessEvent
        if self.fake.start_delay:
            await asyncio.sleep(self.fake.start_delay)  # a slow answer: the command already runs
        yield process_pb.StartResponse(event=event(event=Oneof("start", event.StartEvent(pid=process.pid))))
        interval = float(ctx.request_headers.get("keepalive-ping-interval") or 50)
        while True:
            try:
                item = await asyncio.wait_for(process.output.get(), interval)
            except TimeoutError:
                yield process_pb.StartResponse(event=event(event=Oneof("keepalive", event.KeepAlive())))
                continue
            if item is None:
                break
            data = event.DataEvent(output=Oneof(item[0], item[1]))
            yield process_pb.StartResponse(event=event(event=Oneof("data", data)))
        code = await process.exit_code
        if self.fake.boxes.get(box.machine.id) is not box:  # killed under the stream
            raise ConnectError(Code.UNAVAILABLE, "the connection to the sandbox ended before the stream completed")
        if process.signal_death:
            end = event.EndEvent(exit_code=-1, exited=False, status=f"signal: {_signal_name(code)}")
        else:
            end = event.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
        yield process_pb.StartResponse(event=event(event=Oneof("end", end)))

    async def connect(self, request: Any, ctx: Any) -> AsyncIterator[Any]:
        # Reattach is not used by boxwright (the journal owns run identity); envd's answer for an unknown pid.
        self._process(ctx, request.process)
        raise ConnectError(Code.UNIMPLEMENTED, "the fake envd does not reattach")
        yield  # an async generator, as the streaming endpoint expects

    async def update(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "no PTY in the fake envd")

    async def stream_input(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the SDK sends stdin with SendInput")

    async def list(self, request: Any, ctx: Any) -> Any:
        box = self._box(ctx)
        return process_pb.ListResponse(
            processes=[process_pb.ProcessInfo(pid=pid) for pid in sorted(box.machine.processes)]
        )

    async def send_input(self, request: Any, ctx: Any) -> Any:
        process = self._process(ctx, request.process)
        try:
            await process.write(bytes(request.input.input.value))
        except OSError as exc:
            raise ConnectError(Code.FAILED_PRECONDITION, f"stdin of pid {process.pid} is closed: {exc}") from exc
        return process_pb.SendInputResponse()

    async def close_stdin(self, request: Any, ctx: Any) -> Any:
        self._process(ctx, request.process).close_stdin()
        return process_pb.CloseStdinResponse()

    async def send_signal(self, request: Any, ctx: Any) -> Any:
        process = self._process(ctx, request.process)
        await process.signal(int(request.signal) or signals.SIGKILL)
        return process_pb.SendSignalResponse()
