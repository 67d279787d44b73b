"""Cloudflare: a Sandbox Durable Object per sandbox, reached through a small Worker of ours (spec §2.7).

A Python process has no Durable Object binding, so ``deploy/cloudflare/`` holds a Worker (TypeScript,
``@cloudflare/sandbox``) that fronts the ``Sandbox`` binding over authenticated HTTP; this provider
speaks that Worker's protocol with httpx (``Authorization: Bearer <token>``), all under
``/v1/sandboxes/{id}``:

- ``POST /exec`` ``{command, env, cwd}`` -> ``{stdout, stderr, exitCode}``;
- ``POST /exec/stream`` (same body) -> NDJSON ``{"type": "stdout"|"stderr", "data"}``... then
  ``{"type": "complete", "exitCode"}`` or ``{"type": "error", "error"}``;
- ``POST /env`` ``{envVars}``; ``POST /mkdir`` ``{path}``; ``POST /ports`` ``{port, hostname}`` ->
  ``{url}``; ``DELETE`` (destroy; an unknown id is fine).

Point by point (CF1-CF4): config ``worker_url``/``BOXWRIGHT_CLOUDFLARE_URL`` and
``token``/``BOXWRIGHT_CLOUDFLARE_TOKEN`` (the Worker's ``BOXWRIGHT_TOKEN`` secret), ``preview_hostname``
(ports need it), ``workdir`` (``/workspace``, the container's own). Capabilities: fs, exec, env,
ports, background true; stdin, killable, snapshots, network_policy, durable_filesystem, fork false.
create: id = ``input.id`` or a uuid, env set, workdir made, a marker written; secrets and per-command env
travel in request bodies, never in a command string. resume: a Durable Object is addressable by any
name, so there is always a container (CF3), but its disk may have been wiped or the sandbox destroyed;
resume returns a handle only while the marker is there, else ``None`` so the framework sets the sandbox
up again (a handle to a wiped disk would skip setup). spawn is the streaming exec; ``kill()`` is a no-op
that says so once (Workers RPC carries no signal; journals poll); stdin raises; ``wait()`` raises when
the stream reports an error. Network deny is refused. Durable Objects carry no labels, so
``boxwright reap`` cannot list them: ids start with ``bw-`` to be found by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from ..errors import (
    AbortError,
    ProviderUnavailableError,
    SandboxCommandError,
    SandboxNotFoundError,
    UnsupportedCapabilityError,
)
from ..git_exec import ExecGit
from ..sandbox import (
    Capabilities,
    CreateInput,
    DestroyInput,
    ExecResult,
    ProcessOptions,
    ResumeInput,
    SandboxChannel,
    SnapshotRef,
)
from ._posix import HandleEnv, Logger, StdlibLogger
from ._remote import (
    NoStdin,
    RemoteProcess,
    ShellFs,
    TextChannel,
    check_port,
    map_path,
    script,
)

NAME = "cloudflare"
MARKER = "/var/tmp/.boxwright-sandbox"
URL_ENV = "BOXWRIGHT_CLOUDFLARE_URL"
TOKEN_ENV = "BOXWRIGHT_CLOUDFLARE_TOKEN"
DEFAULT_WORKDIR = "/workspace"
HELP = (
    f"deploy the Worker in deploy/cloudflare/ (`npx wrangler deploy`), then set {URL_ENV} to its URL and "
    f"{TOKEN_ENV} to its BOXWRIGHT_TOKEN secret"
)


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=False,
        killable_processes=False,  # no signal crosses Workers RPC: kill() cannot reach the process (seed)
        snapshots=False,
        network_policy=False,
        durable_filesystem=False,  # a Durable Object's container disk may be wiped between uses
        fork=False,
    )


class CloudflareProcess(RemoteProcess):
    """``SpawnHandle`` over one streaming exec of the Worker."""

    def __init__(self, handle: CloudflareHandle, body: dict[str, Any]) -> None:
        self._handle = handle
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = NoStdin(NAME)
        self.watch(self._pump(body))

    @property
    def exit_task(self) -> asyncio.Future[int]:
        return self._exit

    async def _pump(self, body: dict[str, Any]) -> int:
        try:
            async with self._handle.client.stream("POST", self._handle.path("exec/stream"), json=body) as answer:
                if answer.status_code != 200:
                    raise self._handle.error("exec", answer.status_code, (await answer.aread()).decode())
                async for line in answer.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = event.get("type")
                    if kind == "stdout":
                        self.stdout.feed(str(event.get("data", "")))
                    elif kind == "stderr":
                        self.stderr.feed(str(event.get("data", "")))
                    elif kind == "complete":
                        return int(event.get("exitCode", -1))
                    elif kind == "error":
                        raise SandboxCommandError("exec", -1, str(event.get("error", "the stream failed")))
            raise SandboxCommandError("exec", -1, "the Worker's stream ended without an exit code")
        finally:
            self.stdout.close()
            self.stderr.close()

    async def _do_kill(self, sig: int | None) -> None:
        # Workers RPC serialises no AbortSignal: nothing can reach the process (killable_processes=False).
        if not self.exited:
            self._handle.warn_once("kill() cannot reach a Cloudflare sandbox process; it keeps running")


class CloudflareProcesses:
    def __init__(self, handle: CloudflareHandle) -> None:
        self._handle = handle

    def _body(self, command: str, opts: ProcessOptions) -> dict[str, Any]:
        env = {**self._handle.env.get(), **(opts.env or {})}
        return {"command": command, "env": env, "cwd": map_path(opts.cwd or "", self._handle.workspace_root)}

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> CloudflareProcess:
        opts = opts or ProcessOptions()
        if opts.signal is not None:
            opts.signal.throw_if_aborted()
        return CloudflareProcess(self._handle, self._body(command, opts))

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        opts = opts or ProcessOptions()
        signal = opts.signal
        if signal is None:
            return await self._handle.run(self._body(command, opts))
        signal.throw_if_aborted()
        # With a signal: stream, so that an abort can stop waiting with the output so far. The command
        # itself keeps running (no signal crosses Workers RPC); the result says TERM, as an aborted exec must.
        process = CloudflareProcess(self._handle, self._body(command, opts))
        out: list[str] = []
        err: list[str] = []
        drains = [
            asyncio.ensure_future(_drain(process.stdout, out)),
            asyncio.ensure_future(_drain(process.stderr, err)),
        ]
        aborted = asyncio.ensure_future(signal.wait())
        try:
            first: set[asyncio.Future[Any]] = {process.exit_task, aborted}
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if process.exit_task.done():
                code = await process.exit_task
            else:
                process.exit_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await process.exit_task
                self._handle.warn_once("an aborted exec returned, but its command keeps running on Cloudflare")
                code = 128 + 15
            await asyncio.gather(*drains)
        finally:
            aborted.cancel()
            for drain in drains:
                drain.cancel()
        return ExecResult(stdout="".join(out), stderr="".join(err), exit_code=code)


async def _drain(stream: TextChannel, into: list[str]) -> None:
    async for chunk in stream:
        into.append(chunk)


class CloudflarePorts:
    def __init__(self, handle: CloudflareHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        hostname = self._handle.preview_hostname
        if not hostname:
            raise UnsupportedCapabilityError(NAME, "ports", "set cloudflare_sandbox(preview_hostname=...)")
        answer = await self._handle.call("ports", {"port": port, "hostname": hostname})
        return SandboxChannel(url=str(answer["url"]))


class CloudflareHandle:
    provider = NAME

    def __init__(self, provider: CloudflareProvider, sandbox_id: str, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.client = provider.client()
        self.id = sandbox_id
        self.workspace_root = provider.workdir
        self.preview_hostname = provider.preview_hostname
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = CloudflareProcesses(self)
        self.fs = ShellFs(self.plain, self.workspace_root)
        self.git = ExecGit(self.process)
        self.ports = CloudflarePorts(self)
        self._warned = False

    def path(self, op: str) -> str:
        return f"/v1/sandboxes/{self.id}/{op}"

    def warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self._provider.logger.warn(message, {"sandbox": self.id})

    def error(self, op: str, status: int, text: str) -> Exception:
        if status == 401:
            return ProviderUnavailableError(NAME, "the Worker refused the token", HELP)
        if status == 404:
            return SandboxNotFoundError(NAME, self.id, "is gone")
        return SandboxCommandError(op, -1, f"the Worker answered {status}: {text[:300]}")

    async def call(self, op: str, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = await self.client.post(self.path(op), json=dict(body))
        if answer.status_code != 200:
            raise self.error(op, answer.status_code, answer.text)
        data = answer.json()
        return data if isinstance(data, dict) else {}

    async def run(self, body: Mapping[str, Any]) -> ExecResult:
        data = await self.call("exec", body)
        return ExecResult(
            stdout=str(data.get("stdout", "")), stderr=str(data.get("stderr", "")), exit_code=int(data["exitCode"])
        )

    async def plain(self, line: str) -> ExecResult:
        return await self.run({"command": line, "env": {}, "cwd": "/"})

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshots", "Cloudflare sandboxes have no snapshots")

    async def fork(self) -> CloudflareHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "Cloudflare sandboxes have no fork")

    async def destroy(self) -> None:
        await self._provider.destroy(DestroyInput(id=self.id))


class CloudflareProvider:
    name = NAME

    def __init__(
        self,
        *,
        worker_url: str | None = None,
        token: str | None = None,
        preview_hostname: str | None = None,
        workdir: str = DEFAULT_WORKDIR,
        request_timeout: float = 300.0,
        logger: Logger | None = None,
    ) -> None:
        self.worker_url = worker_url
        self.token = token
        self.preview_hostname = preview_hostname
        self.workdir = workdir.rstrip("/") or "/"
        self.request_timeout = request_timeout
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.cloudflare")
        self.restore_snapshot = None
        self._clients: dict[int, httpx.AsyncClient] = {}

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        return {"worker_url": self.worker_url or os.environ.get(URL_ENV), "workdir": self.workdir}

    def client(self) -> httpx.AsyncClient:
        """One client per event loop (a connection pool belongs to the loop that made it)."""
        loop = id(asyncio.get_running_loop())
        made = self._clients.get(loop)
        if made is None:
            url = self.worker_url or os.environ.get(URL_ENV)
            token = self.token or os.environ.get(TOKEN_ENV)
            if not url or not token:
                raise ProviderUnavailableError(NAME, f"no Worker ({URL_ENV} and {TOKEN_ENV} are needed)", HELP)
            timeout = httpx.Timeout(self.request_timeout, connect=10.0)
            made = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
            self._clients = {loop: made}
        return made

    async def create(self, input: CreateInput | None = None) -> CloudflareHandle:
        input = input or CreateInput()
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        if input.network is not None and (input.network.mode == "deny" or input.network.allow_hosts):
            raise UnsupportedCapabilityError(NAME, "network_policy", "Cloudflare sandboxes cannot deny egress")
        key = input.id or f"bw-{uuid.uuid4().hex[:20]}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", key):
            raise ValueError(f"a Cloudflare sandbox id is letters, digits, '.', '_' and '-', got {key!r}")
        handle = CloudflareHandle(self, key, None)
        try:
            if input.env:
                # Secrets go in as the sandbox's env (request body), never in a command string.
                await handle.call("env", {"envVars": dict(input.env)})
            await handle.call("mkdir", {"path": self.workdir})
            marked = await handle.plain(script("create", ': > "$1"', MARKER))
            if marked.exit_code != 0:
                raise SandboxCommandError("create", marked.exit_code, marked.stderr.strip())
            if signal is not None and signal.aborted:
                raise AbortError(signal.reason)
            return handle
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.destroy(DestroyInput(id=key)))
            raise

    async def resume(self, input: ResumeInput) -> CloudflareHandle | None:
        handle = CloudflareHandle(self, input.id, None)
        if (await handle.plain(script("resume", 'test -e "$1"', MARKER))).exit_code != 0:
            # A fresh container answered (destroyed or wiped): stop it again, the framework creates anew.
            with contextlib.suppress(Exception):
                await self.destroy(DestroyInput(id=input.id))
            return None
        return handle

    async def destroy(self, input: DestroyInput) -> None:
        answer = await self.client().delete(f"/v1/sandboxes/{input.id}")
        if answer.status_code not in (200, 204, 404):
            raise SandboxCommandError("destroy", -1, f"the Worker answered {answer.status_code}: {answer.text[:300]}")


def cloudflare_sandbox(
    *,
    worker_url: str | None = None,
    token: str | None = None,
    preview_hostname: str | None = None,
    workdir: str = DEFAULT_WORKDIR,
    request_timeout: float = 300.0,
    logger: Logger | None = None,
) -> CloudflareProvider:
    """A provider whose sandboxes are Cloudflare Sandbox Durable Objects behind the Worker in deploy/cloudflare/."""
    return CloudflareProvider(
        worker_url=worker_url,
        token=token,
        preview_hostname=preview_hostname,
        workdir=workdir,
        request_timeout=request_timeout,
        logger=logger,
    )
