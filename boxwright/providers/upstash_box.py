"""Upstash Box: one managed cloud container per sandbox, on the official ``upstash-box`` SDK (``AsyncBox``).

Seed, point by point:

- Config (extra ``upstash-box``): ``api_key`` or ``UPSTASH_BOX_API_KEY``; ``base_url`` or ``UPSTASH_BOX_BASE_URL``;
  ``runtime`` (default ``node``) picks the image, ``size`` the machine.
- Paths: the ``/workspace`` root is the box home, ``/workspace/home`` (``workspace_root``).
- Secrets: the box ``env`` at create and restore; per-command env travels in the exec
  session's start frame (``KEY=VALUE`` entries). No value is ever part of a command string:
  a command with env of its own runs in a session, not in the HTTP exec.
- Processes: ``spawn()`` opens a live ``exec.session`` over a WebSocket: a real pid, a
  writable stdin, split stdout/stderr, server-side signals to the process tree. A session
  owns its process (a dropped connection kills it; no reattach), so a spawn lives as long
  as the handle. ``exec()`` runs in a session too (a cancelled or aborted one is killed; an
  HTTP exec cannot be stopped once sent); the HTTP exec in a shell serves the fs helpers.
  ``kill()`` sends KILL (or the signal asked for: TERM, INT, HUP) and
  returns on the confirmed exit: ``killable_processes`` is true (measured by the seed).
- Snapshot = ``box.snapshot()``; restore builds a new box with ``Box.from_snapshot`` (it
  survives the box that made it); fork = snapshot + new box (a full round trip). Resume is
  ``Box.get`` plus ``get_status``: a deleted or missing record is ``None`` (a paused box is
  resumed); other errors raise.
- Ports: ``ports.connect(port)`` creates a preview URL with ``get_public_url``; with
  ``public_url_auth="bearer"`` the channel carries the token and an ``Authorization: Bearer``
  header, with ``"basic"`` Basic credentials; without, the URL has no auth.
- Network: deny maps to the ``deny-all`` egress mode; a host allow-list is refused (the
  contract's one coarse gate cannot express Box's domain/CIDR lists).
- Every box carries boxwright's ownership labels (``list_owned`` finds them for reaping).
- An abort or cancel during create destroys whatever was made, then raises.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import os
import secrets
import signal as signals
import time
from collections.abc import Mapping, Sequence
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
    OwnedSandbox,
    RemoteHandle,
    RemoteProcess,
    ShellFs,
    SpawnSet,
    TextChannel,
    abortable_create,
    channel,
    check_port,
    import_sdk,
    lease_expiry,
    make_workdir,
    map_path,
    owner_id,
)

NAME = "upstash-box"
API_KEY_ENV = "UPSTASH_BOX_API_KEY"
BASE_URL_ENV = "UPSTASH_BOX_BASE_URL"
WORKDIR = "/workspace/home"
KEY_HELP = f"set {API_KEY_ENV} (https://console.upstash.com) or pass upstash_box_sandbox(api_key=...)"
# Box labels are plain strings: boxwright's ownership metadata as `boxwright-<key>-<value>` labels.
LABEL_MANAGED = "boxwright-managed"
LABEL_OWNER = "boxwright-owner-"
LABEL_RUN = "boxwright-run-"
LABEL_SANDBOX = "boxwright-sandbox-"
LABEL_NONCE = "boxwright-nonce-"
# Box labels are plain strings: the lease's epoch second follows this prefix.
LABEL_LEASE = "boxwright-lease-expires-"
_SIGNAL_NAMES = {signals.SIGTERM: "TERM", signals.SIGKILL: "KILL", signals.SIGINT: "INT", signals.SIGHUP: "HUP"}


def _sdk() -> Any:
    return import_sdk(NAME, "upstash_box", "upstash-box", "upstash-box")


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,  # preview URLs
        background_processes=True,
        writable_stdin=True,  # exec-session stdin frames; C12
        killable_processes=True,  # server-side signal to the process tree; measured by the seed, J7/J8 here
        snapshots=True,
        network_policy=True,  # deny = deny-all
        durable_filesystem=False,  # not stated by the seed: unstated flags are false
        fork=True,
    )


class _Stdin:
    def __init__(self, process: UpstashProcess) -> None:
        self._process = process
        self._ended = False

    async def write(self, data: str | bytes) -> None:
        if self._ended:
            raise ProcessExitedError(self._process.pid, "stdin was already ended (closed)")
        if self._process.exited:
            raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed")
        try:
            await self._process.session.write(data)
        except Exception as exc:
            if self._process.exited:
                raise ProcessExitedError(self._process.pid, "the process exited; its stdin is closed") from exc
            raise

    async def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if not self._process.exited:
            with contextlib.suppress(Exception):
                await self._process.session.end_stdin()


class _Decoded:
    """Bytes from the SDK's callbacks, decoded incrementally into a text stream."""

    def __init__(self) -> None:
        self.channel = TextChannel()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.channel.feed(self._decoder.decode(data))

    def close(self) -> None:
        self.channel.feed(self._decoder.decode(b"", final=True))
        self.channel.close()


class UpstashProcess(RemoteProcess):
    """``SpawnHandle`` over one exec session; a kill is a server-side signal to the process tree."""

    def __init__(self, handle: UpstashBoxHandle, session: Any, out: _Decoded, err: _Decoded) -> None:
        self._handle = handle
        self.session = session
        self.pid = int(session.pid)
        self._out, self._err = out, err
        self.stdout = out.channel
        self.stderr = err.channel
        self.stdin = _Stdin(self)
        self.watch(self._await_exit())

    async def _await_exit(self) -> int:
        try:
            code = int(await self.session.wait())
        finally:
            self._out.close()
            self._err.close()
            with contextlib.suppress(Exception):
                await self.session.close()
        if code < 0:  # the session ended without an exit frame
            if self._handle.destroyed or self._kill is not None:
                return 128 + 9
            raise SandboxNotFoundError(NAME, self._handle.id, "ended the exec session before the command exited")
        return code

    async def _do_kill(self, sig: int | None) -> None:
        if self.exited:
            return
        name = _SIGNAL_NAMES.get(signals.Signals(sig), "KILL") if sig is not None else "KILL"
        try:
            await self.session.kill(name)
        except Exception as exc:
            if not self.exited:
                self._handle.warn("could not send the kill", {"pid": self.pid, "error": repr(exc)})
        await self.confirm_exit()
        if not self.exited:
            self._handle.warn("no exit was confirmed after the kill; the command may still run", {"pid": self.pid})


class UpstashProcesses(SpawnSet[UpstashProcess]):
    """``exec`` is a session, not the HTTP exec: env travels in its start frame, and a cancel or abort can
    kill it (an HTTP exec cannot be stopped once sent). The HTTP exec serves the fs helpers."""

    _handle: UpstashBoxHandle
    end_stdin = True

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> UpstashProcess:
        opts = self.started(opts)
        handle = self._handle
        env = {**handle.env.get(), **(opts.env or {})}
        process = await handle.session(command, env, map_path(opts.cwd or "", handle.workdir))
        return self.track(process, opts.signal)


class UpstashPorts:
    def __init__(self, handle: UpstashBoxHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        auth = self._handle.public_url_auth
        made = await self._handle.box.get_public_url(
            port, bearer_token=True if auth == "bearer" else None, basic_auth=True if auth == "basic" else None
        )
        if auth == "bearer" and made.token:
            return channel(str(made.url), {"Authorization": f"Bearer {made.token}"}, token=str(made.token))
        if auth == "basic" and made.username is not None:
            pair = base64.b64encode(f"{made.username}:{made.password}".encode()).decode()
            return channel(str(made.url), {"Authorization": f"Basic {pair}"})
        return channel(str(made.url))


class UpstashBoxHandle(RemoteHandle):
    provider = NAME
    _provider: UpstashBoxProvider

    def __init__(
        self,
        provider: UpstashBoxProvider,
        box: Any,
        create_env: Mapping[str, str] | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._provider = provider
        self.box = box
        self.id = str(box.id)
        self.workdir = WORKDIR
        self.workspace_root = WORKDIR
        self.capabilities = provider.capabilities()
        self.public_url_auth = provider.public_url_auth
        self.create_env = dict(create_env or {})
        self.env = HandleEnv(env)
        self.process = UpstashProcesses(self)
        self.fs = ShellFs(self.plain, self.workdir)
        self.git = ExecGit(self.process)
        self.ports = UpstashPorts(self)
        self.destroyed = False

    def _gone(self, exc: BaseException) -> BaseException:
        if _status(exc) == 404:
            return SandboxNotFoundError(NAME, self.id, "is gone (deleted)")
        return exc

    async def session(self, command: str, env: Mapping[str, str], cwd: str) -> UpstashProcess:
        out, err = _Decoded(), _Decoded()
        try:
            session = await self.box.exec.session(
                cmd=command,
                cwd=cwd or self.workdir,
                env=[f"{k}={v}" for k, v in env.items()] or None,
                on_stdout=out.feed,
                on_stderr=err.feed,
            )
        except Exception as exc:
            out.close()
            err.close()
            if "chdir" in str(exc) or "no such file" in str(exc).lower():
                raise SandboxCommandError("exec", -1, str(exc)) from exc
            raise self._gone(exc) from exc
        return UpstashProcess(self, session, out, err)

    async def http_exec(self, command: str, cwd: str) -> ExecResult:
        # The cwd is not secret; the HTTP exec takes a folder relative to the home only.
        line = f"cd {quote(cwd)} && {command}" if cwd else command
        try:
            run = await self.box.exec.command(line)
        except Exception as exc:
            raise self._gone(exc) from exc
        code = run.exit_code
        return ExecResult(stdout=run.stdout or "", stderr=run.stderr or "", exit_code=-1 if code is None else int(code))

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op): no handle env, over the HTTP exec."""
        return await self.http_exec(line, "")

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        try:
            made = await self.box.snapshot(name=label or f"boxwright-{self.id}")
        except Exception as exc:
            raise self._gone(exc) from exc
        return SnapshotRef(id=str(made.id), label=label)

    async def fork(self) -> UpstashBoxHandle:
        # Box has no live fork: a snapshot, then a new box from it (one full snapshot round trip).
        ref = await self.snapshot("boxwright-fork")
        return await self._provider.make(ref.id, self.create_env, None, None, None, self.env.get())

    async def destroy(self) -> None:
        # Not RemoteHandle's: ``destroyed`` is set before the kill (a session the kill ends reads it),
        # and the SDK's client is closed after.
        if not self.destroyed:
            self.destroyed = True
            await self.process.kill_all()
        await self._provider.destroy(DestroyInput(id=self.id))
        with contextlib.suppress(Exception):
            await self.box.aclose()


class UpstashBoxProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        runtime: str = "node",
        size: Literal["small", "medium", "large"] | None = None,
        public_url_auth: Literal["bearer", "basic"] | None = None,
        labels: tuple[str, ...] = (),
        run_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE,
        request_timeout: float = 60.0,
        logger: Logger | None = None,
    ) -> None:
        self.api_key = api_key
        self.base_url = base_url
        self.runtime = runtime
        self.size = size
        self.public_url_auth = public_url_auth
        self.labels = tuple(labels)
        self.run_id = run_id
        self.lease_seconds = lease_seconds
        self.request_timeout = request_timeout
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.upstash_box")
        self.restore_snapshot = self._restore

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider: a change means a new sandbox."""
        return {"runtime": self.runtime, "size": self.size, "base_url": self.base_url or os.environ.get(BASE_URL_ENV)}

    def _opts(self) -> dict[str, Any]:
        key = self.api_key or os.environ.get(API_KEY_ENV)
        if not key:
            raise ProviderUnavailableError(NAME, f"no API key ({API_KEY_ENV} is not set)", KEY_HELP)
        opts: dict[str, Any] = {"api_key": key, "timeout": self.request_timeout * 1000}
        base = self.base_url or os.environ.get(BASE_URL_ENV)
        if base:
            opts["base_url"] = base
        return opts

    def _ownership(self, key: str | None, nonce: str) -> list[str]:
        lease = f"{LABEL_LEASE}{time.time() + self.lease_seconds:.0f}"
        labels = [*self.labels, LABEL_MANAGED, LABEL_OWNER + owner_id(), LABEL_NONCE + nonce, lease]
        if key:
            labels.append(LABEL_SANDBOX + key)
        if self.run_id:
            labels.append(LABEL_RUN + self.run_id)
        return labels

    async def create(self, input: CreateInput | None = None) -> UpstashBoxHandle:
        input = input or CreateInput()
        return await self.make(None, input.env, input.network, input.id, input.signal, input.env)

    async def _restore(self, input: RestoreInput) -> UpstashBoxHandle:
        return await self.make(input.snapshot_id, input.env, input.network, None, input.signal, input.env)

    async def make(
        self,
        snapshot_id: str | None,
        create_env: Mapping[str, str] | None,
        network: NetworkPolicy | None,
        key: str | None,
        signal: AbortSignal | None,
        env: Mapping[str, str] | None,
    ) -> UpstashBoxHandle:
        if signal is not None:
            signal.throw_if_aborted()
        upstash_box = _sdk()
        opts = self._opts()
        config: dict[str, Any] = {**opts, "runtime": self.runtime}
        if self.size:
            config["size"] = self.size
        if network is not None and network.mode == "deny":
            if network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "the contract's coarse gate is deny-all; Box's allowlists are not reachable"
                )
            config["network_policy"] = {"mode": "deny-all"}
        if create_env:
            config["env"] = dict(create_env)  # secrets: the box env, never a command string
        nonce = secrets.token_hex(8)
        config["labels"] = self._ownership(key, nonce)
        AsyncBox = upstash_box.AsyncBox
        made = AsyncBox.from_snapshot(snapshot_id, **config) if snapshot_id else AsyncBox.create(**config)

        async def ready(box: Any) -> UpstashBoxHandle:
            handle = UpstashBoxHandle(self, box, create_env, env)
            await make_workdir(handle.plain, WORKDIR)
            return handle

        async def delete(box: Any) -> None:
            if box is not None:
                with contextlib.suppress(Exception):
                    await self.destroy(DestroyInput(id=str(box.id)))
                with contextlib.suppress(Exception):
                    await box.aclose()
                return
            # The create answer never came: find what it made by its nonce label.
            for found in await self.list_owned({LABEL_NONCE: nonce}):
                await self.destroy(DestroyInput(id=found.id))

        return await abortable_create(made, signal, ready, delete, self.request_timeout)

    async def resume(self, input: ResumeInput) -> UpstashBoxHandle | None:
        if input.signal is not None:
            input.signal.throw_if_aborted()
        upstash_box = _sdk()
        try:
            box = await upstash_box.AsyncBox.get(input.id, **self._opts())
        except upstash_box.BoxError as exc:
            if _status(exc) == 404:
                return None
            raise
        try:
            status = str((await box.get_status()).get("status") or "")
            if status in ("deleted", "error"):
                await box.aclose()
                return None
            if status == "paused":
                await box.resume()
        except upstash_box.BoxError as exc:
            await box.aclose()
            if _status(exc) == 404:
                return None
            raise
        return UpstashBoxHandle(self, box, None)

    async def destroy(self, input: DestroyInput) -> None:
        upstash_box = _sdk()
        try:
            box = await upstash_box.AsyncBox.get(input.id, **self._opts())
        except upstash_box.BoxError as exc:
            if _status(exc) == 404:
                return  # already gone is success
            raise
        try:
            await box.delete()
        except upstash_box.BoxError as exc:
            if _status(exc) != 404:
                raise
        finally:
            with contextlib.suppress(Exception):
                await box.aclose()

    async def list_owned(self, labels: Mapping[str, str] | None = None) -> list[OwnedSandbox]:
        """This host's boxwright boxes, for ``boxwright reap``; ``labels`` pairs match the label ``key + value``
        (box labels are plain strings: ``{"boxwright-test": ""}``, ``{LABEL_RUN: run_id}``)."""
        upstash_box = _sdk()
        wanted = {LABEL_MANAGED, *(k + v for k, v in (labels or {}).items())}
        opts = self._opts()
        rows = await upstash_box.AsyncBox.list(
            api_key=opts["api_key"], base_url=opts.get("base_url"), label=LABEL_OWNER + owner_id()
        )
        return [
            OwnedSandbox(id=str(r.id), lease_expires=_lease(r.labels or ()))
            for r in rows
            if wanted <= set(r.labels or ()) and r.status != "deleted"
        ]


def _lease(labels: Sequence[str]) -> float | None:
    return next((lease_expiry(x.removeprefix(LABEL_LEASE)) for x in labels if x.startswith(LABEL_LEASE)), None)


def upstash_box_sandbox(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    runtime: str = "node",
    size: Literal["small", "medium", "large"] | None = None,
    public_url_auth: Literal["bearer", "basic"] | None = None,
    labels: tuple[str, ...] = (),
    run_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE,
    request_timeout: float = 60.0,
    logger: Logger | None = None,
) -> UpstashBoxProvider:
    """A provider whose sandboxes are Upstash Boxes of ``runtime`` (and ``size``).

    ``public_url_auth`` protects preview URLs (``"bearer"`` or ``"basic"``); ``labels`` are
    added to boxwright's ownership labels on every box.
    """
    return UpstashBoxProvider(
        api_key=api_key,
        base_url=base_url,
        runtime=runtime,
        size=size,
        public_url_auth=public_url_auth,
        labels=labels,
        run_id=run_id,
        lease_seconds=lease_seconds,
        request_timeout=request_timeout,
        logger=logger,
    )
