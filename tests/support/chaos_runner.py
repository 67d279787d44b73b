"""The real runner app in this process, behind a local-process sandbox: co-located takeovers without Docker.

``RunnerBoxes`` is a sandbox provider whose boxes are local-process sandboxes; a box's runner port
leads to ``create_runner_app`` under uvicorn on 127.0.0.1, with the bearer token the host derives
for that box (``runner_token(secret, box id)``) and a command harness in place of claude
(``resolve_adapter``). With ``runner_up`` the runner serves from the box's creation (a predecessor
started it); without, the port refuses connections until the host launches the runner: that launch
(``python -m boxwright.runner``) starts the app on the port, and a stand-in process reads the
token line the host writes, so the launch path is the product's own. ``workspace``: the directory a
run's ``/run`` names as its workspace is replaced by this one, as the container's ``/workspace`` is
the box's own directory (a host that posts the default ``/workspace`` never touches this host's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from boxwright.colocated import runner_token
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.runner.server import create_runner_app
from boxwright.sandbox import CreateInput, ProcessOptions, SandboxChannel, SandboxHandle, SpawnHandle
from boxwright.tool_bridge import serve_asgi
from boxwright.tool_bridge.asgi import AsgiServer
from tests.support.replicas import free_port


class _Ports:
    def __init__(self, url: str) -> None:
        self.url = url

    async def connect(self, port: int) -> SandboxChannel:
        return SandboxChannel(url=self.url)


class RunnerBox:
    """A local-process sandbox handle whose runner port is an in-process runner app (started now or at launch)."""

    def __init__(self, inner: SandboxHandle, boxes: RunnerBoxes) -> None:
        self._inner = inner
        self._boxes = boxes
        self.port = free_port()
        self.ports = _Ports(f"http://127.0.0.1:{self.port}")
        self.process = _Process(inner.process, self)
        self.server: AsgiServer | None = None
        self.launches: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def url(self) -> str:
        return self.ports.url

    @property
    def token(self) -> str:
        return runner_token(self._boxes.secret, self._inner.id)

    async def serve(self) -> None:
        if self.server is None:
            app = self._boxes.app
            if app is None:
                app = create_runner_app(self.token, str(self._boxes.state), resolve_adapter=self._boxes.adapter)
            workspace = self._boxes.workspace
            self.server = await serve_asgi(app if workspace is None else _in_workspace(app, workspace), port=self.port)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
            self.server = None


def _in_workspace(app: Any, workspace: Path) -> Any:
    """``app`` whose ``POST /run`` bodies name ``workspace`` as the run's workspace directory."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/run":
            return await app(scope, receive, send)
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            body["workspace"]["path"] = str(workspace)
            raw = json.dumps(body).encode()
        except (ValueError, TypeError, KeyError):
            pass  # not a run request: the runner refuses it as it is
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await app({**scope, "headers": headers}, replay, send)

    return wrapped


class _Process:
    """The box's process API; the runner's launch serves the app and starts a stand-in that reads its token line."""

    def __init__(self, inner: Any, box: RunnerBox) -> None:
        self._inner = inner
        self._box = box

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def spawn(self, command: str, options: ProcessOptions | None = None) -> SpawnHandle:
        if "boxwright.runner" not in command:
            handle: SpawnHandle = await self._inner.spawn(command, options)
            return handle
        self._box.launches.append(command)
        await self._box.serve()  # a second launch meets a runner already on the port, as a real one would
        stand_in: SpawnHandle = await self._inner.spawn("head -n 1 >/dev/null; sleep 30", options)
        return stand_in


class RunnerBoxes:
    """A provider of ``RunnerBox`` es; ``adapter`` is the runner's ``resolve_adapter`` (a command harness).

    ``app``: an ASGI app every box serves in place of the real runner (a scripted one, for what a real
    runner never sends).
    """

    def __init__(
        self,
        base: Path,
        secret: str,
        command: str,
        *,
        runner_up: bool,
        workspace: Path | None = None,
        app: Any = None,
    ) -> None:
        self._inner = local_process_sandbox(base_dir=base)
        self.secret = secret
        self.command = command
        self.runner_up = runner_up
        self.workspace = workspace
        self.app = app
        self.state = base / "runner-state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.boxes: list[RunnerBox] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def adapter(self, harness: str, model: str, env: Mapping[str, str]) -> CommandHarness:
        return CommandHarness(command=self.command)

    async def create(self, input: CreateInput | None = None) -> SandboxHandle:
        box = RunnerBox(await self._inner.create(input), self)
        self.boxes.append(box)
        if self.runner_up:
            await box.serve()
        return box  # type: ignore[return-value]

    async def close(self) -> None:
        for box in self.boxes:
            await box.close()
