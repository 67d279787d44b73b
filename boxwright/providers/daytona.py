"""Daytona: a managed cloud sandbox per boxwright sandbox, on the official ``daytona`` SDK (``AsyncDaytona``).

Seed and spec §2.4, point by point:

- Config: ``api_key`` or ``DAYTONA_API_KEY``, ``api_url`` or ``DAYTONA_API_URL``, ``target``
  or ``DAYTONA_TARGET``, ``snapshot`` (the image, e.g. ``daytona-medium``), ``language``
  (typescript), ``workdir`` (``/workspace`` maps to ``/home/daytona/workspace``),
  ``auto_stop_interval`` minutes (Daytona's default 15; 0 = off), ``ephemeral`` (deleted
  when it stops), ``public`` (preview links without a token).
- Secrets (K3): each create/restore env value becomes an organization Secret; the sandbox
  env holds only its placeholder (Daytona swaps the value into outbound HTTPS), so neither
  the create record nor a command string holds a value. The secrets are deleted with the
  sandbox (their ids ride on its labels). Per-command env (and ``env.set``) goes in a file
  uploaded through the file API, sourced and removed by the command: never an ``export
  K=`` in the command string.
- Processes: one session per spawn, an async session command ``cd <cwd> && <cmd>``, output
  from the log stream (stdout and stderr apart), status polled every 400 ms (at once when
  the log stream ends), then the session is deleted. Stdin: base64 lines through the
  session input, decoded by a small reader in front of the command; ``end()`` sends the end
  line, so EOF reaches the command (Daytona's input API has no close). ``kill()`` deletes
  the session and stops polling; whether that reaches a background child is not measured,
  so ``killable_processes`` is false (the journal polls).
- Snapshot: stop, ``create_snapshot("boxwright-<id12>-<label>")``, start again (also on
  failure); restore creates a sandbox from it; no fork. Resume: get, start a ``stopped``
  or ``archived`` one; a missing or destroyed one resumes as ``None``, other errors raise.
- Ports: a preview link; unless ``public``, a signed URL (1 h) and its token (browsers
  cannot send the ``X-Daytona-Preview-Token`` header). Network deny = ``network_block_all``;
  a host list is refused. The Daytona user is not root: setup uses ``sudo -n``.
- Every sandbox carries boxwright's ownership labels (``list_owned``); an abort or cancel
  during create destroys what was made.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import secrets
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from ..abort import AbortSignal
from ..errors import (
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
    FsEntry,
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
    DEFAULT_LEASE,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    OwnedSandbox,
    ProcessSet,
    RemoteProcess,
    ShellFs,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    collect,
    exec_result,
    export_lines,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
)

NAME = "daytona"
API_KEY_ENV = "DAYTONA_API_KEY"
API_URL_ENV = "DAYTONA_API_URL"
TARGET_ENV = "DAYTONA_TARGET"
DEFAULT_WORKDIR = "/home/daytona/workspace"
PREVIEW_HEADER = "X-Daytona-Preview-Token"
NONCE = "boxwright.create-nonce"
SECRETS_LABEL = "boxwright.secrets"
KEY_HELP = f"set {API_KEY_ENV} (https://app.daytona.io/dashboard/keys) or pass daytona_sandbox(api_key=...)"
POLL = 0.4
SIGNED_URL_SECONDS = 3600
_GONE_STATES = {"destroyed", "destroying", "error", "build_failed"}
_STOPPED_STATES = {"stopped", "archived"}
# $1 a FIFO path, $2 the command. A reader in front of the command turns base64 lines of the
# session input into bytes on the command's stdin; a "." line is EOF. The reader is killed when
# the command ends (a command that never reads its stdin must not wait on it). Its own `sh`, so
# `exit` never reaches a session shell. (A background job's stdin is /dev/null unless passed on.)
_STDIN_WRAPPER = (
    'mkfifo -m 600 "$1" || exit 125; exec 3<&0; '
    '(while IFS= read -r l; do [ "$l" = . ] && break; printf %s "$l" | base64 -d; done > "$1") <&3 3<&- & '
    'r=$!; exec 3<&-; sh -c "$2" < "$1"; c=$?; kill $r 2>/dev/null; rm -f "$1"; exit $c'
)

CAPABILITIES = Capabilities(
    fs=True,
    exec=True,
    env=True,
    ports=True,
    background_processes=True,
    writable_stdin=True,  # session input through the base64 reader, EOF included; C12
    killable_processes=False,  # deleting the session is not measured to end a background child
    snapshots=True,
    network_policy=True,  # deny = network_block_all
    durable_filesystem=True,  # a stopped or archived sandbox keeps its files
    fork=False,
)


def _sdk() -> Any:
    return import_sdk(NAME, "daytona", "daytona", "daytona")


def _state(sandbox: Any) -> str:
    state = getattr(sandbox, "state", None)
    return str(getattr(state, "value", state) or "").lower()


class _Stdin:
    def __init__(self, process: DaytonaProcess, writable: bool) -> None:
        self._process = process
        self._writable = writable
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        if not self._writable:
            raise UnsupportedCapabilityError(NAME, "writable_stdin", "this command was started without stdin")
        if self._ended:
            raise ProcessExitedError(self._process.pid, "stdin was already ended (closed)")
        if self._process.exited:
            raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if raw:
            await self._process.send(base64.b64encode(raw).decode() + "\n")

    async def end(self) -> None:
        if self._ended or not self._writable:
            return
        self._ended = True
        if not self._process.exited:
            with contextlib.suppress(Exception):
                await self._process.send(".\n")


class DaytonaProcess(RemoteProcess):
    """``SpawnHandle`` over one async session command: its log stream, its polled status, its session."""

    # pid -1: a session command has no pid the API reports

    def __init__(self, handle: DaytonaHandle, session: str, command_id: str, stdin: bool, fifo: str | None) -> None:
        self._handle = handle
        self._fifo = fifo
        self._session = session
        self._command = command_id
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = _Stdin(self, stdin)
        self._killed = False
        self._logs = asyncio.ensure_future(
            handle.sdk.process.get_session_command_logs_async(session, command_id, self.stdout.feed, self.stderr.feed)
        )
        self._logs.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.watch(self._poll())

    async def send(self, line: str) -> None:
        await self._handle.sdk.process.send_session_command_input(self._session, self._command, line)

    async def _poll(self) -> int:
        daytona = _sdk()
        try:
            while True:
                # Poll every 400 ms, and at once when the log stream ends (the command closed its output).
                with contextlib.suppress(Exception):  # a timeout, or the log stream's own failure
                    await asyncio.wait_for(asyncio.shield(self._logs), POLL)
                try:
                    command = await self._handle.sdk.process.get_session_command(self._session, self._command)
                except daytona.DaytonaNotFoundError as exc:
                    if self._killed or self._handle.destroyed:
                        return 128 + 9
                    raise SandboxNotFoundError(NAME, self._handle.id, "lost the command (session gone)") from exc
                if command.exit_code is not None:
                    code = int(command.exit_code)
                    break
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._logs), 1.0)  # trailing logs
            return code
        finally:
            if not self._logs.done():
                self._logs.cancel()
            self.stdout.close()
            self.stderr.close()
            if not self._killed:
                self._handle.drop_session_soon(self._session)  # not on the path of wait(): nobody waits on it

    async def _do_kill(self, sig: int | None) -> None:
        if self.exited:
            return
        self._killed = True
        await self._handle.drop_session(self._session)
        await self.confirm_exit()
        if self._fifo is not None and not self._handle.destroyed:
            with contextlib.suppress(Exception):  # the killed wrapper could not remove its stdin FIFO
                await self._handle.plain(f"rm -f {quote(self._fifo)}")


class DaytonaProcesses(ProcessSet[DaytonaProcess]):
    def __init__(self, handle: DaytonaHandle) -> None:
        super().__init__()
        self._handle = handle

    async def spawn(self, command: str, opts: ProcessOptions | None = None, *, stdin: bool = True) -> DaytonaProcess:
        opts = self.started(opts)
        handle = self._handle
        env = {**handle.env.get(), **(opts.env or {})}
        parts = []
        if env:
            # Values travel in a file through the file API, sourced then removed: never in the command string.
            path = f"/tmp/.boxwright-env-{uuid.uuid4().hex}"
            await handle.upload(f"{export_lines(env)}\n".encode(), path)
            parts.append(f". {path} && rm -f {path}")
        parts.append(f"cd {quote(map_path(opts.cwd or '', handle.workdir))}")
        fifo = f"/dev/shm/.boxwright-in-{uuid.uuid4().hex}" if stdin else None
        if fifo is not None:
            parts.append(f"sh -c {quote(_STDIN_WRAPPER)} boxwright {quote(fifo)} {quote(command)}")
        else:
            parts.append(f"sh -c {quote(command)} < /dev/null")
        return self.track(await handle.start(" && ".join(parts), stdin, fifo), opts.signal)

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        return await exec_result(await self.spawn(command, opts, stdin=False))


class DaytonaFs(ShellFs):
    """The toolbox file API (upload, folders, list, recursive delete, move, info for ``exists``); ``read`` and
    ``lstat`` through the shell (base64 output; the GNU stat probe that never follows a link)."""

    def __init__(self, handle: DaytonaHandle) -> None:
        super().__init__(handle.plain, handle.workdir)
        self._handle = handle

    async def write(self, path: str, data: str | bytes) -> None:
        target = self.p(path)
        parent = target.rsplit("/", 1)[0] or "/"
        await self.mkdir(parent)
        await self._handle.upload(data.encode() if isinstance(data, str) else bytes(data), target)

    async def mkdir(self, path: str) -> None:
        daytona = _sdk()
        try:
            await self._handle.sdk.fs.create_folder(self.p(path), "755")
        except daytona.DaytonaError as exc:
            raise SandboxCommandError("mkdir", 1, str(exc)) from exc

    async def list(self, path: str) -> list[FsEntry]:
        daytona = _sdk()
        virtual = (path.rstrip("/") or "/").rstrip("/")
        try:
            found = await self._handle.sdk.fs.list_files(self.p(path))
        except daytona.DaytonaError as exc:
            raise SandboxCommandError("list", 1, str(exc)) from exc
        return [FsEntry(f.name, f"{virtual}/{f.name}", "dir" if f.is_dir else "file") for f in found]

    async def remove(self, path: str) -> None:
        daytona = _sdk()
        try:
            await self._handle.sdk.fs.delete_file(self.p(path), recursive=True)
        except daytona.DaytonaNotFoundError:
            return  # missing is fine
        except daytona.DaytonaError as exc:
            raise SandboxCommandError("remove", 1, str(exc)) from exc

    async def rename(self, src: str, dst: str) -> None:
        daytona = _sdk()
        target = self.p(dst)
        await self.mkdir(target.rsplit("/", 1)[0] or "/")
        try:
            await self._handle.sdk.fs.move_files(self.p(src), target)
        except daytona.DaytonaError as exc:
            raise SandboxCommandError("rename", 1, str(exc)) from exc

    async def exists(self, path: str) -> bool:
        daytona = _sdk()
        try:
            await self._handle.sdk.fs.get_file_info(self.p(path))
        except daytona.DaytonaNotFoundError:
            return False  # a confirmed miss; other failures raise
        return True


class DaytonaPorts:
    def __init__(self, handle: DaytonaHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        sdk = self._handle.sdk
        if self._handle.public:
            link = await sdk.get_preview_link(port)
            return channel(str(link.url))
        # A browser cannot send the preview-token header: a signed URL carries the token itself.
        signed = await sdk.create_signed_preview_url(port, expires_in_seconds=SIGNED_URL_SECONDS)
        return channel(str(signed.url), token=str(signed.token))


class DaytonaHandle:
    provider = NAME
    capabilities = CAPABILITIES

    def __init__(self, provider: DaytonaProvider, sdk: Any, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        loop = asyncio.get_running_loop()
        provider._live[loop] = provider._live.get(loop, 0) + 1
        self.sdk = sdk
        self.id = str(sdk.id)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.public = provider.public
        self.env = HandleEnv(env)
        self.process = DaytonaProcesses(self)
        self.fs = DaytonaFs(self)
        self.git = ExecGit(self.process)
        self.ports = DaytonaPorts(self)
        self.destroyed = False
        self._cleanups: set[asyncio.Future[None]] = set()

    async def start(self, line: str, stdin: bool, fifo: str | None = None) -> DaytonaProcess:
        daytona = _sdk()
        session = f"boxwright-{uuid.uuid4().hex}"
        try:
            await self.sdk.process.create_session(session)
            started = await self.sdk.process.execute_session_command(
                session, daytona.SessionExecuteRequest(command=line, run_async=True)
            )
        except daytona.DaytonaNotFoundError as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone") from exc
        except daytona.DaytonaError as exc:
            await self.drop_session(session)
            raise SandboxCommandError("exec", -1, str(exc)) from exc
        except asyncio.CancelledError:
            # Cancelled while the daemon started it: the command may run already; its session goes with it.
            await asyncio.shield(self.drop_session(session))
            raise
        return DaytonaProcess(self, session, str(started.cmd_id), stdin, fifo)

    def drop_session_soon(self, session: str) -> None:
        task = asyncio.ensure_future(self.drop_session(session))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def drop_session(self, session: str) -> None:
        with contextlib.suppress(Exception):
            await self.sdk.process.delete_session(session)

    async def upload(self, data: bytes, path: str) -> None:
        daytona = _sdk()
        try:
            await self.sdk.fs.upload_file(data, path)
        except daytona.DaytonaError as exc:
            raise SandboxCommandError("write", 1, f"{path}: {exc}") from exc

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op): no handle env, no stdin."""
        process = await self.start(f"{line} < /dev/null", False)
        out, err, code = await asyncio.gather(collect(process.stdout), collect(process.stderr), process.wait())
        return ExecResult(stdout=out, stderr=err, exit_code=code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        name = _snapshot_name(self.id, label)
        await self.sdk.stop()
        try:
            await self.sdk.create_snapshot(name)
        finally:
            await self.sdk.start()  # also after a failed snapshot: the sandbox stays usable
        return SnapshotRef(id=name, label=label)

    async def fork(self) -> DaytonaHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "Daytona sandboxes are snapshotted and restored, not forked")

    async def destroy(self) -> None:
        first = not self.destroyed
        if first:
            await self.process.kill_all()
            if self._cleanups:
                await asyncio.wait(set(self._cleanups), timeout=10)
        self.destroyed = True
        await self._provider.destroy(DestroyInput(id=self.id))
        if first:
            await self._provider.release()


def _snapshot_name(sandbox_id: str, label: str | None) -> str:
    text = re.sub(r"[^a-z0-9]+", "-", (label or "snap").lower()).strip("-") or "snap"
    return f"boxwright-{sandbox_id[:12].lower()}-{text}"[:63].rstrip("-")


class DaytonaProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        snapshot: str | None = None,
        language: str = "typescript",
        workdir: str = DEFAULT_WORKDIR,
        auto_stop_interval: int = 15,
        ephemeral: bool = False,
        public: bool = False,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        logger: Logger | None = None,
    ) -> None:
        self.api_key = api_key
        self.api_url = api_url
        self.target = target
        self.snapshot = snapshot
        self.language = language
        self.workdir = workdir.rstrip("/") or "/"
        self.auto_stop_interval = auto_stop_interval
        self.ephemeral = ephemeral
        self.public = public
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.daytona")
        self.restore_snapshot = self._restore
        # The SDK's clients belong to the loop they were made on: one per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._live: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"snapshot": self.snapshot, "workdir": self.workdir, "target": self.target}

    async def release(self) -> None:
        """Close this loop's client once no handle made on it is live (its aiohttp sessions belong to the loop)."""
        loop = asyncio.get_running_loop()
        self._live[loop] = self._live.get(loop, 1) - 1
        if self._live[loop] <= 0:
            self._live.pop(loop, None)
            client = self._clients.pop(loop, None)
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            daytona = _sdk()
            key = self.api_key or os.environ.get(API_KEY_ENV)
            if not key:
                raise ProviderUnavailableError(NAME, f"no API key ({API_KEY_ENV} is not set)", KEY_HELP)
            config = daytona.DaytonaConfig(
                api_key=key,
                api_url=self.api_url or os.environ.get(API_URL_ENV) or None,
                target=self.target or os.environ.get(TARGET_ENV) or None,
            )
            client = daytona.AsyncDaytona(config)
            self._clients[loop] = client
        return client

    async def create(self, input: CreateInput | None = None) -> DaytonaHandle:
        input = input or CreateInput()
        return await self._create_from(self.snapshot, input.env, input.network, input.id, input.signal)

    async def _restore(self, input: RestoreInput) -> DaytonaHandle:
        return await self._create_from(input.snapshot_id, input.env, input.network, None, input.signal)

    async def _create_from(
        self,
        snapshot: str | None,
        env: Mapping[str, str] | None,
        network: NetworkPolicy | None,
        name: str | None,
        signal: AbortSignal | None,
    ) -> DaytonaHandle:
        if signal is not None:
            signal.throw_if_aborted()
        daytona = _sdk()
        client = self._client()
        block_all = None
        if network is not None and network.mode == "deny":
            if network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "boxwright maps deny to Daytona's block-all, not to a host allow-list"
                )
            block_all = True
        nonce = secrets.token_hex(8)
        made_secrets: list[str] = []
        try:
            mounted: dict[str, str] = {}
            for key, value in (env or {}).items():
                # K3: the value lives in an organization Secret; the sandbox env gets its placeholder.
                secret_name = f"boxwright_{nonce}_{re.sub(r'[^A-Za-z0-9_]', '_', key)}"
                made = await client.secret.create(daytona.CreateSecretParams(name=secret_name, value=value))
                made_secrets.append(str(made.id))
                mounted[key] = secret_name
            labels = {
                **ownership(name, self.run_id, self.lease_seconds, self.labels),
                NONCE: nonce,
                SECRETS_LABEL: ",".join(made_secrets),
            }
            params = daytona.CreateSandboxFromSnapshotParams(
                name=name,
                snapshot=snapshot,
                language=self.language,
                labels=labels,
                public=self.public,
                auto_stop_interval=self.auto_stop_interval,
                auto_delete_interval=0 if self.ephemeral else None,
                network_block_all=block_all,
                secrets=mounted or None,
            )

            async def ready(sandbox: Any) -> DaytonaHandle:
                handle = DaytonaHandle(self, sandbox, None)
                # From the default cwd (the user's home): the workdir under it is the portable /workspace.
                await make_workdir(handle.plain, self.workdir)
                return handle

            async def delete(sandbox: Any) -> None:
                # The sandbox the create answered, or the one its nonce label finds when no answer came.
                ids = (
                    [str(sandbox.id)] if sandbox is not None else [m.id for m in await self.list_owned({NONCE: nonce})]
                )
                for sandbox_id in ids:
                    with contextlib.suppress(Exception):
                        await self.destroy(DestroyInput(id=sandbox_id))

            return await abortable_create(client.create(params, timeout=120), signal, ready, delete)
        except BaseException:
            # After the sandbox (abortable_create deleted it): the Secrets its env made.
            await asyncio.shield(self._delete_secrets(made_secrets))
            raise

    async def _delete_secrets(self, made: list[str]) -> None:
        client = self._client()
        for secret_id in made:
            with contextlib.suppress(Exception):
                await client.secret.delete(secret_id)

    async def resume(self, input: ResumeInput) -> DaytonaHandle | None:
        daytona = _sdk()
        try:
            sandbox = await self._client().get(input.id)
        except daytona.DaytonaNotFoundError:
            return None
        state = _state(sandbox)
        if state in _GONE_STATES:
            return None
        if state in _STOPPED_STATES:
            await sandbox.start()
        return DaytonaHandle(self, sandbox, None)

    async def destroy(self, input: DestroyInput) -> None:
        daytona = _sdk()
        client = self._client()
        try:
            sandbox = await client.get(input.id)
        except daytona.DaytonaNotFoundError:
            return  # already gone is success
        made = [s for s in (sandbox.labels or {}).get(SECRETS_LABEL, "").split(",") if s]
        try:
            await client.delete(sandbox)
        except daytona.DaytonaNotFoundError:
            pass
        for secret_id in made:
            with contextlib.suppress(daytona.DaytonaNotFoundError):
                await client.secret.delete(secret_id)

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright sandboxes (with every pair of ``labels`` too), every page, for ``boxwright reap``."""
        daytona = _sdk()
        query = daytona.ListSandboxesQuery(labels={LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})})
        return [owned(str(sandbox.id), sandbox.labels or {}) async for sandbox in self._client().list(query)]

    async def list_for_key(self, key: str) -> list[str]:
        """The sandboxes labelled with sandbox ``key``, of any owner host, every page."""
        daytona = _sdk()
        query = daytona.ListSandboxesQuery(labels={LABEL_MANAGED: "1", LABEL_SANDBOX: key})
        return [str(sandbox.id) async for sandbox in self._client().list(query)]


def daytona_sandbox(
    *,
    api_key: str | None = None,
    api_url: str | None = None,
    target: str | None = None,
    snapshot: str | None = None,
    language: str = "typescript",
    workdir: str = DEFAULT_WORKDIR,
    auto_stop_interval: int = 15,
    ephemeral: bool = False,
    public: bool = False,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    logger: Logger | None = None,
) -> DaytonaProvider:
    """A provider whose sandboxes are Daytona sandboxes of ``snapshot`` (Daytona's default image when None).

    ``auto_stop_interval`` is in minutes (0 turns auto-stop off); ``ephemeral`` deletes a
    sandbox when it stops; ``public`` makes preview links work without a token.
    """
    return DaytonaProvider(
        api_key=api_key,
        api_url=api_url,
        target=target,
        snapshot=snapshot,
        language=language,
        workdir=workdir,
        auto_stop_interval=auto_stop_interval,
        ephemeral=ephemeral,
        public=public,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        logger=logger,
    )
