"""Sprites (Fly.io): a stateful VM per sandbox, on the official ``sprites-py`` SDK (``AsyncSpritesClient``).

Seed and spec §2.5, point by point:

- Config: ``api_key``/``SPRITES_API_KEY`` in the form ``org/projectNumber/tokenId/secret``,
  ``api_url``/``SPRITES_API_URL`` for another control plane, ``http_port`` (8080: the one port a
  Sprite proxies), ``workdir`` (``/workspace`` maps to ``/home/sprite/workspace``), ``ram_mb``,
  ``cpus``, ``region``.
- Secrets and per-command env: the SDK puts an exec's ``env`` into the WebSocket URL's query
  (URLs end up in proxies' and servers' logs), so values travel on the command's stdin instead,
  as one base64 line a fixed loader reads and exports before the command starts. No value is
  ever part of a command string or URL; file writes go over stdin too.
- Lifetime: a Sprite stays until destroyed and keeps its filesystem across idle suspend; resume
  by name connects to it (a missing Sprite resumes as ``None``; auth and transport errors raise).
- Snapshots: ``snapshot()`` makes a Sprite checkpoint (a save point of the writable overlay).
  Checkpoints die with their Sprite, so the provider has no ``restore_snapshot`` (``None``): the
  framework makes a fresh sandbox when one is gone. The handle's ``restore_checkpoint()``
  restores in place (the environment restarts: it may take minutes; it polls until the
  workspace lists again and retries the transient EIO reads right after) and
  ``list_checkpoints()`` lists them.
- Processes: each command leads its own group under ``setsid`` and records it in a pid file;
  ``kill()`` signals that group inside the Sprite, KILLs what is left and waits for the exit.
  ``killable_processes`` stays ``false``: the seed claims it unverified, and the spec ships it
  only once the journal kill cases pass against a real Sprite. ``writable_stdin`` is ``false``
  (the seed): stdin carries only the env line, then ends.
- Ports: only the proxied HTTP port. ``connect(http_port)`` switches the Sprite's URL auth to
  ``public`` and returns the URL; any other port raises.
- Network deny is refused (no egress policy in the seed's Sprites section): never silently dropped.
- An abort or cancel during create destroys the Sprite after the current call answered.
- Every Sprite carries boxwright's ownership labels as ``key=value`` strings (``list_owned``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import io
import os
import time
import uuid
from collections.abc import Mapping
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
    env_line,
    import_sdk,
    make_workdir,
    map_path,
    owned,
    owner_id,
    ownership,
    script,
    vm_name,
)

NAME = "sprites"
API_KEY_ENV = "SPRITES_API_KEY"
API_URL_ENV = "SPRITES_API_URL"
DEFAULT_API_URL = "https://api.sprites.dev"
DEFAULT_WORKDIR = "/home/sprite/workspace"
DEFAULT_HTTP_PORT = 8080
KEY_HELP = (
    f"set {API_KEY_ENV} (org/projectNumber/tokenId/secret, from sprites.dev) or pass sprites_sandbox(api_key=...)"
)
_RESTORE_WAIT = 600.0

# Reads one base64 line of `export K='v'` statements from stdin (values never in argv or the URL),
# then starts $2 as the leader of its own group (the WRAPPER, in $W, records the group in $1).
LAUNCH = (
    'IFS= read -r E || exit 125; eval "$(printf %s "$E" | base64 -d)"; unset E; '
    'setsid sh -c "$W" boxwright "$1" "$2" </dev/null & p=$!; wait $p'
)


def _sdk() -> Any:
    return import_sdk(NAME, "sprites", "sprites-py", "sprites")


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=False,  # seed: stdin carries the env line only
        killable_processes=False,  # seed: "true (not verified)"; spec: false until J7/J8 pass live
        snapshots=True,  # checkpoints; restore is in place (no restore_snapshot)
        network_policy=False,
        durable_filesystem=True,  # the filesystem stays across idle suspend and resume
        fork=False,
    )


class _Sink:
    """The SDK's stdout/stderr sink (``write(bytes)``), decoding incrementally into a text stream."""

    def __init__(self, stream: TextChannel) -> None:
        self.stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> int:
        self.stream.feed(self._decoder.decode(data))
        return len(data)

    def flush(self) -> None:
        self.stream.feed(self._decoder.decode(b"", final=True))


class SpritesProcess(GroupProcess):
    """``SpawnHandle`` over one exec session; ``kill`` signals the recorded group inside the Sprite."""

    def __init__(self, handle: SpritesHandle, command: Any, pid_file: str) -> None:
        super().__init__(handle, pid_file)
        self._handle = handle
        # pid -1: the group id lives in the Sprite's pid file; the session reports none
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = NoStdin(NAME)  # seed: stdin carries the env line only
        self._out = _Sink(self.stdout)
        self._err = _Sink(self.stderr)
        command.stdout, command.stderr = self._out, self._err
        self._command = command
        self.watch(self._run())

    async def _run(self) -> int:
        sprites = _sdk()
        try:
            await self._command.run()
            return 0
        except sprites.ExecError:  # a non-zero exit: its code is the command's
            return int(self._command.exit_code)
        except sprites.NotFoundError as exc:
            raise SandboxNotFoundError(NAME, self._handle.id, "is gone") from exc
        except sprites.SpriteError:
            if self._handle.destroyed:
                return 128 + 9  # the Sprite went with destroy(): its processes were killed
            raise
        finally:
            self._out.flush()
            self._err.flush()
            self.stdout.close()
            self.stderr.close()


class SpritesProcesses(SpawnSet[SpritesProcess]):
    _handle: SpritesHandle

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> SpritesProcess:
        opts = self.started(opts)
        handle = self._handle
        pid_file = f"/dev/shm/.boxwright-sprites-{uuid.uuid4().hex}.pid"
        values = {**handle.env.get(), **(opts.env or {}), "W": WRAPPER}
        cmd = handle.sprite.command(
            "sh",
            "-c",
            LAUNCH,
            "boxwright",
            pid_file,
            command,
            cwd=map_path(opts.cwd or "", handle.workdir),
            stdin=io.BytesIO(env_line(values)),
        )
        return self.track(SpritesProcess(handle, cmd, pid_file), opts.signal)


class SpritesFs(ShellFs):
    """The shell fs, with file contents over the session's stdin/stdout (never in the URL's argv)."""

    def __init__(self, handle: SpritesHandle) -> None:
        super().__init__(handle.plain, handle.workdir)
        self._handle = handle

    async def read_bytes(self, path: str) -> bytes:
        code, out, err = await self._handle.raw(script("read", 'cat -- "$1"', self.p(path)))
        if code != 0:
            raise SandboxCommandError("read", code, err.decode(errors="replace").strip())
        return out

    async def write(self, path: str, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        text = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        code, _, err = await self._handle.raw(script("write", text, self.p(path)), stdin=raw)
        if code != 0:
            raise SandboxCommandError("write", code, err.decode(errors="replace").strip())


class SpritesPorts:
    def __init__(self, handle: SpritesHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        handle = self._handle
        if port != handle.http_port:
            raise UnsupportedCapabilityError(
                NAME, "ports", f"a Sprite proxies only its HTTP port {handle.http_port} (http_port=...)"
            )
        sprites = _sdk()
        updated = await handle.client.update_sprite(handle.id, url_settings=sprites.URLSettings(auth="public"))
        if not updated.url:
            raise SandboxCommandError("ports", -1, f"Sprites reported no URL for {handle.id}")
        return channel(str(updated.url))  # public: anyone with the URL reaches the port


class SpritesHandle(RemoteHandle):
    provider = NAME
    process: SpritesProcesses

    def __init__(self, provider: SpritesProvider, name: str, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.client = provider.client()
        self.id = name
        self.sprite = self.client.sprite(name)
        self.workdir = provider.workdir
        self.workspace_root = provider.workdir
        self.http_port = provider.http_port
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = SpritesProcesses(self)
        self.fs = SpritesFs(self)
        self.git = ExecGit(self.process)
        self.ports = SpritesPorts(self)
        self.destroyed = False

    async def raw(self, line: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
        """A helper command (fs op, kill script): no wrapper, no handle env; bytes in and out."""
        sprites = _sdk()
        out, err = io.BytesIO(), io.BytesIO()
        cmd = self.sprite.command("sh", "-c", line, stdin=io.BytesIO(stdin), stdout=out, stderr=err)
        try:
            await cmd.run()
            code = 0
        except sprites.ExecError:
            code = int(cmd.exit_code)
        except sprites.NotFoundError as exc:
            raise SandboxNotFoundError(NAME, self.id, "is gone") from exc
        return code, out.getvalue(), err.getvalue()

    async def plain(self, line: str) -> ExecResult:
        code, out, err = await self.raw(line)
        return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"), exit_code=code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        """A checkpoint of this Sprite (it dies with the Sprite: restore it in place)."""
        comment = f"boxwright:{uuid.uuid4().hex[:12]}:{label or ''}"
        stream = await self.sprite.create_checkpoint(comment)
        for message in stream:
            if message.type == "error" or message.error:
                raise SandboxCommandError("snapshot", -1, f"Sprites checkpoint failed: {message.error or message.data}")
        for checkpoint in await self.sprite.list_checkpoints():
            if checkpoint.comment == comment:
                return SnapshotRef(id=str(checkpoint.id), label=label)
        raise SandboxCommandError("snapshot", -1, "Sprites did not list the checkpoint it made")

    async def list_checkpoints(self) -> list[SnapshotRef]:
        made = await self.sprite.list_checkpoints()
        return [SnapshotRef(id=str(c.id), label=_label(c.comment)) for c in made]

    async def restore_checkpoint(self, checkpoint_id: str) -> None:
        """Restore a checkpoint in place: the environment restarts; returns once the workspace lists again."""
        await self.process.kill_all()
        stream = await self.sprite.restore_checkpoint(checkpoint_id)
        for message in stream:
            if message.type == "error" or message.error:
                raise SandboxCommandError("restore", -1, f"Sprites restore failed: {message.error or message.data}")
        deadline = time.monotonic() + _RESTORE_WAIT
        while True:  # reads right after a restore may fail with EIO while the overlay settles
            with contextlib.suppress(Exception):
                if (await self.plain(script("restore", 'ls -A -- "$1" >/dev/null', self.workdir))).exit_code == 0:
                    return
            if time.monotonic() > deadline:
                raise SandboxCommandError("restore", -1, f"the workspace did not come back within {_RESTORE_WAIT} s")
            await asyncio.sleep(0.5)

    async def fork(self) -> SpritesHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "a Sprite cannot be copied; checkpoints stay with their Sprite")


def _label(comment: str | None) -> str | None:
    if comment and comment.startswith("boxwright:"):
        return comment.split(":", 2)[2] or None
    return comment


class SpritesProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        http_port: int = DEFAULT_HTTP_PORT,
        workdir: str = DEFAULT_WORKDIR,
        ram_mb: int | None = None,
        cpus: int | None = None,
        region: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        logger: Logger | None = None,
    ) -> None:
        check_port(http_port)
        self.api_key = api_key
        self.api_url = api_url
        self.http_port = http_port
        self.workdir = workdir.rstrip("/") or "/"
        self.ram_mb = ram_mb
        self.cpus = cpus
        self.region = region
        self.labels = dict(labels or {})
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.sprites")
        # Checkpoints die with their Sprite: nothing to restore a gone sandbox from (seed).
        self.restore_snapshot = None
        self._clients: dict[int, Any] = {}

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"workdir": self.workdir, "ram_mb": self.ram_mb, "cpus": self.cpus, "region": self.region}

    def client(self) -> Any:
        """One SDK client per event loop (its httpx client belongs to the loop that made it)."""
        sprites = _sdk()
        loop = id(asyncio.get_running_loop())
        made = self._clients.get(loop)
        if made is None:
            key = self.api_key or os.environ.get(API_KEY_ENV)
            if not key:
                raise ProviderUnavailableError(NAME, f"no API key ({API_KEY_ENV} is not set)", KEY_HELP)
            if key.count("/") != 3:
                raise ProviderUnavailableError(
                    NAME, f"{API_KEY_ENV} is not of the form org/projectNumber/tokenId/secret", KEY_HELP
                )
            url = self.api_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
            made = sprites.AsyncSpritesClient(token=key, base_url=url)
            self._clients = {loop: made}
        return made

    def _labels(self, key: str | None) -> list[str]:
        return [f"{k}={v}" for k, v in ownership(key, self.run_id, self.lease_seconds, self.labels).items()]

    async def create(self, input: CreateInput | None = None) -> SpritesHandle:
        input = input or CreateInput()
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        network = input.network
        if network is not None and (network.mode == "deny" or network.allow_hosts):
            raise UnsupportedCapabilityError(
                NAME, "network_policy", "boxwright does not set a Sprite's egress policy; leave the network unset"
            )
        sprites = _sdk()
        client = self.client()
        name = vm_name(input.id)
        config = None
        if self.ram_mb is not None or self.cpus is not None or self.region is not None:
            config = sprites.SpriteConfig(ram_mb=self.ram_mb, cpus=self.cpus, region=self.region)
        creating = client.create_sprite(
            name, config=config, url_settings=sprites.URLSettings(auth="sprite"), labels=self._labels(input.id)
        )

        async def ready(made: Any) -> SpritesHandle:
            handle = SpritesHandle(self, str(made.name), input.env)
            await make_workdir(handle.plain, self.workdir)
            return handle

        # The Sprite is destroyed once the current call answered (it may exist by then).
        return await abortable_create(creating, signal, ready, lambda _: self.destroy(DestroyInput(id=name)))

    async def resume(self, input: ResumeInput) -> SpritesHandle | None:
        sprites = _sdk()
        try:
            made = await self.client().get_sprite(input.id)
        except sprites.NotFoundError:
            return None  # auth and transport errors raise
        if str(made.status).lower() in ("destroyed", "destroying", "deleted"):
            return None
        return SpritesHandle(self, str(made.name), None)

    async def destroy(self, input: DestroyInput) -> None:
        sprites = _sdk()
        try:
            await self.client().destroy_sprite(input.id)
        except sprites.NotFoundError:
            return  # already gone is success; other failures raise for the reaper

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright Sprites by name (with every pair of ``labels`` too), every page."""
        sprites = _sdk()
        want = {f"{k}={v}" for k, v in {LABEL_MANAGED: "1", LABEL_OWNER: owner_id(), **(labels or {})}.items()}
        found: list[OwnedSandbox] = []
        token: str | None = None
        while True:
            page = await self.client().list_sprites(
                sprites.ListOptions(prefix="bw-", max_results=100, continuation_token=token)
            )
            for sprite in page.sprites:
                have = dict(label.partition("=")[::2] for label in sprite.labels or [])
                if want <= set(sprite.labels or []):
                    found.append(owned(str(sprite.name), have))
            if not page.has_more or not page.next_continuation_token:
                return found
            token = page.next_continuation_token


def sprites_sandbox(
    *,
    api_key: str | None = None,
    api_url: str | None = None,
    http_port: int = DEFAULT_HTTP_PORT,
    workdir: str = DEFAULT_WORKDIR,
    ram_mb: int | None = None,
    cpus: int | None = None,
    region: str | None = None,
    labels: Mapping[str, str] | None = None,
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    logger: Logger | None = None,
) -> SpritesProvider:
    """A provider whose sandboxes are Sprites (Fly.io stateful VMs).

    A Sprite stays until destroyed (its filesystem survives idle suspend). Only ``http_port``
    is reachable from outside: ``ports.connect(http_port)`` makes the Sprite's URL public.
    """
    return SpritesProvider(
        api_key=api_key,
        api_url=api_url,
        http_port=http_port,
        workdir=workdir,
        ram_mb=ram_mb,
        cpus=cpus,
        region=region,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        logger=logger,
    )
