"""boxd: one KVM microVM per sandbox, on the official ``boxd`` SDK (``AsyncBoxd``, extra ``boxd``).

Seed and spec §2.5, point by point:

- Config: ``api_key``/``BOXD_API_KEY`` (or a ready ``token``/``BOXD_TOKEN``), ``org``/``BOXD_ORG``,
  ``base_url``/``BOXD_BASE_URL``, ``vcpu`` 1, 2 or 4 (boxd sets memory from it), ``workdir``
  (``/workspace`` maps to ``/home/boxd/workspace``), ``from_snapshot`` (a golden image made after
  setup), ``auto_suspend_timeout`` and ``auto_destroy_timeout`` (a safety net for abandoned machines).
- Every machine is created ``isolated`` (no boxd CLI, metadata endpoint or org peers in the VM), so
  the API key never reaches the machine.
- Secrets and per-command env: the SDK's exec has no env field (it would prefix ``K=v`` to the
  command string), so the values travel on the command's stdin as one base64 line that a fixed
  loader reads and exports before the command starts. No value is ever part of a command string.
- Processes: ``spawn()`` is a streaming exec with split stdout/stderr and a writable stdin; the
  command leads its own group under ``setsid`` and records it from inside. ``kill()`` runs a
  second command that signals that group, KILLs what is left and checks nothing survived:
  closing the stream alone is not a kill (the process survived it, seed). Hence
  ``killable_processes`` and ``writable_stdin`` are true.
- Snapshot = a boxd snapshot ``<machine>-<label>`` (memory and disk), awaited until restorable;
  restore boots a new machine from it; fork is boxd's live fork; resume by id starts a stopped
  machine and wakes a suspended or hibernated one; a destroyed one resumes as ``None``.
- Ports: the machine's one public URL ``https://<name>.<domain>`` is pointed at the port by
  ``connect`` (public: anyone with the URL reaches it).
- Network deny is refused (no egress deny in the contract's sense): never silently dropped.
- An abort or cancel during create or restore deletes the machine after the current SDK call.
- Every machine carries boxwright's ownership labels (``list_owned`` finds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

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
    LABEL_MANAGED,
    LABEL_OWNER,
    WRAPPER,
    GroupProcess,
    OwnedSandbox,
    RemoteHandle,
    ShellFs,
    SpawnSet,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    env_line,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
    vm_name,
)

NAME = "boxd"
API_KEY_ENV = "BOXD_API_KEY"
TOKEN_ENV = "BOXD_TOKEN"
ORG_ENV = "BOXD_ORG"
BASE_URL_ENV = "BOXD_BASE_URL"
DEFAULT_WORKDIR = "/home/boxd/workspace"
KEY_HELP = f"set {API_KEY_ENV} and {ORG_ENV} (https://boxd.sh) or pass boxd_sandbox(api_key=..., org=...)"
NAME_LIMIT = 48  # boxd's longest machine name
SNAPSHOT_READY = frozenset({"ready", "available", "active"})
SNAPSHOT_FAILED = frozenset({"failed", "error"})
_SNAPSHOT_WAIT = 600.0

# Reads one base64 line of `export K='v'` statements from stdin (values never in argv), then
# starts $2 as the leader of its own group with the rest of stdin (the WRAPPER records the group).
LAUNCH = (
    'IFS= read -r E || exit 125; eval "$(printf %s "$E" | base64 -d)"; unset E; '
    'exec 3<&0; setsid sh -c "$W" boxwright "$1" "$2" <&3 3<&- & p=$!; exec 3<&-; wait $p'
)


def _sdk() -> Any:
    return import_sdk(NAME, "boxd", "boxd", "boxd")


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=True,  # the streaming exec's stdin, half-closable (write_eof)
        killable_processes=True,  # setsid group + in-VM group kill + survivor check; measured by the seed
        snapshots=True,
        network_policy=False,
        durable_filesystem=True,  # the disk survives stop, suspend and hibernate
        fork=True,
    )


class _Stdin:
    def __init__(self, process: BoxdProcess) -> None:
        self._process = process
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        if self._ended:
            raise ProcessExitedError(self._process.pid, "stdin was already ended (closed)")
        if self._process.exited:
            raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed")
        await self._process.stream.write(data)

    async def end(self) -> None:
        if not self._ended:
            self._ended = True
            with contextlib.suppress(Exception):
                await self._process.stream.write_eof()


class BoxdProcess(GroupProcess):
    """``SpawnHandle`` over one streaming exec; ``kill`` signals the recorded group inside the VM."""

    def __init__(self, handle: BoxdHandle, stream: Any, pid_file: str) -> None:
        super().__init__(handle, pid_file)
        self._handle = handle
        self.stream = stream
        # pid -1: the group id lives in the VM's pid file; the stream reports none
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = _Stdin(self)
        self.watch(self._pump())

    async def _pump(self) -> int:
        import codecs

        boxd = _sdk()
        decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(2)]
        try:
            async for chunk in self.stream.iter_chunks():
                index = 1 if chunk.is_stderr else 0
                (self.stderr if index else self.stdout).feed(decoders[index].decode(chunk.data))
            code = self.stream.exit_code
            return int(code) if code is not None and code >= 0 else 128 + 9
        except boxd.NotFoundError as exc:
            if self._handle.destroyed:
                return 128 + 9
            raise SandboxNotFoundError(NAME, self._handle.id, "is gone") from exc
        except boxd.BoxdError:
            if self._handle.destroyed:
                return 128 + 9  # the machine went with destroy(): its processes were killed
            raise
        finally:
            self.stdout.feed(decoders[0].decode(b"", final=True))
            self.stderr.feed(decoders[1].decode(b"", final=True))
            self.stdout.close()
            self.stderr.close()

    async def after_kill(self) -> None:
        with contextlib.suppress(Exception):
            await self.stream.close()


class BoxdProcesses(SpawnSet[BoxdProcess]):
    _handle: BoxdHandle
    end_stdin = True  # the bidi call's stdin stays open until ended: a command reading it would wait

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> BoxdProcess:
        opts = self.started(opts)
        handle = self._handle
        pid_file = f"/dev/shm/.boxwright-boxd-{uuid.uuid4().hex}.pid"
        cwd = map_path(opts.cwd or "", handle.workdir)
        line = f"cd {quote(cwd)} && sh -c {quote(LAUNCH)} boxwright {quote(pid_file)} {quote(command)}"
        values = {**handle.env.get(), **(opts.env or {}), "W": WRAPPER}
        stream = handle.client.machines.stream_exec(handle.id, command=line)
        await stream.__aenter__()  # opens the bidi call, so stdin can be written
        await stream.write(env_line(values))
        return self.track(BoxdProcess(handle, stream, pid_file), opts.signal)


class BoxdPorts:
    def __init__(self, handle: BoxdHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        machines = self._handle.client.machines
        await machines.proxies.set_port(self._handle.name, port)
        machine = await machines.get(self._handle.id)
        if not machine.access.url:
            raise SandboxCommandError("ports", -1, f"boxd reported no public URL for {self._handle.name}")
        return channel(machine.access.url)  # public: anyone with the URL reaches the port


class BoxdHandle(RemoteHandle):
    provider = NAME
    _provider: BoxdProvider

    def __init__(self, provider: BoxdProvider, machine: Any, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.client = provider.client()
        self.id = str(machine.id)
        self.name = str(machine.name)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = BoxdProcesses(self)
        self.fs = ShellFs(self.plain, self.workdir)
        self.git = ExecGit(self.process)
        self.ports = BoxdPorts(self)
        self.destroyed = False

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op, kill script): no wrapper, no handle env."""
        boxd = _sdk()
        try:
            result = await self.client.machines.exec(self.id, line, timeout=120)
        except boxd.NotFoundError as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone") from exc
        return ExecResult(stdout=str(result.stdout), stderr=str(result.stderr), exit_code=int(result.exit_code))

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        tag = re.sub(r"[^a-z0-9-]", "-", (label or "snap").lower()).strip("-") or "snap"
        name = f"{self.name}-{tag}-{uuid.uuid4().hex[:6]}"
        snapshots = self.client.snapshots
        await snapshots.create(self.id, name)
        deadline = time.monotonic() + _SNAPSHOT_WAIT
        while True:  # memory and disk are written out first: wait until it can be restored
            info = await snapshots.get(name)
            status = str(info.status).lower()
            if status in SNAPSHOT_READY:
                return SnapshotRef(id=name, label=label)
            if status in SNAPSHOT_FAILED or time.monotonic() > deadline:
                raise SandboxCommandError("snapshot", -1, f"boxd snapshot {name} is {status}")
            await asyncio.sleep(0.5)

    async def fork(self) -> BoxdHandle:
        made = await self.client.machines.fork(self.id, vm_name(None, NAME_LIMIT), isolated=True)
        await self.client.machines.wait_until_ready(made.id)
        return BoxdHandle(self._provider, made, self.env.get())


class BoxdProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        token: str | None = None,
        org: str | None = None,
        base_url: str | None = None,
        vcpu: int | None = None,
        workdir: str = DEFAULT_WORKDIR,
        from_snapshot: str | None = None,
        auto_suspend_timeout: int | None = None,
        auto_destroy_timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        logger: Logger | None = None,
    ) -> None:
        if vcpu is not None and vcpu not in (1, 2, 4):
            raise ValueError(f"boxd vcpu is 1, 2 or 4 (memory 4, 8 or 16 GiB), got {vcpu!r}")
        self.api_key = api_key
        self.token = token
        self.org = org
        self.base_url = base_url
        self.vcpu = vcpu
        self.workdir = workdir.rstrip("/") or "/"
        self.from_snapshot = from_snapshot
        self.auto_suspend_timeout = auto_suspend_timeout
        self.auto_destroy_timeout = auto_destroy_timeout
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.boxd")
        self.restore_snapshot = self._restore
        self._clients: dict[int, Any] = {}

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"vcpu": self.vcpu, "workdir": self.workdir, "from_snapshot": self.from_snapshot}

    def client(self) -> Any:
        """One SDK client per event loop (a gRPC channel belongs to the loop that made it)."""
        boxd = _sdk()
        loop = id(asyncio.get_running_loop())
        made = self._clients.get(loop)
        if made is None:
            key = self.api_key or os.environ.get(API_KEY_ENV)
            token = self.token or os.environ.get(TOKEN_ENV)
            if not key and not token:
                raise ProviderUnavailableError(NAME, f"no API key ({API_KEY_ENV} is not set)", KEY_HELP)
            made = boxd.AsyncBoxd(api_key=key, token=token, base_url=self.base_url or os.environ.get(BASE_URL_ENV))
            self._clients = {loop: made}
        return made

    def _org(self) -> str | None:
        return self.org or os.environ.get(ORG_ENV)

    async def create(self, input: CreateInput | None = None) -> BoxdHandle:
        input = input or CreateInput()
        return await self._create_from(self.from_snapshot, input.env, input.network, input.id, input)

    async def _restore(self, input: RestoreInput) -> BoxdHandle:
        return await self._create_from(input.snapshot_id, input.env, input.network, None, input)

    async def _create_from(
        self,
        snapshot: str | None,
        env: Mapping[str, str] | None,
        network: NetworkPolicy | None,
        key: str | None,
        input: CreateInput | RestoreInput,
    ) -> BoxdHandle:
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        if network is not None and (network.mode == "deny" or network.allow_hosts):
            raise UnsupportedCapabilityError(
                NAME, "network_policy", "boxd machines keep their egress; leave the network capability unset"
            )
        client = self.client()
        name = vm_name(key, NAME_LIMIT)
        kwargs: dict[str, Any] = {
            "org": self._org(),
            "labels": ownership(key, self.run_id, self.lease_seconds, self.labels),
            "vcpu": self.vcpu,
            "auto_suspend_timeout": self.auto_suspend_timeout,
            "auto_destroy_timeout": self.auto_destroy_timeout,
            "isolated": True,  # no CLI, metadata endpoint or org peers: the key never reaches the VM
        }
        if snapshot:
            kwargs["from_snapshot"] = snapshot

        async def ready(machine: Any) -> BoxdHandle:
            await client.machines.wait_until_ready(machine.id)
            handle = BoxdHandle(self, machine, env)
            await make_workdir(handle.plain, self.workdir)
            return handle

        async def delete(machine: Any) -> None:
            await self.destroy(DestroyInput(id=str(machine.id) if machine is not None else name))

        # The machine is deleted after the current SDK call answered (seed): by its id, else its name.
        return await abortable_create(client.machines.create(name, **kwargs), signal, ready, delete)

    async def resume(self, input: ResumeInput) -> BoxdHandle | None:
        boxd = _sdk()
        machines = self.client().machines
        try:
            machine = await machines.get(input.id)
        except boxd.NotFoundError:
            return None
        status = str(machine.status).lower()
        if status in ("destroyed", "destroying", "deleted", "failed"):
            return None
        if status == "stopped":
            await machines.start(machine.id)
        elif status in ("suspended", "paused"):
            await machines.resume(machine.id)
        elif status == "hibernated":
            await machines.wake(machine.id)
        if status != "running":
            machine = await machines.wait_until_ready(machine.id)
        return BoxdHandle(self, machine, None)

    async def destroy(self, input: DestroyInput) -> None:
        boxd = _sdk()
        try:
            await self.client().machines.delete(input.id)
        except boxd.NotFoundError:
            return  # already gone is success; other failures raise for the reaper

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright machines (with every pair of ``labels`` too), for ``boxwright reap``."""
        want = {LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})}
        machines = await self.client().machines.list(org=self._org(), labels=want)
        return [owned(str(m.id), m.labels or {}) for m in machines]


def boxd_sandbox(
    *,
    api_key: str | None = None,
    token: str | None = None,
    org: str | None = None,
    base_url: str | None = None,
    vcpu: int | None = None,
    workdir: str = DEFAULT_WORKDIR,
    from_snapshot: str | None = None,
    auto_suspend_timeout: int | None = None,
    auto_destroy_timeout: int | None = None,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    logger: Logger | None = None,
) -> BoxdProvider:
    """A provider whose sandboxes are isolated boxd machines.

    ``vcpu`` is 1, 2 or 4 (the org's default size when unset); ``from_snapshot`` boots every
    new machine from a snapshot made after setup (it then sets the size). A machine stays
    until destroyed: set ``auto_destroy_timeout`` (seconds) as a safety net.
    """
    return BoxdProvider(
        api_key=api_key,
        token=token,
        org=org,
        base_url=base_url,
        vcpu=vcpu,
        workdir=workdir,
        from_snapshot=from_snapshot,
        auto_suspend_timeout=auto_suspend_timeout,
        auto_destroy_timeout=auto_destroy_timeout,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        logger=logger,
    )
