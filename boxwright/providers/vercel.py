"""Vercel Sandbox: a managed microVM per sandbox, on Vercel's official ``vercel-sandbox`` SDK (``vercel.sandbox``).

Why ``vercel-sandbox`` and not the umbrella ``vercel`` package: ``vercel`` 0.12.1 pins
``websockets<17`` (for its other services), and installing it beside boxwright's dev extra
downgrades the environment's websockets 17.4 to 16.1.1. The sandbox SDK itself
(``vercel-sandbox`` 0.10.0, which ``vercel`` depends on and re-exports) pins no websockets, so
the extra takes it alone and nothing else moves.

Seed and spec §2.5, point by point:

- Config: ``token``/``VERCEL_TOKEN``, ``team_id``/``VERCEL_TEAM_ID``, ``project_id``/
  ``VERCEL_PROJECT_ID`` (all three needed), ``api_url`` for another API, ``image`` (the
  seed's TypeScript ``runtime``; this SDK picks the base as a Vercel Container Registry image
  reference, the service's default when unset), ``ports`` to expose, ``execution_time_limit`` (seconds),
  ``vcpus``, ``workdir`` (``/workspace`` maps to ``/vercel/sandbox``, Vercel's working dir).
- Secrets and per-command env go in each command's ``env`` (a JSON request body field), never
  in a command string and never in the sandbox's own configuration, which its snapshots keep.
- Lifetime: sandboxes are persistent, so the filesystem outlives a session (a session ends at
  ``execution_time_limit`` or when stopped); resume by name starts a new session on the same
  filesystem. A deleted or missing sandbox resumes as ``None``; auth and transport errors raise.
- Processes: detached commands; the streams are the command's log stream. Each command leads
  its own group under ``setsid`` and records it in a pid file; ``kill()`` signals that group
  inside the sandbox, KILLs what is left, and falls back to the SDK's server-side
  ``Command.kill`` if the command still runs. The fake signals only the command's own pid on
  ``Command.kill``, and there a ``sh -c`` left its child holding the log stream open, so the
  in-sandbox group kill is what ends a command. Against a real sandbox neither is measured,
  so ``killable_processes`` stays ``false`` (the seed); ``writable_stdin`` is ``false`` (the seed).
- Ports: exposed-port domains, declared at create (``ports=[...]``): ``connect`` of another
  port raises. The domains are public.
- Snapshots and fork are not offered (not in the seed's Vercel section: unstated is ``false``).
- Network deny is refused (the seed states no egress control for Vercel): never silently dropped.
- An abort or cancel during create deletes the sandbox once the create call answered.
- Every sandbox carries boxwright's ownership tags (``list_owned`` finds them across pages).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..errors import (
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
    DEFAULT_LEASE,
    LABEL_MANAGED,
    LABEL_OWNER,
    WRAPPER,
    GroupProcess,
    NoStdin,
    OwnedSandbox,
    RemoteHandle,
    ShellFs,
    SpawnSet,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    exec_result,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
    vm_name,
)

NAME = "vercel"
TOKEN_ENV = "VERCEL_TOKEN"
TEAM_ENV = "VERCEL_TEAM_ID"
PROJECT_ENV = "VERCEL_PROJECT_ID"
DEFAULT_WORKDIR = "/vercel/sandbox"
KEY_HELP = (
    f"set {TOKEN_ENV}, {TEAM_ENV} and {PROJECT_ENV} (vercel.com account settings) or pass "
    "vercel_sandbox(token=..., team_id=..., project_id=...)"
)

# $1 the WRAPPER, $2 its pid file, $3 the command: the wrapper leads a new group (a background job
# of a non-interactive sh is no group leader, so setsid does not fork) and records it in $2;
# waiting here turns a signal death into 128 + N.
LAUNCH = 'setsid sh -c "$1" boxwright "$2" "$3" & p=$!; wait $p'


def _sdk() -> Any:
    return import_sdk(NAME, "vercel.sandbox", "vercel-sandbox", "vercel")


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=False,  # seed
        killable_processes=False,  # seed: the server kill reaching a forked child is unmeasured
        snapshots=False,
        network_policy=False,
        durable_filesystem=True,  # persistent sandboxes keep their filesystem across sessions
        fork=False,
    )


def _gone(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (404, 410)


class VercelProcess(GroupProcess):
    """``SpawnHandle`` over one detached command: the group kill in the sandbox, then the SDK's server-side kill."""

    def __init__(self, handle: VercelHandle, command: Any, pid_file: str | None) -> None:
        super().__init__(handle, pid_file)
        self._handle = handle
        self._command = command
        # pid -1: Vercel reports a command id, not a pid
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = NoStdin(NAME)  # seed
        self._pumps = [
            asyncio.ensure_future(self._pump(command.stdout, self.stdout)),
            asyncio.ensure_future(self._pump(command.stderr, self.stderr)),
        ]
        self.watch(self._wait())

    async def _pump(self, reader: Any, into: TextChannel) -> None:
        import anyio

        try:
            while True:
                try:
                    chunk = await reader.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                into.feed(chunk)
        except Exception:
            if not self._handle.destroyed:
                raise
        finally:
            into.close()

    async def _wait(self) -> int:
        try:
            code = int(await self._command.wait())
        except Exception as exc:
            if self._handle.destroyed or _gone(exc):
                code = 128 + 9  # the sandbox went (destroy or stop): its processes were killed
            else:
                for pump in self._pumps:
                    pump.cancel()
                raise
        # The log stream ends after the exit; wait for it, so the streams hold all the output.
        await asyncio.gather(*self._pumps, return_exceptions=True)
        return code

    async def _do_kill(self, sig: int | None) -> None:
        if self._pid_file is not None:
            await super()._do_kill(sig)  # the group kill; after_kill when no exit came
        elif not self.exited:
            await self.after_kill()  # a helper command leads no recorded group

    async def after_kill(self) -> None:
        try:
            await self._command.kill()  # the server-side kill, what is left to try
        except Exception as exc:
            if not self.exited and not _gone(exc):
                self._handle.warn("the server-side kill failed", {"error": repr(exc)})
        await self.confirm_exit()
        if not self.exited:
            self._handle.warn("the killed command did not end; a child of it may still run", {})


class VercelProcesses(SpawnSet[VercelProcess]):
    _handle: VercelHandle

    async def spawn(self, command: str, opts: ProcessOptions | None = None, *, plain: bool = False) -> VercelProcess:
        opts = self.started(opts)
        handle = self._handle
        env = {} if plain else {**handle.env.get(), **(opts.env or {})}
        pid_file = None if plain else f"/dev/shm/.boxwright-vercel-{uuid.uuid4().hex}.pid"
        args = ["-c", command] if pid_file is None else ["-c", LAUNCH, "boxwright", WRAPPER, pid_file, command]
        try:
            made = await handle.sandbox.create_process(
                "sh", args, cwd=map_path(opts.cwd or "", handle.workdir), env=env or None
            )
        except Exception as exc:
            if _gone(exc):
                raise SandboxNotFoundError(NAME, handle.id, "is gone") from exc
            if isinstance(exc, _sdk().SandboxApiError):  # refused to start (a missing cwd, ...)
                raise SandboxCommandError("spawn", -1, f"Vercel refused the command: {exc}") from exc
            raise
        return self.track(VercelProcess(handle, made, pid_file), opts.signal)


class VercelPorts:
    def __init__(self, handle: VercelHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        for route in self._handle.sandbox.routes:
            if int(route.port) == port:
                return channel(str(route.url))  # an exposed-port domain: public
        declared = ", ".join(str(r.port) for r in self._handle.sandbox.routes) or "none"
        raise UnsupportedCapabilityError(
            NAME, "ports", f"port {port} is not exposed (declared: {declared}); pass vercel_sandbox(ports=[...])"
        )


class VercelHandle(RemoteHandle):
    provider = NAME
    process: VercelProcesses

    def __init__(self, provider: VercelProvider, sandbox: Any, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.sandbox = sandbox
        self.id = str(sandbox.name)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = VercelProcesses(self)
        self.fs = ShellFs(self.plain, self.workdir)
        self.git = ExecGit(self.process)
        self.ports = VercelPorts(self)
        self.destroyed = False

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op): no handle env (its values stay off helper commands)."""
        return await exec_result(await self.process.spawn(line, plain=True))

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshots", "boxwright keeps Vercel sandboxes by persistence")

    async def fork(self) -> VercelHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "boxwright does not fork Vercel sandboxes")


class VercelProvider:
    name = NAME

    def __init__(
        self,
        *,
        token: str | None = None,
        team_id: str | None = None,
        project_id: str | None = None,
        api_url: str | None = None,
        image: str | None = None,
        ports: Sequence[int] = (),
        execution_time_limit: float | None = None,
        vcpus: int | None = None,
        workdir: str = DEFAULT_WORKDIR,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        logger: Logger | None = None,
    ) -> None:
        for port in ports:
            check_port(port)
        self.token = token
        self.team_id = team_id
        self.project_id = project_id
        self.api_url = api_url
        self.image = image
        self.ports = list(ports)
        self.execution_time_limit = execution_time_limit
        self.vcpus = vcpus
        self.workdir = workdir.rstrip("/") or "/"
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.vercel")
        self.restore_snapshot = None
        self._session: Any = None

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"image": self.image, "ports": self.ports, "vcpus": self.vcpus, "workdir": self.workdir}

    def _credentials(self) -> tuple[str, str, str]:
        token = self.token or os.environ.get(TOKEN_ENV)
        team = self.team_id or os.environ.get(TEAM_ENV)
        project = self.project_id or os.environ.get(PROJECT_ENV)
        missing = [n for n, v in ((TOKEN_ENV, token), (TEAM_ENV, team), (PROJECT_ENV, project)) if not v]
        if missing:
            raise ProviderUnavailableError(NAME, f"{' and '.join(missing)} not set", KEY_HELP)
        assert token and team and project
        return token, team, project

    @contextlib.contextmanager
    def _bound(self) -> Iterator[Any]:
        """The SDK reads its configuration from an active session (a context variable): bind ours."""
        _sdk()
        from vercel._internal.core.session import (  # type: ignore[import-not-found,unused-ignore]
            SdkSession,
            bind_active_session,
            reset_active_session,
        )
        from vercel.sandbox._internal.options import (  # type: ignore[import-not-found,unused-ignore]
            SandboxCredentials,
            SandboxServiceOptions,
        )

        if self._session is None:
            token, team, project = self._credentials()

            async def credentials() -> Any:
                return SandboxCredentials(token=token, team_id=team, project_id=project)

            options = SandboxServiceOptions(base_url=self.api_url, credentials_factory=credentials)
            self._session = SdkSession(service_options={options.service_options_key(): options})
        bound = bind_active_session(self._session)
        try:
            yield self._session
        finally:
            reset_active_session(bound)

    async def create(self, input: CreateInput | None = None) -> VercelHandle:
        input = input or CreateInput()
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        network = input.network
        if network is not None and (network.mode == "deny" or network.allow_hosts):
            raise UnsupportedCapabilityError(
                NAME, "network_policy", "boxwright does not set a Vercel sandbox's egress; leave the network unset"
            )
        sdk = _sdk()
        name = vm_name(input.id)
        kwargs: dict[str, Any] = {
            "name": name,
            "ports": self.ports or None,
            "persistent": True,
            "tags": ownership(input.id, self.run_id, self.lease_seconds, self.labels),
        }
        if self.execution_time_limit is not None:
            kwargs["execution_time_limit"] = timedelta(seconds=self.execution_time_limit)
        if self.vcpus is not None:
            kwargs["resources"] = sdk.SandboxResources(vcpus=self.vcpus)
        if self.image is not None:
            kwargs["image"] = self.image
        with self._bound():
            operation = sdk.create_sandbox(**kwargs)

        async def ready(sandbox: Any) -> VercelHandle:
            handle = VercelHandle(self, sandbox, input.env)
            await make_workdir(handle.plain, self.workdir)
            return handle

        # The sandbox is deleted once the create call answered (it may exist by then).
        return await abortable_create(operation, signal, ready, lambda _: self.destroy(DestroyInput(id=name)))

    async def resume(self, input: ResumeInput) -> VercelHandle | None:
        sdk = _sdk()
        try:
            with self._bound():
                sandbox = await sdk.resume_sandbox(name=input.id)
        except sdk.SandboxApiError as exc:
            if exc.status_code == 404:
                return None  # deleted or never made; auth and transport errors raise
            raise
        return VercelHandle(self, sandbox, None)

    async def destroy(self, input: DestroyInput) -> None:
        sdk = _sdk()
        try:
            with self._bound():
                sandbox = await sdk.get_sandbox(name=input.id)
            await sandbox.destroy()
        except sdk.SandboxApiError as exc:
            if exc.status_code == 404:
                return  # already gone is success; other failures raise for the reaper
            raise

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright sandboxes by name (with every pair of ``labels`` too), every page."""
        sdk = _sdk()
        want = {LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})}
        query = sdk.SandboxQueryByCreatedAt(tag=sdk.TagFilter(key=LABEL_OWNER, value=owner_id()))
        found: list[OwnedSandbox] = []
        with self._bound():
            pages = sdk.query_sandboxes(query=query)
        async for sandbox in pages:
            tags = dict(sandbox.tags or {})
            if all(tags.get(k) == v for k, v in want.items()):
                found.append(owned(str(sandbox.name), tags))
        return found


def vercel_sandbox(
    *,
    token: str | None = None,
    team_id: str | None = None,
    project_id: str | None = None,
    api_url: str | None = None,
    image: str | None = None,
    ports: Sequence[int] = (),
    execution_time_limit: float | None = None,
    vcpus: int | None = None,
    workdir: str = DEFAULT_WORKDIR,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    logger: Logger | None = None,
) -> VercelProvider:
    """A provider whose sandboxes are Vercel Sandboxes (persistent microVMs).

    ``image`` picks the base (the service's default when unset); ``ports`` are exposed as
    public domains at create (``ports.connect`` of another port raises);
    ``execution_time_limit`` (seconds) ends a session, the filesystem stays for a resume.
    """
    return VercelProvider(
        token=token,
        team_id=team_id,
        project_id=project_id,
        api_url=api_url,
        image=image,
        ports=ports,
        execution_time_limit=execution_time_limit,
        vcpus=vcpus,
        workdir=workdir,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        logger=logger,
    )
