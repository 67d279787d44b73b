"""A fake of boxwright's Cloudflare Worker (deploy/cloudflare/src/index.ts): the same HTTP protocol
over the Docker backend instead of the ``Sandbox`` Durable Object.

Follows ``deploy/cloudflare/src/index.ts`` (on ``@cloudflare/sandbox`` 0.4): ``Authorization:
Bearer <token>``; under ``/v1/sandboxes/{id}``: ``POST /exec`` -> ``{stdout, stderr, exitCode,
success}``; ``POST /exec/stream`` -> NDJSON ``stdout``/``stderr`` events then ``complete``
(``exitCode``) or ``error``; ``POST /env`` (``envVars``: the sandbox env of every later command);
``POST /mkdir``; ``POST /ports`` (``{port, hostname}`` -> ``{url}``, ``https://<port>-<id>.<hostname>``);
``DELETE`` (destroy; unknown is fine). A sandbox comes into being on first use, as a Durable
Object does (``getSandbox(env.Sandbox, id)``). Commands run as the container's ``root`` through
``bash -c`` in ``/workspace``. A dropped stream does not stop its command (no signal crosses RPC).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .backend import FakeCloud, FakeService, Machine, ServerThread


@dataclass
class Box:
    machine: Machine
    env: dict[str, str] = field(default_factory=dict)


class FakeCloudflareWorker(FakeService):
    def __init__(self, image: str, *, token: str = "cf_fake_token") -> None:
        self.cloud = FakeCloud(image, "root", "/root", uid=0)
        self.token = token
        self.boxes: dict[str, Box] = {}
        self.bodies: list[str] = []
        self.mkdir_delay = 0.0  # a slow container start: the Durable Object exists, create is still running
        self._gone: list[Machine] = []
        prefix = "/v1/sandboxes/{id}"
        self.server = ServerThread(
            Starlette(
                routes=[
                    Route(prefix + "/exec", self.exec, methods=["POST"]),
                    Route(prefix + "/exec/stream", self.exec_stream, methods=["POST"]),
                    Route(prefix + "/env", self.set_env, methods=["POST"]),
                    Route(prefix + "/mkdir", self.mkdir, methods=["POST"]),
                    Route(prefix + "/ports", self.ports, methods=["POST"]),
                    Route(prefix, self.destroy, methods=["DELETE"]),
                ]
            )
        )

    @property
    def url(self) -> str:
        return self.server.url

    def machines(self) -> list[Machine]:
        return [b.machine for b in list(self.boxes.values())]

    async def _box(self, request: Request) -> Box | Response:
        self.bodies.append((await request.body()).decode(errors="replace"))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        sandbox_id = request.path_params["id"]
        box = self.boxes.get(sandbox_id)
        if box is None and request.method != "DELETE":
            box = Box(await self.cloud.create(sandbox_id=sandbox_id))
            await box.machine.run(["mkdir", "-p", "/workspace"], user="root", record=False)
            self.boxes[sandbox_id] = box
        return box if box is not None else Response(status_code=204)

    async def _start(self, box: Box, body: dict[str, Any]) -> Any:
        env = {**box.env, **{str(k): str(v) for k, v in (body.get("env") or {}).items()}}
        return await box.machine.start(
            ["bash", "-c", str(body["command"])], env=env, cwd=body.get("cwd") or "/workspace"
        )

    async def exec(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        try:
            process = await self._start(box, await request.json())
        except OSError as exc:
            return JSONResponse({"error": str(exc)}, status_code=500)
        out, err = bytearray(), bytearray()
        while (item := await process.output.get()) is not None:
            (err if item[0] == "stderr" else out).extend(item[1])
        code = await process.exit_code
        return JSONResponse(
            {
                "stdout": out.decode(errors="replace"),
                "stderr": err.decode(errors="replace"),
                "exitCode": code,
                "success": code == 0,
            }
        )

    async def exec_stream(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        body = await request.json()

        async def events() -> AsyncIterator[str]:
            try:
                process = await self._start(box, body)
            except OSError as exc:
                yield json.dumps({"type": "error", "error": str(exc)}) + "\n"
                return
            # The SDK's stream carries text: the Worker decodes each chunk (a split character is U+FFFD there too).
            decoders: dict[str, Any] = {}
            import codecs

            while (item := await process.output.get()) is not None:
                decoder = decoders.setdefault(item[0], codecs.getincrementaldecoder("utf-8")(errors="replace"))
                text = decoder.decode(item[1])
                if text:
                    yield json.dumps({"type": item[0], "data": text}) + "\n"
            for kind, decoder in decoders.items():
                if tail := decoder.decode(b"", final=True):
                    yield json.dumps({"type": kind, "data": tail}) + "\n"
            yield json.dumps({"type": "complete", "exitCode": await process.exit_code}) + "\n"

        return StreamingResponse(events(), media_type="application/x-ndjson")

    async def set_env(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        box.env.update({str(k): str(v) for k, v in (await request.json())["envVars"].items()})
        return JSONResponse({})

    async def mkdir(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        if self.mkdir_delay:
            await asyncio.sleep(self.mkdir_delay)
        try:
            code, _, err = await box.machine.run(["mkdir", "-p", str((await request.json())["path"])], user="root")
        except OSError as exc:  # destroyed meanwhile (a cancelled create's clean-up came first)
            return JSONResponse({"error": str(exc)}, status_code=500)
        if code != 0:
            return JSONResponse({"error": err.decode(errors="replace")}, status_code=500)
        return JSONResponse({})

    async def ports(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        body = await request.json()
        return JSONResponse({"url": f"https://{int(body['port'])}-{request.path_params['id']}.{body['hostname']}"})

    async def destroy(self, request: Request) -> Response:
        box = await self._box(request)
        if isinstance(box, Response):
            return box
        self.boxes.pop(request.path_params["id"], None)
        self._gone.append(box.machine)
        await self.cloud.remove(box.machine.id)
        return JSONResponse({})
