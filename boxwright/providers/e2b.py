"""E2B: one Firecracker microVM per sandbox, on the official ``e2b`` SDK (``AsyncSandbox``, extra ``e2b``).

Seed and spec §2.6, point by point:

- Config: ``api_key`` or ``E2B_API_KEY``, ``domain`` or ``E2B_DOMAIN`` (self-hosted, BYOC),
  ``template`` (default ``base``), ``lifetime`` (30 min; E2B kills the VM after it, so an
  abandoned run stops billing; resume extends it by the same amount), ``on_timeout="pause"``
  keeps a timed-out sandbox resumable (and its files durable), ``allow_public_traffic``,
  ``workdir`` (``/workspace`` maps to ``/home/user/workspace``: ``/workspace`` itself is not
  writable for the sandbox user ``user``).
- Secrets are the sandbox ``envs`` at create and snapshot restore; per-command env (and
  ``env.set``) travels in the SDK's ``envs`` of every command. No value is ever part of a
  command string.
- Processes: every command runs as the leader of its own group under ``setsid``; the group
  id is recorded from inside (``setsid`` forks when its caller already leads a group, so the
  SDK's pid is not the group's). ``kill()`` always sends SIGKILL to the whole group from a
  second command in the VM: the SDK's own kill reaches the shell only, and a background
  child survived it (measured by the seed). Hence ``killable_processes`` is true.
- Snapshot = ``create_snapshot()`` (a brief pause); restore = a new sandbox from it (it
  survives its source); fork is native; resume = ``connect`` (wakes a paused sandbox);
  killed, expired or missing resumes as ``None``, other errors raise.
- Ports: ``https://<port>-<id>.<domain>``; with public traffic off the channel carries the
  ``e2b-traffic-access-token`` header. Network deny is ``allow_internet_access=False``; a
  host allow-list is refused (the coarse gate cannot express E2B's per-host lists).
- Every sandbox carries boxwright's ownership metadata (``list_owned`` finds them, paginated).
- An abort or cancel during create destroys whatever was made, then raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import uuid
from collections.abc import Mapping
from typing import Any, Literal

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
    KILL_SCRIPT,
    LABEL_MANAGED,
    LABEL_OWNER,
    WRAPPER,
    GroupProcess,
    OwnedSandbox,
    ProcessSet,
    RemoteHandle,
    ShellFs,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    collect,
    exec_result,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
    script,
)

NAME = "e2b"
API_KEY_ENV = "E2B_API_KEY"
DOMAIN_ENV = "E2B_DOMAIN"
DEFAULT_WORKDIR = "/home/user/workspace"
DEFAULT_LIFETIME = 30 * 60.0
TRAFFIC_HEADER = "e2b-traffic-access-token"
NONCE = "boxwright.create-nonce"
KEY_HELP = f"set {API_KEY_ENV} (https://e2b.dev/dashboard) or pass e2b_sandbox(api_key=...)"
_SIGNALS = {"killed": 9, "terminated": 15, "interrupt": 2, "hangup": 1, "quit": 3, "aborted": 6, "broken pipe": 13}


def _sdk() -> Any:
    return import_sdk(NAME, "e2b", "e2b", "e2b")


def _capabilities(durable: bool) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=True,  # envd SendInput/CloseStdin; C12
        killable_processes=True,  # setsid group + in-VM group SIGKILL; measured by the seed, J7/J8 here
        snapshots=True,
        network_policy=True,  # deny = allow_internet_access False
        durable_filesystem=durable,  # only a paused (not killed) sandbox keeps its files
        fork=True,
    )


class _Stdin:
    def __init__(self, process: E2BProcess, writable: bool) -> None:
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
        try:
            await self._process.sdk_handle.send_stdin(data.encode() if isinstance(data, str) else bytes(data))
        except Exception as exc:
            if self._process.exited:
                raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed") from exc
            raise

    async def end(self) -> None:
        if self._ended or not self._writable:
            return
        self._ended = True
        if not self._process.exited:
            with contextlib.suppress(Exception):
                await self._process.sdk_handle.close_stdin()


class E2BProcess(GroupProcess):
    """``SpawnHandle`` over one envd process; ``kill`` signals the recorded group inside the VM."""

    # Always SIGKILL (seed): a TERM the command traps would leave the group running.
    kill_signal = "KILL"

    def __init__(
        self, handle: E2BHandle, sdk_handle: Any, out: TextChannel, err: TextChannel, pid_file: str | None, stdin: bool
    ) -> None:
        super().__init__(handle, pid_file)
        self._handle = handle
        self.sdk_handle = sdk_handle
        self.pid = int(sdk_handle.pid)
        self.stdout = out
        self.stderr = err
        self.stdin = _Stdin(self, stdin)
        self.watch(self._await_exit())

    async def _await_exit(self) -> int:
        e2b = _sdk()
        try:
            await self.sdk_handle.wait()
            return 0
        except e2b.CommandExitException as exc:
            return _exit_code(int(exc.exit_code), getattr(exc, "error", None))
        except (e2b.SandboxNotRunningException, e2b.SandboxNotFoundException) as exc:
            if self._handle.destroyed:
                return 128 + 9  # the VM went with destroy(): its processes were killed
            raise SandboxNotFoundError(NAME, self._handle.id, "is gone (killed or expired)") from exc
        finally:
            self.stdout.close()
            self.stderr.close()


def _exit_code(code: int, error: str | None) -> int:
    """envd reports a signal death as -1 with ``status "signal: killed"``; the contract wants 128 + signo (K5)."""
    if code >= 0:
        return code
    text = (error or "").lower().removeprefix("signal: ").strip()
    return 128 + _SIGNALS.get(text, 9)


class E2BProcesses(ProcessSet[E2BProcess]):
    def __init__(self, handle: E2BHandle) -> None:
        super().__init__()
        self._handle = handle

    async def spawn(self, command: str, opts: ProcessOptions | None = None, *, stdin: bool = True) -> E2BProcess:
        opts = self.started(opts)
        handle = self._handle
        # /dev/shm, not /tmp: the record of a command that lists /tmp is not among what it lists.
        pid_file = f"/dev/shm/.boxwright-e2b-{uuid.uuid4().hex}.pid"
        # A background job of a non-interactive bash does not lead a group, so setsid makes it the leader
        # without forking; its stdin is passed explicitly (bash gives `&` jobs /dev/null otherwise).
        line = (
            f"exec 3<&0; setsid sh -c {quote(WRAPPER)} boxwright {quote(pid_file)} {quote(command)} <&3 3<&- & "
            "p=$!; exec 3<&-; wait $p"
        )
        env = {**handle.env.get(), **(opts.env or {})}
        try:
            process = await handle.start(line, env, map_path(opts.cwd or "", handle.workdir), stdin, pid_file)
        except asyncio.CancelledError:
            # Cancelled while envd started it: the command may run already, its group recorded in the pid file.
            await asyncio.shield(handle.kill_recorded(pid_file))
            raise
        return self.track(process, opts.signal)

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        return await exec_result(await self.spawn(command, opts, stdin=False))


class E2BFs(ShellFs):
    """Reads and writes through envd's file API; the rest through small shell commands."""

    def __init__(self, handle: E2BHandle) -> None:
        super().__init__(handle.plain, handle.workdir)
        self._handle = handle

    async def read_bytes(self, path: str) -> bytes:
        e2b = _sdk()
        target = self.p(path)
        try:
            data = await self._handle.sdk.files.read(target, format="bytes")
        except e2b.NotFoundException as exc:
            raise SandboxCommandError("read", 1, f"{target}: no such file") from exc
        except e2b.SandboxException as exc:
            raise SandboxCommandError("read", 1, f"{target}: {exc}") from exc
        return bytes(data)

    async def write(self, path: str, data: str | bytes) -> None:
        e2b = _sdk()
        target = self.p(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        try:
            await self._handle.sdk.files.write(target, raw, use_octet_stream=True)
        except e2b.SandboxException as exc:
            raise SandboxCommandError("write", 1, f"{target}: {exc}") from exc


class E2BPorts:
    def __init__(self, handle: E2BHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        sdk = self._handle.sdk
        url = f"https://{sdk.get_host(port)}"
        token = getattr(sdk, "traffic_access_token", None)
        # Browsers cannot send this header: keep public traffic on for links a person clicks.
        return channel(url, {TRAFFIC_HEADER: token} if token else None)


class E2BHandle(RemoteHandle):
    provider = NAME
    _provider: E2BProvider

    def __init__(self, provider: E2BProvider, sdk: Any, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.sdk = sdk
        self.id = str(sdk.sandbox_id)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = E2BProcesses(self)
        self.fs = E2BFs(self)
        self.git = ExecGit(self.process)
        self.ports = E2BPorts(self)
        self.destroyed = False

    async def start(self, line: str, env: Mapping[str, str], cwd: str, stdin: bool, pid_file: str | None) -> E2BProcess:
        e2b = _sdk()
        out, err = TextChannel(), TextChannel()
        try:
            sdk_handle = await self.sdk.commands.run(
                line,
                background=True,
                envs=dict(env),
                cwd=cwd,
                stdin=stdin,
                timeout=0,
                on_stdout=out.feed,
                on_stderr=err.feed,
            )
        except (e2b.SandboxNotRunningException, e2b.SandboxNotFoundException) as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone (killed or expired)") from exc
        except e2b.SandboxException as exc:  # envd refused to start it (a missing cwd, ...)
            raise SandboxCommandError("exec", -1, str(exc)) from exc
        return E2BProcess(self, sdk_handle, out, err, pid_file, stdin)

    async def kill_recorded(self, pid_file: str) -> None:
        with contextlib.suppress(Exception):
            await self.plain(script("kill", KILL_SCRIPT, pid_file, "KILL"))

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op, kill script): no group wrapper, no handle env, in the workdir's parent."""
        process = await self.start(line, {}, "/", False, None)
        out, err, code = await asyncio.gather(collect(process.stdout), collect(process.stderr), process.wait())
        return ExecResult(stdout=out, stderr=err, exit_code=code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        e2b = _sdk()
        try:
            info = await self.sdk.create_snapshot()
        except e2b.SandboxNotFoundException as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone (killed or expired)") from exc
        return SnapshotRef(id=str(info.snapshot_id), label=label)

    async def fork(self) -> E2BHandle:
        results = await self.sdk.fork(timeout=self._provider.lifetime_s)
        made = results[0] if results else None
        if made is None or isinstance(made, Exception):
            raise SandboxCommandError("fork", -1, f"E2B did not start the fork: {made!r}")
        return E2BHandle(self._provider, made, self.env.get())


class E2BProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        domain: str | None = None,
        template: str = "base",
        lifetime: float = DEFAULT_LIFETIME,
        on_timeout: Literal["kill", "pause"] = "kill",
        allow_public_traffic: bool = True,
        workdir: str = DEFAULT_WORKDIR,
        metadata: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        request_timeout: float = 60.0,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        http_version: Literal["1.1", "2"] | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.api_key = api_key
        self.domain = domain
        self.template = template
        self.lifetime_s = max(1, int(lifetime))
        self.on_timeout = on_timeout
        self.allow_public_traffic = allow_public_traffic
        self.workdir = workdir.rstrip("/") or "/"
        self.metadata = dict(metadata or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.request_timeout = request_timeout
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.http_version = http_version
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.e2b")
        self.restore_snapshot = self._restore

    def capabilities(self) -> Capabilities:
        return _capabilities(self.on_timeout == "pause")

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"template": self.template, "workdir": self.workdir, "domain": self.domain or os.environ.get(DOMAIN_ENV)}

    def _opts(self) -> dict[str, Any]:
        key = self.api_key or os.environ.get(API_KEY_ENV)
        if not key:
            raise ProviderUnavailableError(NAME, f"no API key ({API_KEY_ENV} is not set)", KEY_HELP)
        opts: dict[str, Any] = {"api_key": key, "request_timeout": self.request_timeout}
        domain = self.domain or os.environ.get(DOMAIN_ENV)
        if domain:
            opts["domain"] = domain
        if self.api_url:
            opts["api_url"] = self.api_url
        if self.sandbox_url:
            opts["sandbox_url"] = self.sandbox_url
        if self.http_version:
            opts["http_version"] = self.http_version
        return opts

    async def create(self, input: CreateInput | None = None) -> E2BHandle:
        input = input or CreateInput()
        return await self._create_from(self.template, input.env, input.network, input.id, input.signal)

    async def _restore(self, input: RestoreInput) -> E2BHandle:
        return await self._create_from(input.snapshot_id, input.env, input.network, None, input.signal)

    async def _create_from(
        self,
        template: str,
        env: Mapping[str, str] | None,
        network: NetworkPolicy | None,
        key: str | None,
        signal: AbortSignal | None,
    ) -> E2BHandle:
        if signal is not None:
            signal.throw_if_aborted()
        e2b = _sdk()
        opts = self._opts()
        internet = True
        if network is not None and network.mode == "deny":
            if network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "E2B's coarse gate can deny all egress, not allow a list of hosts"
                )
            internet = False
        nonce = secrets.token_hex(8)
        metadata = {**ownership(key, self.run_id, self.lease_seconds, self.metadata), NONCE: nonce}
        kwargs: dict[str, Any] = {
            "template": template,
            "timeout": self.lifetime_s,
            "metadata": metadata,
            # Secrets: sandbox envs, stored by E2B for every process; never in a command string.
            "envs": dict(env or {}),
            "allow_internet_access": internet,
        }
        if not self.allow_public_traffic:
            kwargs["network"] = {"allow_public_traffic": False}
        if self.on_timeout == "pause":
            kwargs["lifecycle"] = {"on_timeout": "pause"}

        async def ready(sdk: Any) -> E2BHandle:
            handle = E2BHandle(self, sdk, None)
            await make_workdir(handle.plain, self.workdir)
            return handle

        async def delete(sdk: Any) -> None:
            # Whatever exists is destroyed: the sandbox the create answered, or one whose answer never came.
            if sdk is not None:
                await self.destroy(DestroyInput(id=str(sdk.sandbox_id)))
                return
            for made in await self.list_owned({NONCE: nonce}):
                await self.destroy(DestroyInput(id=made.id))

        creating = e2b.AsyncSandbox.create(**kwargs, **opts)
        return await abortable_create(creating, signal, ready, delete, self.request_timeout)

    async def resume(self, input: ResumeInput) -> E2BHandle | None:
        e2b = _sdk()
        try:
            # connect wakes a paused sandbox and extends the lifetime by the configured amount.
            sdk = await e2b.AsyncSandbox.connect(input.id, timeout=self.lifetime_s, **self._opts())
        except e2b.SandboxNotFoundException:
            return None
        return E2BHandle(self, sdk, None)

    async def destroy(self, input: DestroyInput) -> None:
        e2b = _sdk()
        # False means "not found": already gone is success. Other failures raise for the reaper.
        await e2b.AsyncSandbox.kill(input.id, **self._opts())

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright sandboxes (with every pair of ``labels`` in their metadata too), every page."""
        e2b = _sdk()
        query = e2b.SandboxQuery(metadata={LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})})
        paginator = e2b.AsyncSandbox.list(query=query, **self._opts())
        found: list[OwnedSandbox] = []
        while paginator.has_next:
            found.extend(owned(str(i.sandbox_id), i.metadata or {}) for i in await paginator.next_items())
        return found


def e2b_sandbox(
    *,
    api_key: str | None = None,
    domain: str | None = None,
    template: str = "base",
    lifetime: float = DEFAULT_LIFETIME,
    on_timeout: Literal["kill", "pause"] = "kill",
    allow_public_traffic: bool = True,
    workdir: str = DEFAULT_WORKDIR,
    metadata: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    request_timeout: float = 60.0,
    api_url: str | None = None,
    sandbox_url: str | None = None,
    http_version: Literal["1.1", "2"] | None = None,
    logger: Logger | None = None,
) -> E2BProvider:
    """A provider whose sandboxes are E2B microVMs of ``template``.

    ``lifetime`` (seconds) is how long E2B keeps a sandbox before killing it (or pausing it,
    with ``on_timeout="pause"``); resume extends it again. ``api_url``/``sandbox_url`` point
    the SDK at another control plane and envd (self-hosted deployments, tests).
    """
    return E2BProvider(
        api_key=api_key,
        domain=domain,
        template=template,
        lifetime=lifetime,
        on_timeout=on_timeout,
        allow_public_traffic=allow_public_traffic,
        workdir=workdir,
        metadata=metadata,
        run_id=run_id,
        lease_seconds=lease_seconds,
        request_timeout=request_timeout,
        api_url=api_url,
        sandbox_url=sandbox_url,
        http_version=http_version,
        logger=logger,
    )
