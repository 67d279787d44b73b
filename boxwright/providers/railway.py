"""Railway: one Railway sandbox (a VM in a Railway environment) per sandbox, on Railway's API with httpx.

Railway ships no Python sandbox SDK, so this module is the client: the public GraphQL API
(``sandboxCreate``, ``sandbox``, ``sandboxes``, ``sandboxDestroy``, ``sandboxHeartbeat``,
``sandboxCheckpointCreate``, ``generateShellToken``) over httpx, and the exec bridge
(``/ws/exec``: an ``init_exec`` text frame, stdin/stdout/stderr as binary frames tagged by
their first byte, ``stdin_close`` and ``signal`` frames up, ``durable_session`` and ``exit``
frames down; the shell-scoped token rides as the last ``Sec-WebSocket-Protocol`` value
after ``railway-shell``) over ``websockets``. Operations and frames follow Railway's CLI
(``src/gql/*.graphql``, ``src/controllers/sandbox_exec.rs``) and the TanStack provider.

Seed, point by point:

- Config: ``token`` (bearer by default; ``auth_type="project-token"`` for a project token),
  else ``RAILWAY_TOKEN`` (a project token) or ``RAILWAY_API_TOKEN`` (account/workspace,
  bearer); ``environment_id`` or ``RAILWAY_ENVIRONMENT_ID`` is the scope, fixed per provider.
  ``region`` (fresh sandboxes only: restores and forks run where their source is),
  ``idle_timeout_minutes`` (Railway destroys an idle sandbox; ``0`` turns that off where the
  plan allows; resume resets the countdown), ``resources`` (``cpu``, ``memory_gb``),
  ``network_isolation`` (``ISOLATED`` default, ``PRIVATE`` joins the environment's private
  network), ``ports`` (at most 10, ``PRIVATE`` only), ``checkpoint`` (boot from a named one),
  ``workdir`` (``/workspace``, a real directory made at boot).
- Secrets: the sandbox ``variables`` at create and restore; per-command env travels in the
  ``init_exec`` frame. No value is ever part of a command string.
- No durable disk (no stop/start that keeps it): ``durable_filesystem`` is false.
- Network: both modes keep public egress, so a deny is refused at create (never dropped).
- Processes: ``spawn`` runs in a durable exec session (it survives a host disconnect; no
  reattach, the journal owns run identity) with ``pid`` -1 (the bridge has no remote pid);
  ``exec`` runs without one. ``kill()`` and an aborted ``exec`` send TERM to the process
  group, then KILL after 2 s; an aborted ``spawn`` sends KILL at once; each returns only on
  the confirmed remote exit. Hence ``killable_processes`` is true (measured by the seed).
- Snapshot = a native checkpoint named ``boxwright-<sandbox-id>-<uuid>`` (the label stays on
  the ref: checkpoint names belong to the environment and a capture replaces one of the same
  name). Checkpoints outlive their source; restore boots a new sandbox from one and applies
  env, network mode, domains and idle timeout again. Fork is native (a live disk fork; the
  fork gets the parent's create env and a copy of its env overlay). Resume: missing,
  ``DESTROYED``, ``DESTROYING`` or ``FAILED`` is ``None``; ``CREATING`` is waited for; auth
  and transport errors raise.
- Ports: declared ports are published as Railway domains at create; ``connect`` returns
  ``https://<domain>`` (public, no token) and rejects other ports.
- Railway has no labels or names on sandboxes: the environment is the ownership scope, so
  ``list_owned`` lists the live sandboxes of this provider's environment (give boxwright an
  environment of its own when reaping matters).
- A failed, timed-out or aborted create destroys the sandbox Railway made (best effort).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from ..abort import AbortSignal
from ..errors import (
    AbortError,
    BoxwrightError,
    ProcessExitedError,
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
    NetworkPolicy,
    ProcessOptions,
    RestoreInput,
    ResumeInput,
    SandboxChannel,
    SnapshotRef,
)
from ..shell import quote
from ._posix import HandleEnv, Logger, StdlibLogger
from ._remote import (
    OwnedSandbox,
    ProcessSet,
    RemoteHandle,
    RemoteProcess,
    ShellFs,
    TextChannel,
    channel,
    check_port,
    collect,
    exec_result,
    map_path,
    script,
)

NAME = "railway"
PROJECT_TOKEN_ENV = "RAILWAY_TOKEN"
API_TOKEN_ENV = "RAILWAY_API_TOKEN"
ENVIRONMENT_ENV = "RAILWAY_ENVIRONMENT_ID"
EXEC_URL_ENV = "RAILWAY_TCP_PROXY_WS_ENDPOINT"
DEFAULT_ENDPOINT = "https://backboard.railway.com/graphql/v2"
DEFAULT_EXEC_URL = "wss://ssh.railway.com:2226/ws/exec"
DEFAULT_WORKDIR = "/workspace"
SUBPROTOCOL = "railway-shell"
CHECKPOINT_PREFIX = "boxwright-"
MAX_PORTS = 10
STDOUT, STDIN, STDERR = 0x01, 0x02, 0x03
TERMINAL = frozenset({"DESTROYED", "DESTROYING", "FAILED"})
KEY_HELP = (
    f"set {API_TOKEN_ENV} (account or workspace token) or {PROJECT_TOKEN_ENV} (project token) and "
    f"{ENVIRONMENT_ENV}, or pass railway_sandbox(token=..., environment_id=...)"
)
# TERM, then KILL after this long (seed); then how long a kill waits for the confirmed exit.
_TERM_GRACE = 2.0
_READY_TIMEOUT = 120.0
_RESUME_TIMEOUT = 60.0
# Status polls back off from 0.1 s to 0.5 s: a sandbox is often RUNNING within a moment of its create answer.
_POLLS = (0.1, 0.2, 0.3, 0.5)
# A shell token is short-lived on Railway's side; a fresh one is minted before this age.
_TOKEN_AGE = 240.0

_SANDBOX_FIELDS = "id status region environmentId idleTimeoutMinutes networkIsolation domains { prefix port domain }"
_CREATE = (
    f"mutation SandboxCreate($input: SandboxCreateInput!) {{ sandboxCreate(input: $input) {{ {_SANDBOX_FIELDS} }} }}"
)
_GET = (
    "query Sandbox($environmentId: String!, $id: String!) { sandbox(environmentId: $environmentId, id: $id) { "
    f"{_SANDBOX_FIELDS} }} }}"
)
_LIST = (
    "query Sandboxes($environmentId: String!, $first: Int, $after: String) { sandboxes(environmentId: "
    "$environmentId, first: $first, after: $after) { edges { node { id status } } "
    "pageInfo { hasNextPage endCursor } } }"
)
_DESTROY = (
    "mutation SandboxDestroy($id: String!, $environmentId: String!) { sandboxDestroy(id: $id, environmentId: "
    "$environmentId) { id status } }"
)
_HEARTBEAT = (
    "mutation SandboxHeartbeat($id: String!, $environmentId: String!) { sandboxHeartbeat(id: $id, environmentId: "
    "$environmentId) { id status idleTimeoutMinutes } }"
)
_CHECKPOINT = (
    "mutation SandboxCheckpointCreate($environmentId: String!, $sandboxId: String!, $name: String!) { "
    "sandboxCheckpointCreate(environmentId: $environmentId, sandboxId: $sandboxId, name: $name) { id key "
    "createdAt environmentId } }"
)
_SHELL_TOKEN = "mutation GenerateShellToken($input: ShellTokenInput!) { generateShellToken(input: $input) }"


class RailwayError(BoxwrightError):
    """Railway refused a request (auth, quota, validation): raised, never read as "gone"."""

    def __init__(self, operation: str, detail: str, status: int | None = None) -> None:
        self.operation = operation
        self.status = status
        super().__init__(f"railway {operation} failed{f' (HTTP {status})' if status else ''}: {detail}")


class RailwayNotFound(RailwayError):
    """Railway says the sandbox does not exist."""


def _capabilities(ports: bool) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=ports,  # only declared ports, published at create
        background_processes=True,
        writable_stdin=True,  # stdin frames + stdin_close; C12
        killable_processes=True,  # TERM/KILL to the group with a confirmed exit; measured by the seed, J7/J8 here
        snapshots=True,
        network_policy=False,  # both modes keep public egress: deny is refused
        durable_filesystem=False,  # no stop/start that keeps the disk
        fork=True,
    )


class RailwayApi:
    """The GraphQL calls boxwright makes, with Railway's two auth header styles."""

    def __init__(
        self, endpoint: str, token: str, auth_type: Literal["bearer", "project-token"], timeout: float
    ) -> None:
        self._headers = (
            {"Authorization": f"Bearer {token}"} if auth_type == "bearer" else {"Project-Access-Token": token}
        )
        self._endpoint = endpoint
        self._timeout = timeout

    async def call(self, operation: str, query: str, variables: Mapping[str, Any]) -> Any:
        # A client per call: a provider outlives event loops (each test, each `asyncio.run`), a pool does not.
        try:
            async with httpx.AsyncClient(headers=self._headers, timeout=self._timeout) as client:
                response = await client.post(
                    self._endpoint, json={"operationName": operation, "query": query, "variables": dict(variables)}
                )
        except httpx.HTTPError as exc:
            raise RailwayError(operation, f"{type(exc).__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = {}
        errors = body.get("errors") if isinstance(body, dict) else None
        if response.status_code >= 400 and not errors:
            raise RailwayError(operation, response.text[:300] or response.reason_phrase, response.status_code)
        if errors:
            message = "; ".join(str(e.get("message", e)) for e in errors)
            if "not found" in message.lower():
                raise RailwayNotFound(operation, message, response.status_code if response.status_code >= 400 else None)
            raise RailwayError(operation, message, response.status_code if response.status_code >= 400 else None)
        return body.get("data") or {}


class _Stdin:
    def __init__(self, process: RailwayProcess) -> None:
        self._process = process
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        if self._ended:
            raise ProcessExitedError(-1, "stdin was already ended (closed)")
        if self._process.exited:
            raise ProcessExitedError(-1, "the process exited; its stdin is closed")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        try:
            await self._process.ws.send(bytes([STDIN]) + raw)
        except ConnectionClosed as exc:
            raise ProcessExitedError(-1, "the process exited; its stdin is closed") from exc

    async def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if not self._process.exited:
            with contextlib.suppress(ConnectionClosed):
                await self._process.ws.send(json.dumps({"type": "stdin_close"}))


class RailwayProcess(RemoteProcess):
    """``SpawnHandle`` over one exec-bridge session; signals go to the command's process group."""

    # pid -1: the exec bridge reports no remote pid

    def __init__(self, handle: RailwayHandle, ws: ClientConnection) -> None:
        self._handle = handle
        self.ws = ws
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = _Stdin(self)
        self.session: str | None = None
        self._decoders = {
            STDOUT: codecs.getincrementaldecoder("utf-8")(errors="replace"),
            STDERR: codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self.watch(self._pump())

    async def _pump(self) -> int:
        code: int | None = None
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    if len(message) > 1 and message[0] in self._decoders:
                        text = self._decoders[message[0]].decode(message[1:])
                        (self.stdout if message[0] == STDOUT else self.stderr).feed(text)
                    continue
                with contextlib.suppress(ValueError):
                    frame = json.loads(message)
                    kind = frame.get("type")
                    data = frame.get("data") or {}
                    if kind == "durable_session":
                        self.session = str(data.get("durable_session_name") or "") or None
                    elif kind == "exit":
                        code = int(data.get("exit_code", -1))
                        break
        except ConnectionClosed:
            pass
        finally:
            self.stdout.feed(self._decoders[STDOUT].decode(b"", final=True))
            self.stderr.feed(self._decoders[STDERR].decode(b"", final=True))
            self.stdout.close()
            self.stderr.close()
            with contextlib.suppress(Exception):
                await self.ws.close()
        if code is None:
            if self._handle.destroyed:
                return 128 + 9  # the sandbox went with destroy(): its processes were killed
            raise SandboxNotFoundError(NAME, self._handle.id, "closed the exec session before the command exited")
        # A negative code is a signal death reported as -signo; the contract wants 128 + signo (K5).
        return 128 - code if code < 0 else code

    async def _signal(self, name: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(json.dumps({"type": "signal", "data": {"signal": name}}))

    async def _do_kill(self, sig: int | None) -> None:
        """TERM, then KILL after ``_TERM_GRACE``; a KILL (9) asked for goes at once."""
        if self.exited:
            return
        if sig != 9:
            await self._signal("TERM")
            await self.confirm_exit(_TERM_GRACE)
        if not self.exited:
            await self._signal("KILL")
        await self.confirm_exit()
        if not self.exited:
            self._handle.warn("no exit was confirmed after KILL; the command may still run", {"session": self.session})


class RailwayProcesses(ProcessSet[RailwayProcess]):
    def __init__(self, handle: RailwayHandle) -> None:
        super().__init__()
        self._handle = handle

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> RailwayProcess:
        return await self._start(command, opts, durable=True)

    async def _start(self, command: str, opts: ProcessOptions | None, *, durable: bool) -> RailwayProcess:
        opts = self.started(opts)
        handle = self._handle
        env = {**handle.env.get(), **(opts.env or {})}
        cwd = map_path(opts.cwd or "", handle.workdir)
        process = await handle.start(command, env, cwd, durable=durable)
        # An aborted spawn is KILLed at once; an aborted exec gets TERM first (seed).
        return self.track(process, opts.signal, 9 if durable else None)

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        return await exec_result(await self._start(command, opts, durable=False), end_stdin=True)

    async def kill_all(self, sig: int | None = 9) -> None:
        await super().kill_all(sig)


class RailwayPorts:
    def __init__(self, handle: RailwayHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        domains = self._handle.domains
        if not self._handle.capabilities.ports:
            raise UnsupportedCapabilityError(
                NAME, "ports", "declare ports (with network_isolation='PRIVATE') at create"
            )
        if port not in domains:
            raise ValueError(
                f"port {port} was not published: Railway publishes domains at create only (declared: {sorted(domains)})"
            )
        # A Railway domain is public: no preview token to carry.
        return channel(f"https://{domains[port]}")


class RailwayHandle(RemoteHandle):
    provider = NAME
    _provider: RailwayProvider

    def __init__(
        self,
        provider: RailwayProvider,
        sandbox: Mapping[str, Any],
        create_env: Mapping[str, str] | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._provider = provider
        self.id = str(sandbox["id"])
        self.status = str(sandbox.get("status") or "")
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.capabilities = provider.capabilities()
        self.domains = {int(d["port"]): str(d["domain"]) for d in (sandbox.get("domains") or []) if d.get("domain")}
        self.create_env = dict(create_env or {})
        self.env = HandleEnv(env)
        self.process = RailwayProcesses(self)
        self.fs = ShellFs(self.plain, self.workdir)
        self.git = ExecGit(self.process)
        self.ports = RailwayPorts(self)
        self.destroyed = False
        self._token: tuple[str, float] | None = None
        self._token_lock = asyncio.Lock()

    async def shell_token(self) -> str:
        async with self._token_lock:
            if self._token is None or time.monotonic() - self._token[1] > _TOKEN_AGE:
                self._token = (await self._provider.shell_token(self.id), time.monotonic())
            return self._token[0]

    async def start(self, command: str, env: Mapping[str, str], cwd: str, *, durable: bool) -> RailwayProcess:
        token = await self.shell_token()
        try:
            ws = await connect(
                self._provider.exec_url,
                subprotocols=[Subprotocol(SUBPROTOCOL), Subprotocol(token)],
                max_size=None,
                open_timeout=self._provider.request_timeout,
            )
        except InvalidStatus as exc:
            if exc.response.status_code in (404, 410):
                raise SandboxNotFoundError(NAME, self.id, "is gone (destroyed or idle-expired)") from exc
            raise RailwayError("exec", f"the exec bridge answered HTTP {exc.response.status_code}") from exc
        except OSError as exc:
            raise RailwayError("exec", f"cannot reach the exec bridge: {exc}") from exc
        # The cwd is not secret; a cd keeps the bridge's own command line free of anything else.
        line = f"cd {quote(cwd)} && {command}" if cwd else command
        init: dict[str, Any] = {"command": line, "env": dict(env), "durable": durable}
        try:
            await ws.send(json.dumps({"type": "init_exec", "data": init}))
        except ConnectionClosed as exc:
            raise SandboxNotFoundError(NAME, self.id, "closed the exec session before it started") from exc
        return RailwayProcess(self, ws)

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op): no handle env."""
        process = await self.start(line, {}, "", durable=False)
        await process.stdin.end()
        out, err, code = await asyncio.gather(collect(process.stdout), collect(process.stderr), process.wait())
        return ExecResult(stdout=out, stderr=err, exit_code=code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        name = f"{CHECKPOINT_PREFIX}{self.id}-{uuid.uuid4().hex[:12]}"
        try:
            made = await self._provider.api_call("SandboxCheckpointCreate", _CHECKPOINT, sandboxId=self.id, name=name)
        except RailwayNotFound as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone (destroyed or idle-expired)") from exc
        return SnapshotRef(id=str(made["sandboxCheckpointCreate"]["key"]), label=label)

    async def fork(self) -> RailwayHandle:
        # The fork does not inherit the source's variables on Railway: the create env goes again.
        return await self._provider.make(
            {"sourceSandboxId": self.id}, self.create_env, None, self.env.get(), fresh=False
        )

    async def destroy(self) -> None:
        # Not RemoteHandle's: ``destroyed`` is set before the kill, so a socket the kill closes reads as the destroy's.
        if not self.destroyed:
            self.destroyed = True
            await self.process.kill_all()
        await self._provider.destroy(DestroyInput(id=self.id))


class RailwayProvider:
    name = NAME

    def __init__(
        self,
        *,
        token: str | None = None,
        auth_type: Literal["bearer", "project-token"] | None = None,
        environment_id: str | None = None,
        region: str | None = None,
        idle_timeout_minutes: int | None = None,
        resources: Mapping[str, float] | None = None,
        network_isolation: Literal["ISOLATED", "PRIVATE"] | None = None,
        ports: Sequence[int] = (),
        checkpoint: str | None = None,
        workdir: str = DEFAULT_WORKDIR,
        endpoint: str | None = None,
        exec_url: str | None = None,
        request_timeout: float = 60.0,
        logger: Logger | None = None,
    ) -> None:
        ports = list(ports)
        if ports:
            if network_isolation != "PRIVATE":
                raise ValueError(
                    "railway: ports need network_isolation='PRIVATE': Railway publishes sandbox domains only for "
                    "sandboxes on the environment's private network (which also reaches your other services)"
                )
            if len(ports) > MAX_PORTS:
                raise ValueError(f"railway: at most {MAX_PORTS} ports can be published, got {len(ports)}")
            for port in ports:
                check_port(port)
            if len(set(ports)) != len(ports):
                raise ValueError(f"railway: ports must be unique, got {ports}")
        self.endpoint = endpoint or DEFAULT_ENDPOINT
        _check_endpoint(self.endpoint, ("https",), ("http",))
        self.exec_url = exec_url or os.environ.get(EXEC_URL_ENV, "").strip().rstrip("/") or DEFAULT_EXEC_URL
        _check_endpoint(self.exec_url, ("wss",), ("ws",))
        self.token = token
        self.auth_type = auth_type
        self.environment_id = environment_id
        self.region = region
        self.idle_timeout_minutes = idle_timeout_minutes
        self.resources = dict(resources or {})
        self.network_isolation = network_isolation
        self.ports = ports
        self.checkpoint = checkpoint
        self.workdir = workdir.rstrip("/") or "/"
        self.request_timeout = request_timeout
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.railway")
        self.restore_snapshot = self._restore
        self._api: RailwayApi | None = None

    def capabilities(self) -> Capabilities:
        return _capabilities(bool(self.ports))

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {
            "environment": self._environment(),
            "checkpoint": self.checkpoint,
            "workdir": self.workdir,
            "network": self.network_isolation,
            "ports": sorted(self.ports),
        }

    # -- the API -----------------------------------------------------------------------------------

    def _environment(self) -> str | None:
        return self.environment_id or os.environ.get(ENVIRONMENT_ENV)

    def _client(self) -> RailwayApi:
        if self._api is None:
            token, auth = self.token, self.auth_type or "bearer"
            if token is None:
                if os.environ.get(PROJECT_TOKEN_ENV):
                    token, auth = os.environ[PROJECT_TOKEN_ENV], "project-token"
                elif os.environ.get(API_TOKEN_ENV):
                    token, auth = os.environ[API_TOKEN_ENV], "bearer"
            if not token:
                raise ProviderUnavailableError(
                    NAME, f"no token ({PROJECT_TOKEN_ENV} and {API_TOKEN_ENV} unset)", KEY_HELP
                )
            if not self._environment():
                raise ProviderUnavailableError(NAME, f"no environment ({ENVIRONMENT_ENV} is not set)", KEY_HELP)
            self._api = RailwayApi(self.endpoint, token, auth, self.request_timeout)
        return self._api

    async def api_call(self, operation: str, query: str, **variables: Any) -> Any:
        api = self._client()
        return await api.call(operation, query, {"environmentId": self._environment(), **variables})

    async def shell_token(self, sandbox_id: str) -> str:
        shell = {"environmentId": self._environment(), "instanceId": sandbox_id, "kind": "sandbox", "scope": "shell"}
        try:
            data = await self._client().call("GenerateShellToken", _SHELL_TOKEN, {"input": shell})
        except RailwayNotFound as exc:
            raise SandboxNotFoundError(NAME, sandbox_id, "is gone (destroyed or idle-expired)") from exc
        return str(data["generateShellToken"])

    async def _get(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            data = await self.api_call("Sandbox", _GET, id=sandbox_id)
        except RailwayNotFound:
            return None
        found = data.get("sandbox")
        return dict(found) if found else None

    # -- create, restore, fork ------------------------------------------------------------------------

    def _input(self, env: Mapping[str, str] | None, *, fresh: bool) -> dict[str, Any]:
        made: dict[str, Any] = {"environmentId": self._environment()}
        if self.region is not None and fresh:
            made["region"] = self.region  # restores and forks run where their data is
        if self.idle_timeout_minutes is not None:
            made["idleTimeoutMinutes"] = self.idle_timeout_minutes
        if self.resources:
            made["resources"] = {("memoryGB" if k == "memory_gb" else k): v for k, v in self.resources.items()}
        if self.network_isolation is not None:
            made["networkIsolation"] = self.network_isolation
        if self.ports:
            made["domains"] = [{"port": port} for port in self.ports]
        if env:
            # Secrets: the sandbox's runtime variables, never a command string.
            made["variables"] = dict(env)
        return made

    @staticmethod
    def _refuse_deny(network: NetworkPolicy | None) -> None:
        if network is not None and network.mode == "deny":
            raise UnsupportedCapabilityError(
                NAME,
                "network_policy",
                "Railway sandboxes always have public internet egress (ISOLATED only removes private-network "
                "access), so a deny cannot be enforced",
            )

    async def create(self, input: CreateInput | None = None) -> RailwayHandle:
        input = input or CreateInput()
        if input.signal is not None:
            input.signal.throw_if_aborted()
        self._refuse_deny(input.network)
        # Railway mints opaque ids; input.id is not addressable there (the contract allows ignoring it).
        source = {"template": {"name": self.checkpoint}} if self.checkpoint else {}
        return await self.make(source, input.env, input.signal, input.env, fresh=not self.checkpoint)

    async def _restore(self, input: RestoreInput) -> RailwayHandle:
        if input.signal is not None:
            input.signal.throw_if_aborted()
        self._refuse_deny(input.network)
        # A checkpoint is the disk only: env, network mode, domains and idle timeout come from this config.
        return await self.make(
            {"template": {"name": input.snapshot_id}}, input.env, input.signal, input.env, fresh=False
        )

    async def make(
        self,
        source: Mapping[str, Any],
        create_env: Mapping[str, str] | None,
        signal: AbortSignal | None,
        env: Mapping[str, str] | None,
        *,
        fresh: bool,
    ) -> RailwayHandle:
        body = {**self._input(create_env, fresh=fresh), **source}
        minted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        creating = asyncio.ensure_future(self._create_ready(body, minted))
        aborted = asyncio.ensure_future(signal.wait()) if signal is not None else None
        handle: RailwayHandle | None = None
        try:
            waiting: set[asyncio.Future[Any]] = {creating} if aborted is None else {creating, aborted}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if aborted is not None and aborted.done() and not creating.done():
                raise AbortError(signal.reason if signal is not None else None)
            sandbox = await creating
            handle = RailwayHandle(self, sandbox, create_env, env)
            made = await handle.plain(script("create", 'mkdir -p -- "$1"', self.workdir))
            if made.exit_code != 0:
                raise SandboxCommandError("create", made.exit_code, made.stderr.strip())
            if signal is not None:
                signal.throw_if_aborted()
            return handle
        except BaseException:
            # Whatever Railway made is destroyed: a failed, timed-out or aborted create leaves nothing billing.
            await asyncio.shield(self._clean_up_create(creating, minted))
            raise
        finally:
            if aborted is not None:
                aborted.cancel()

    async def _create_ready(self, body: Mapping[str, Any], minted: asyncio.Future[str]) -> dict[str, Any]:
        try:
            data = await self._client().call("SandboxCreate", _CREATE, {"input": dict(body)})
        except BaseException as exc:
            if not minted.done():
                minted.set_exception(exc if isinstance(exc, Exception) else RailwayError("create", "cancelled"))
            raise
        sandbox = dict(data["sandboxCreate"])
        minted.set_result(str(sandbox["id"]))
        deadline = time.monotonic() + _READY_TIMEOUT
        polls = 0
        while sandbox.get("status") != "RUNNING":
            if sandbox.get("status") in TERMINAL:
                raise RailwayError("create", f"sandbox {sandbox['id']} is {sandbox.get('status')}")
            if time.monotonic() > deadline:
                raise RailwayError("create", f"sandbox {sandbox['id']} not RUNNING after {_READY_TIMEOUT:.0f} s")
            await asyncio.sleep(_POLLS[min(polls, len(_POLLS) - 1)])
            polls += 1
            sandbox = await self._get(str(sandbox["id"])) or {**sandbox, "status": "DESTROYED"}
        return sandbox

    async def _clean_up_create(self, creating: asyncio.Future[Any], minted: asyncio.Future[str]) -> None:
        if not creating.done():
            # The create mutation may still mint a sandbox: wait for its answer (bounded), then stop waiting.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(minted), self.request_timeout)
            creating.cancel()
            with contextlib.suppress(BaseException):
                await creating
        if minted.done() and not minted.cancelled() and minted.exception() is None:
            with contextlib.suppress(Exception):
                await self.destroy(DestroyInput(id=minted.result()))

    # -- resume, destroy, reap ----------------------------------------------------------------------

    async def resume(self, input: ResumeInput) -> RailwayHandle | None:
        if input.signal is not None:
            input.signal.throw_if_aborted()
        sandbox = await self._get(input.id)
        deadline = time.monotonic() + _RESUME_TIMEOUT
        polls = 0
        while sandbox is not None and sandbox.get("status") == "CREATING":
            if time.monotonic() > deadline:
                raise RailwayError("resume", f"sandbox {input.id} still CREATING after {_RESUME_TIMEOUT:.0f} s")
            await asyncio.sleep(_POLLS[min(polls, len(_POLLS) - 1)])
            polls += 1
            sandbox = await self._get(input.id)
        if sandbox is None or sandbox.get("status") in TERMINAL:
            return None
        try:
            # Resets the idle countdown, so a resumed sandbox is not reaped moments later.
            await self.api_call("SandboxHeartbeat", _HEARTBEAT, id=input.id)
        except RailwayNotFound:
            return None
        except RailwayError as exc:
            self.logger.warn("heartbeat after resume failed; the next command renews the lifetime", {"error": str(exc)})
        return RailwayHandle(self, sandbox, None)

    async def destroy(self, input: DestroyInput) -> None:
        sandbox = await self._get(input.id)
        if sandbox is None or sandbox.get("status") in ("DESTROYED", "DESTROYING"):
            return  # already gone is success
        with contextlib.suppress(RailwayNotFound):
            await self.api_call("SandboxDestroy", _DESTROY, id=input.id)

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """The live sandboxes of this environment, every page, for ``boxwright reap``.

        Railway has no labels: no lease either, so a reaper keeps them (the environment is the scope).
        """
        if labels:
            raise UnsupportedCapabilityError(NAME, "metadata", "Railway sandboxes carry no labels to filter on")
        found: list[OwnedSandbox] = []
        after: str | None = None
        while True:
            data = await self.api_call("Sandboxes", _LIST, first=50, after=after)
            page = data["sandboxes"]
            nodes = [e["node"] for e in page["edges"]]
            found.extend(OwnedSandbox(id=str(n["id"])) for n in nodes if n.get("status") not in TERMINAL)
            info = page.get("pageInfo") or {}
            if not info.get("hasNextPage"):
                return found
            after = info.get("endCursor")


def _check_endpoint(url: str, secure: tuple[str, ...], plain: tuple[str, ...]) -> None:
    """The token travels with every request: only TLS, or plain text to a loopback dev server."""
    parsed = httpx.URL(url)
    loopback = parsed.host in ("localhost", "127.0.0.1", "::1")
    if parsed.scheme not in secure and not (parsed.scheme in plain and loopback):
        raise ValueError(f"railway: {url!r} must use {secure[0]} ({plain[0]} only to localhost)")


def railway_sandbox(
    *,
    token: str | None = None,
    auth_type: Literal["bearer", "project-token"] | None = None,
    environment_id: str | None = None,
    region: str | None = None,
    idle_timeout_minutes: int | None = None,
    resources: Mapping[str, float] | None = None,
    network_isolation: Literal["ISOLATED", "PRIVATE"] | None = None,
    ports: Sequence[int] = (),
    checkpoint: str | None = None,
    workdir: str = DEFAULT_WORKDIR,
    endpoint: str | None = None,
    exec_url: str | None = None,
    request_timeout: float = 60.0,
    logger: Logger | None = None,
) -> RailwayProvider:
    """A provider whose sandboxes are Railway sandboxes in one environment.

    ``resources`` takes ``cpu`` (vCPU, fractions allowed) and ``memory_gb`` (decimal GB).
    ``endpoint`` (GraphQL) and ``exec_url`` (the exec bridge, also ``RAILWAY_TCP_PROXY_WS_ENDPOINT``)
    point the client elsewhere (tests, other Railway hosts).
    """
    return RailwayProvider(
        token=token,
        auth_type=auth_type,
        environment_id=environment_id,
        region=region,
        idle_timeout_minutes=idle_timeout_minutes,
        resources=resources,
        network_isolation=network_isolation,
        ports=ports,
        checkpoint=checkpoint,
        workdir=workdir,
        endpoint=endpoint,
        exec_url=exec_url,
        request_timeout=request_timeout,
        logger=logger,
    )
