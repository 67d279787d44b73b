"""Blaxel: one managed cloud VM per sandbox, on the official ``blaxel`` SDK (``SandboxInstance``; extra ``blaxel``).

Seed and spec §2.5, point by point:

- Config: ``api_key``/``BL_API_KEY`` and ``workspace``/``BL_WORKSPACE`` (without a key the SDK's
  own login or client credentials), ``image`` (``blaxel/base-image:latest``), ``memory`` (2048 MB),
  ``region``/``BL_REGION`` (also silences the SDK's region warning), ``ttl`` (``"1h"``: an
  abandoned run cannot leave a paid sandbox running; ``None`` = unmanaged), ``public_previews``.
- Auth is global to the process in the SDK, so the first provider binds the workspace and a
  later one asking for another workspace is refused (it would silently act on the first).
- Secrets and per-command env travel in each process request's ``env``, never in a command
  string and never in the sandbox spec (what the dashboard shows).
- Lifetime and resume: resume by name; deleting, deactivating, failed and terminated records
  are gone (``None``: Blaxel keeps a destroyed record for a while); ``DEACTIVATED`` resumes
  (idle suspend keeps the filesystem). Snapshots and fork are ``False`` (a source-scoped private
  preview the framework cannot rely on), so ``restore_snapshot`` is ``None``.
- Processes: every command runs under a Bash supervisor that starts it as the leader of its own
  process group (``setsid``), records that group and relays stdout and stderr as labelled base64
  records on one stream (also across the SDK's keepalives); each stream is capped at 8 MiB, past
  which the group is killed and the command fails. ``kill()`` signals the recorded group from a
  second command in the VM, then KILLs what is left. Hence ``killable_processes=True``;
  ``writable_stdin`` is ``False`` (seed).
- Ports: a preview per port; private by default, so the channel carries a preview token and the
  ``X-Blaxel-Preview-Token`` header; ``public_previews=True`` gives URLs with no auth.
- Network deny is refused (``network_policy=False``): never silently dropped.
- ``/workspace`` maps to ``workdir`` (``/blaxel/workspace``); lstat needs GNU ``stat``.
- Every sandbox carries boxwright's ownership labels (``list_owned`` reads every page).
- An abort or cancel during create deletes the sandbox once the create call answered.

Not done here: the SDK's native ``fs.watch`` (``watch`` is ``None``, so the framework polls).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import os
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
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
    NetworkPolicy,
    ProcessOptions,
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
    NoStdin,
    OwnedSandbox,
    RemoteHandle,
    ShellFs,
    SpawnSet,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
)

NAME = "blaxel"
API_KEY_ENV = "BL_API_KEY"
WORKSPACE_ENV = "BL_WORKSPACE"
REGION_ENV = "BL_REGION"
DEFAULT_IMAGE = "blaxel/base-image:latest"
DEFAULT_MEMORY = 2048
DEFAULT_TTL = "1h"
DEFAULT_WORKDIR = "/blaxel/workspace"
PREVIEW_HEADER = "X-Blaxel-Preview-Token"
OUTPUT_LIMIT = 8 * 1024 * 1024
KEY_HELP = f"set {API_KEY_ENV} and {WORKSPACE_ENV} (https://app.blaxel.ai), run `bl login`, or pass blaxel_sandbox(...)"
# Teardown states of a destroyed sandbox: Blaxel keeps the record a while before purging it.
GONE_STATUSES = frozenset({"DELETING", "DEACTIVATING", "FAILED", "TERMINATED"})
_PREVIEW_TOKEN_TTL = timedelta(hours=1)
_RECORD = re.compile(r"([OEXL]):([A-Za-z0-9+/=]*)\.")

# The supervisor ($1 pid file, $2 command, $3 byte cap per stream). The command leads its own
# group (setsid does not fork: a background job of a non-interactive bash leads no group) and
# records it from inside (WRAPPER). Two pumps read its stdout/stderr FIFOs in 3000-byte reads and
# print one labelled base64 record per read: a record stays under PIPE_BUF, so the two pumps'
# lines never interleave. A stream past the cap kills the group (L record). X is the exit code.
SUPERVISOR = r"""d=$(mktemp -d /dev/shm/.boxwright-bl-XXXXXX) || exit 125
mkfifo "$d/o" "$d/e" || { rm -rf "$d"; exit 125; }
setsid sh -c "$W" boxwright "$1" "$2" >"$d/o" 2>"$d/e" </dev/null &
p=$!
pump() { n=0; while c=$(dd bs=3000 count=1 status=none | base64 -w0) && [ -n "$c" ]; do
  n=$((n + ${#c} * 3 / 4))
  if [ "$n" -gt "$3" ]; then printf '%s:.\n' L; kill -KILL -- "-$p" 2>/dev/null; cat >/dev/null; return; fi
  printf '%s:%s.\n' "$4" "$c"; done; }
pump "$1" "$2" "$3" O <"$d/o" &
a=$!
pump "$1" "$2" "$3" E <"$d/e" &
b=$!
wait "$p"; c=$?
wait "$a" "$b"
rm -rf "$d"
printf 'X:%s.\n' "$c"
"""


def _sdk() -> Any:
    return import_sdk(NAME, "blaxel.core", "blaxel", "blaxel")


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=False,  # seed: the supervisor's command reads /dev/null
        killable_processes=True,  # setsid group + in-VM group kill; J7/J8 against the fake's process model
        snapshots=False,  # source-scoped private preview, no entitlement probe (seed)
        network_policy=False,  # no egress deny: a deny is refused at create
        durable_filesystem=True,  # idle suspend keeps the filesystem for the sandbox's life
        fork=False,
    )


# -- process-global auth -------------------------------------------------------------------------

_bound: dict[str, str | None] = {}


def _bind(api_key: str | None, workspace: str | None, api_url: str | None) -> str:
    """Point the SDK's global client at these credentials once; a different workspace later is refused."""
    _sdk()
    from blaxel.core.authentication.apikey import ApiKey
    from blaxel.core.authentication.types import CredentialsType, MissingCredentials
    from blaxel.core.client import client
    from blaxel.core.common.settings import settings

    key = api_key or os.environ.get(API_KEY_ENV)
    wanted = workspace or os.environ.get(WORKSPACE_ENV)
    if "workspace" in _bound:
        if wanted and wanted != _bound["workspace"]:
            raise ProviderUnavailableError(
                NAME,
                f"this process already uses Blaxel workspace {_bound['workspace']!r}; the SDK's auth is global, "
                f"so a provider for workspace {wanted!r} cannot run beside it",
                "use one Blaxel workspace per process",
            )
        if api_url and api_url != _bound["api_url"]:
            raise ProviderUnavailableError(NAME, "this process already uses another Blaxel API URL", None)
        return str(_bound["workspace"])
    if key:
        if not wanted:
            raise ProviderUnavailableError(
                NAME, f"an API key needs its workspace ({WORKSPACE_ENV} is not set)", KEY_HELP
            )
        settings.auth = ApiKey(CredentialsType(api_key=key, workspace=wanted), wanted, settings.base_url)
    elif isinstance(settings.auth, MissingCredentials):
        raise ProviderUnavailableError(NAME, f"no credentials ({API_KEY_ENV} is not set, no `bl login`)", KEY_HELP)
    resolved = settings.auth.workspace_name
    if wanted and resolved != wanted:
        raise ProviderUnavailableError(
            NAME, f"the Blaxel login is for workspace {resolved!r}, not the requested {wanted!r}", KEY_HELP
        )
    client.with_auth(settings.auth)
    if api_url:
        client.with_base_url(api_url)
    _bound["workspace"] = resolved
    _bound["api_url"] = api_url
    return str(resolved)


def _status(error: Exception) -> int | None:
    code = getattr(error, "status_code", None)
    return code if isinstance(code, int) else None


def sandbox_name(key: str | None) -> str:
    """A Blaxel name (lowercase letters, digits, single hyphens, <= 49 chars) for a sandbox key."""
    if not key:
        return f"bw-{uuid.uuid4().hex[:20]}"
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", key.lower())).strip("-")
    return (name or "bw")[:49].rstrip("-")


# -- processes -----------------------------------------------------------------------------------


class BlaxelProcess(GroupProcess):
    """``SpawnHandle`` over one supervised command: records decoded into text, kill by recorded group."""

    def __init__(self, handle: BlaxelHandle, pid_file: str) -> None:
        super().__init__(handle, pid_file)
        self._handle = handle
        # pid -1: the group id lives in the VM; the contract's pid is the SDK's, which has none here
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = NoStdin(NAME)
        self._decoders = {
            "O": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "E": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self._buffer = ""
        self._code: int | None = None
        self._over = False
        self.watch(asyncio.get_running_loop().create_future())

    def feed(self, text: str) -> None:
        """One ``on_stdout`` delivery of the SDK: any slice of the supervisor's record lines."""
        self._buffer += text
        end = 0
        for match in _RECORD.finditer(self._buffer):
            end = match.end()
            kind, data = match.group(1), match.group(2)
            if kind == "X":
                self._code = int(data) if data.isdigit() else None
            elif kind == "L":
                self._over = True
            else:
                chunk = self._decoders[kind].decode(base64.b64decode(data))
                (self.stdout if kind == "O" else self.stderr).feed(chunk)
        self._buffer = self._buffer[end:]

    def finish(self, code: int | None, error: BaseException | None) -> None:
        for kind, stream in (("O", self.stdout), ("E", self.stderr)):
            stream.feed(self._decoders[kind].decode(b"", final=True))
        if self._over:
            limit = self._handle.output_limit
            self.stderr.feed(f"\nboxwright: an output stream passed {limit} bytes; the command was killed\n")
        self.stdout.close()
        self.stderr.close()
        if self._exit.done():
            return
        final = self._code if self._code is not None else code
        if final is None:
            if self._handle.destroyed:
                final = 128 + 9  # the VM went with destroy(): its processes were killed
            else:
                self._exit.set_exception(
                    SandboxCommandError("exec", -1, f"the command's stream ended without an exit code: {error!r}")
                )
                return
        self._exit.set_result(final)


class BlaxelProcesses(SpawnSet[BlaxelProcess]):
    _handle: BlaxelHandle

    def __init__(self, handle: BlaxelHandle) -> None:
        super().__init__(handle)
        self._tasks: set[asyncio.Task[None]] = set()

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> BlaxelProcess:
        opts = self.started(opts)
        handle = self._handle
        pid_file = f"/dev/shm/.boxwright-bl-{uuid.uuid4().hex}.pid"
        process = BlaxelProcess(handle, pid_file)
        # `W` carries the wrapper so the supervisor's text stays free of values.
        env = {**handle.env.get(), **(opts.env or {}), "W": WRAPPER}
        limit = handle.output_limit
        line = f"bash -c {quote(SUPERVISOR)} boxwright {quote(pid_file)} {quote(command)} {limit}"
        request = {
            "command": line,
            "env": env,
            "working_dir": map_path(opts.cwd or "", handle.workdir),
            "wait_for_completion": True,
            "on_stdout": process.feed,
        }
        task = asyncio.ensure_future(self._run(process, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return self.track(process, opts.signal)

    async def _run(self, process: BlaxelProcess, request: dict[str, Any]) -> None:
        code: int | None = None
        error: BaseException | None = None
        try:
            result = await self._handle.sdk.process.exec(request)
            exit_code = getattr(result, "exit_code", None)
            code = exit_code if isinstance(exit_code, int) else None
        except Exception as exc:
            error = exc
        finally:
            process.finish(code, error)


class BlaxelPorts:
    def __init__(self, handle: BlaxelHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        public = self._handle.public_previews
        preview = await self._handle.sdk.previews.create_if_not_exists(
            {"port": port, "public": public, "name": f"boxwright-{port}"}
        )
        if public:
            return channel(preview.url)
        token = await preview.tokens.create(datetime.now(UTC) + _PREVIEW_TOKEN_TTL)
        # Browsers cannot send the header: pass public_previews=True for links a person clicks.
        return channel(preview.url, {PREVIEW_HEADER: token.value}, token=token.value)


class BlaxelHandle(RemoteHandle):
    provider = NAME
    _provider: BlaxelProvider

    def __init__(self, provider: BlaxelProvider, sdk: Any, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.sdk = sdk
        self.id = str(sdk.metadata.name)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.public_previews = provider.public_previews
        self.output_limit = provider.output_limit
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = BlaxelProcesses(self)
        self.fs = ShellFs(self.plain, self.workdir)
        self.git = ExecGit(self.process)
        self.ports = BlaxelPorts(self)
        self.destroyed = False

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op, kill script): no supervisor, no handle env, from ``/``."""
        try:
            result = await self.sdk.process.exec(
                {"command": line, "working_dir": "/", "wait_for_completion": True, "timeout": 120}
            )
        except Exception as exc:
            if _status(exc) == 404 or self.destroyed:
                raise SandboxNotFoundError(NAME, self.id, "is gone") from exc
            raise
        code = result.exit_code if isinstance(result.exit_code, int) else -1
        return ExecResult(stdout=str(result.stdout or ""), stderr=str(result.stderr or ""), exit_code=code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(
            NAME, "snapshots", "Blaxel snapshots are a source-scoped preview; use portable snapshots"
        )

    async def fork(self) -> BlaxelHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "Blaxel fork is a source-scoped preview")


class BlaxelProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workspace: str | None = None,
        image: str = DEFAULT_IMAGE,
        memory: int = DEFAULT_MEMORY,
        region: str | None = None,
        ttl: str | None = DEFAULT_TTL,
        public_previews: bool = False,
        workdir: str = DEFAULT_WORKDIR,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        api_url: str | None = None,
        output_limit: int = OUTPUT_LIMIT,
        logger: Logger | None = None,
    ) -> None:
        self.api_key = api_key
        self.output_limit = output_limit
        self.workspace = workspace
        self.image = image
        self.memory = memory
        self.region = region
        self.ttl = ttl
        self.public_previews = public_previews
        self.workdir = workdir.rstrip("/") or "/"
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.api_url = api_url
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.blaxel")
        # Snapshots are off, so there is nothing to restore from (the framework checks for None).
        self.restore_snapshot = None
        # Auth is process-global: bind now so a conflicting second provider fails at construction.
        if api_key or os.environ.get(API_KEY_ENV) or workspace:
            self.bound_workspace: str | None = _bind(api_key, workspace, api_url)
        else:
            self.bound_workspace = None

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"image": self.image, "memory": self.memory, "workdir": self.workdir, "region": self._region()}

    def _region(self) -> str | None:
        return self.region or os.environ.get(REGION_ENV)

    def _ready(self) -> Any:
        core = _sdk()
        if self.bound_workspace is None:
            self.bound_workspace = _bind(self.api_key, self.workspace, self.api_url)
        return core

    async def create(self, input: CreateInput | None = None) -> BlaxelHandle:
        input = input or CreateInput()
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        _refuse_network(input.network)
        core = self._ready()
        name = sandbox_name(input.id)
        config: dict[str, Any] = {
            "name": name,
            "image": self.image,
            "memory": self.memory,
            "labels": ownership(input.id, self.run_id, self.lease_seconds, self.labels),
        }
        if self.ttl is not None:
            config["ttl"] = self.ttl
        if self._region():
            config["region"] = self._region()
        env = input.env

        async def ready(sdk: Any) -> BlaxelHandle:
            handle = BlaxelHandle(self, sdk, env)
            await make_workdir(handle.plain, self.workdir)
            return handle

        # The sandbox is deleted once the create call answered (the name is ours either way).
        creating = core.SandboxInstance.create(config)
        return await abortable_create(creating, signal, ready, lambda _: self.destroy(DestroyInput(id=name)))

    async def resume(self, input: ResumeInput) -> BlaxelHandle | None:
        core = self._ready()
        try:
            sdk = await core.SandboxInstance.get(input.id)
        except core.SandboxAPIError as exc:
            if _status(exc) == 404:
                return None
            raise
        status = str(sdk.status or "").upper()
        if status in GONE_STATUSES:
            return None
        return BlaxelHandle(self, sdk, None)

    async def destroy(self, input: DestroyInput) -> None:
        core = self._ready()
        try:
            await core.SandboxInstance.delete(input.id)
        except core.SandboxAPIError as exc:
            if _status(exc) != 404:  # already gone is success; other failures raise for the reaper
                raise

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright sandboxes by name (with every pair of ``labels`` too), every page."""
        core = self._ready()
        want = {LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})}
        page = await core.SandboxInstance.list(limit=50)
        found: list[OwnedSandbox] = []
        async for sandbox in page.auto_paging_iter():
            have = sandbox.metadata.labels
            have = have.to_dict() if hasattr(have, "to_dict") else dict(have or {})
            status = str(sandbox.status or "").upper()
            if all(have.get(k) == v for k, v in want.items()) and status not in GONE_STATUSES:
                found.append(owned(str(sandbox.metadata.name), have))
        return found


def _refuse_network(network: NetworkPolicy | None) -> None:
    if network is not None and (network.mode == "deny" or network.allow_hosts):
        raise UnsupportedCapabilityError(
            NAME, "network_policy", "Blaxel sandboxes cannot deny egress; leave the network capability unset"
        )


def blaxel_sandbox(
    *,
    api_key: str | None = None,
    workspace: str | None = None,
    image: str = DEFAULT_IMAGE,
    memory: int = DEFAULT_MEMORY,
    region: str | None = None,
    ttl: str | None = DEFAULT_TTL,
    public_previews: bool = False,
    workdir: str = DEFAULT_WORKDIR,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    api_url: str | None = None,
    output_limit: int = OUTPUT_LIMIT,
    logger: Logger | None = None,
) -> BlaxelProvider:
    """A provider whose sandboxes are Blaxel VMs of ``image``.

    ``ttl`` (a Blaxel duration such as ``"1h"``) deletes a sandbox that long after create;
    ``None`` leaves its lifetime to you. ``api_url`` points the SDK's control-plane client at
    another endpoint (tests); like the credentials it is global to the process. A command whose
    stdout or stderr passes ``output_limit`` bytes (8 MiB) is killed and fails, so logs on the
    provider's host cannot grow without bound.
    """
    return BlaxelProvider(
        api_key=api_key,
        workspace=workspace,
        image=image,
        memory=memory,
        region=region,
        ttl=ttl,
        public_previews=public_previews,
        workdir=workdir,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        api_url=api_url,
        output_limit=output_limit,
        logger=logger,
    )
