"""Bubblewrap: real isolation on Linux without Docker, through ``bwrap``.

Each command runs in its own ``bwrap`` with its own pid namespace, over a root
built from read-only binds of the host's ``/usr`` and ``/etc``. The only
writable places are the workspace (bound at ``/workspace``) and a per-sandbox
``/tmp`` that outlives single commands (journals live there). The env is built
from nothing: no host variable, so no host secret, reaches the sandbox.

A sandbox is a state directory ``<base_dir>/<uuid>`` holding ``tmp/``, the
workspace (``workspace/``, unless ``dir`` names one) and ``sandbox.json``; its
id is that directory. Every ``bwrap`` of a sandbox carries the directory in its
argv, so destroy finds and kills them all, also ones another process started.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from ..errors import (
    ProviderUnavailableError,
    SandboxNotFoundError,
    SandboxPathError,
    UnsupportedCapabilityError,
)
from ..git_exec import ExecGit
from ..sandbox import Capabilities, CreateInput, DestroyInput, ResumeInput, SnapshotRef
from ._hostfs import HostFs, PathMap
from ._posix import HandleEnv, HostProcesses, LocalPorts, Logger, StdlibLogger, remove_tree_with_retry

NAME = "bubblewrap"
INSTALL_HELP = "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp/home",
    "LANG": "C.UTF-8",
}
_ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class _Meta(msgspec.Struct):
    workspace: str
    owned_workspace: bool
    network: Literal["allow", "deny"]


class Probe(msgspec.Struct, frozen=True):
    """What ``bwrap`` can do on this machine, measured by running it."""

    available: bool
    reason: str
    network_deny: bool
    killable: bool


def _root_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return [*args, "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]


@functools.cache
def probe(bwrap: str = "bwrap") -> Probe:
    """Run ``bwrap`` once: does it start, can it unshare the network, does a group kill empty it."""
    exe = shutil.which(bwrap)
    if exe is None:
        return Probe(False, f"{bwrap!r} is not on PATH; {INSTALL_HELP}", False, False)
    base = [exe, "--unshare-pid", *_root_args(), "--"]
    try:
        run = subprocess.run([*base, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, f"bwrap did not run: {exc}", False, False)
    if run.returncode != 0:
        why = run.stderr.decode(errors="replace").strip()
        return Probe(False, f"bwrap cannot create namespaces here: {why}", False, False)
    net = subprocess.run([exe, "--unshare-net", *base[1:], "true"], capture_output=True, timeout=20).returncode == 0
    return Probe(True, "", net, _kill_reaches_children(base))


def _kill_reaches_children(base: list[str]) -> bool:
    nap = f"86400.{os.getpid()}{time.monotonic_ns() % 10000}"
    proc = subprocess.Popen(
        [*base, "sh", "-c", f"sleep {nap} & echo $! ; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not _sandbox_pids(f"sleep\x00{nap}"):
                return True
            time.sleep(0.02)
        return False
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        if proc.poll() is None:
            proc.kill()


def _capabilities(found: Probe) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=True,
        killable_processes=found.killable,
        snapshots=False,
        network_policy=found.network_deny,
        durable_filesystem=True,
        fork=True,
    )


def _sandbox_pids(marker: str) -> list[int]:
    """Pids whose argv contains ``marker`` (NUL-separated argv text)."""
    needle = marker.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _kill_sandbox_processes(state: str) -> None:
    """SIGKILL every bwrap of a sandbox; the death of a pid namespace's init ends all in it."""
    marker = f"--bind\x00{state}/tmp\x00/tmp"
    for _ in range(50):
        pids = _sandbox_pids(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


class BubblewrapHandle:
    provider = NAME

    def __init__(
        self,
        state: str,
        meta: _Meta,
        *,
        base_dir: str,
        bwrap: str,
        ro_binds: Sequence[str],
        capabilities: Capabilities,
        logger: Logger | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.id = state
        self.workspace_root = meta.workspace
        self.capabilities = capabilities
        self._state = state
        self._meta = meta
        self._base_dir = base_dir
        self._bwrap = bwrap
        self._ro_binds = tuple(ro_binds)
        self._logger = logger
        self._tmp = os.path.join(state, "tmp")
        self.env = HandleEnv(env)
        self._paths = PathMap([("/workspace", meta.workspace), ("/tmp", self._tmp)], fallback=None)
        self.fs = HostFs(self._paths)
        self.process = HostProcesses(self._launch, logger)
        self.git = ExecGit(self.process)
        self.ports = LocalPorts()
        # Added by bind_read_only for this handle's life (an agent CLI found on the host, a repository
        # to clone): not part of the provider's identity, so they never make a new sandbox.
        self._extra_ro_binds: list[str] = []

    def shows_host_path(self, path: str) -> bool:
        """Whether the host path ``path`` is visible at the same path inside this sandbox (``HostPathBinder``)."""
        real = os.path.realpath(path)
        args = _root_args()
        same = [args[i + 1] for i in range(len(args) - 2) if args[i] == "--ro-bind" and args[i + 1] == args[i + 2]]
        roots = [*same, *self._ro_binds, *self._extra_ro_binds]
        return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)

    def bind_read_only(self, paths: Sequence[str]) -> None:
        """Show host ``paths`` read-only at the same path to this handle's later commands (``HostPathBinder``)."""
        for path in paths:
            real = os.path.realpath(path)
            if not os.path.exists(real):
                # bwrap refuses to start a command over a missing bind source: say which one, here.
                raise FileNotFoundError(f"cannot bind {real!r} into the sandbox: it does not exist on the host")
            if real not in self._extra_ro_binds and real not in self._ro_binds:
                self._extra_ro_binds.append(real)

    def _launch(
        self, command: str, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[list[str], str, dict[str, str]]:
        if not os.path.isdir(self.workspace_root):
            raise SandboxNotFoundError(NAME, self.id, "has no workspace any more (the directory is gone)")
        inside = cwd or "/workspace"
        if not inside.startswith("/"):
            inside = f"/workspace/{inside}"
        if not os.path.isdir(self._paths.host(inside)):
            raise SandboxPathError(inside, "/workspace", "is not a directory inside the sandbox, under")
        argv = [self._bwrap, "--unshare-pid"]
        if self._meta.network == "deny":
            argv.append("--unshare-net")
        argv += _root_args()
        argv += ["--bind", self.workspace_root, "/workspace", "--bind", self._tmp, "/tmp"]
        # After /tmp, so a host path under /tmp can still be shown to the sandbox.
        for path in (*self._ro_binds, *self._extra_ro_binds):
            argv += ["--ro-bind", path, path]
        argv += ["--chdir", inside]
        argv += ["--", "sh", "-c", command]
        # The env goes to bwrap itself, which passes it on: never on argv, where `ps` shows it.
        return argv, self._state, {**BASE_ENV, **self.env.get(), **(env or {})}

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshot", "bubblewrap keeps no snapshots; use fork() for a copy")

    async def fork(self) -> BubblewrapHandle:
        state = os.path.join(self._base_dir, f"fork-{uuid.uuid4().hex}")
        workspace = os.path.join(state, "workspace")
        await asyncio.to_thread(shutil.copytree, self.workspace_root, workspace, symlinks=True)
        await asyncio.to_thread(shutil.copytree, self._tmp, os.path.join(state, "tmp"), symlinks=True)
        meta = _Meta(workspace=workspace, owned_workspace=True, network=self._meta.network)
        _write_meta(state, meta)
        return BubblewrapHandle(
            state,
            meta,
            base_dir=self._base_dir,
            bwrap=self._bwrap,
            ro_binds=self._ro_binds,
            capabilities=self.capabilities,
            logger=self._logger,
            env=self.env.get(),
        )

    async def destroy(self) -> None:
        await self.process.kill_all()
        await asyncio.to_thread(_teardown, self._state, self._meta, self._logger)


def _teardown(state: str, meta: _Meta, logger: Logger | None) -> None:
    _kill_sandbox_processes(state)
    if not meta.owned_workspace and os.path.isdir(state):
        # The user's workspace stays; only our state goes.
        remove_tree_with_retry(os.path.join(state, "tmp"), logger)
        with _suppress_missing():
            os.unlink(os.path.join(state, "sandbox.json"))
        with _suppress_missing():
            os.rmdir(state)
        return
    remove_tree_with_retry(state, logger)


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, FileNotFoundError)


def _write_meta(state: str, meta: _Meta) -> None:
    os.makedirs(os.path.join(state, "tmp", "home"), exist_ok=True)
    with open(os.path.join(state, "sandbox.json"), "wb") as f:
        f.write(msgspec.json.encode(meta))


class BubblewrapProvider:
    name = NAME
    restore_snapshot = None

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        network: Literal["allow", "deny"] = "allow",
        ro_binds: Sequence[str] = (),
        bwrap: str = "bwrap",
        logger: Logger | None = None,
    ) -> None:
        self._dir = os.path.realpath(dir) if dir is not None else None
        self._base_dir = os.path.realpath(base_dir or os.path.join(tempfile.gettempdir(), "boxwright-bwrap"))
        self._network = network
        self._ro_binds = tuple(os.path.realpath(p) for p in ro_binds)
        self._bwrap = bwrap
        self._logger = logger if logger is not None else StdlibLogger("boxwright.providers.bubblewrap")

    @property
    def probe(self) -> Probe:
        return probe(self._bwrap)

    def capabilities(self) -> Capabilities:
        return _capabilities(self.probe)

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider (its "image"): a change means a new sandbox."""
        return {"network": self._network, "roBinds": list(self._ro_binds)}

    def _handle(self, state: str, meta: _Meta, env: Mapping[str, str] | None) -> BubblewrapHandle:
        return BubblewrapHandle(
            state,
            meta,
            base_dir=self._base_dir,
            bwrap=shutil.which(self._bwrap) or self._bwrap,
            ro_binds=self._ro_binds,
            capabilities=self.capabilities(),
            logger=self._logger,
            env=env,
        )

    async def create(self, input: CreateInput | None = None) -> BubblewrapHandle:
        input = input or CreateInput()
        if input.signal is not None:
            input.signal.throw_if_aborted()
        found = await asyncio.to_thread(probe, self._bwrap)
        if not found.available:
            raise ProviderUnavailableError(NAME, found.reason, INSTALL_HELP)
        network = self._network
        if input.network is not None:
            if input.network.mode == "deny" and input.network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "bubblewrap can deny all egress, not allow a list of hosts"
                )
            network = input.network.mode
        if network == "deny" and not found.network_deny:
            raise UnsupportedCapabilityError(NAME, "network_policy", "bwrap --unshare-net does not work here")
        if self._dir is not None and os.path.exists(self._dir) and not os.path.isdir(self._dir):
            raise SandboxPathError(self._dir, self._dir, "is a file, not a directory; it cannot be the workspace root")
        state = os.path.join(self._base_dir, uuid.uuid4().hex)
        workspace = self._dir or os.path.join(state, "workspace")
        os.makedirs(workspace, exist_ok=True)
        meta = _Meta(workspace=workspace, owned_workspace=self._dir is None, network=network)
        _write_meta(state, meta)
        return self._handle(state, meta, input.env)

    async def resume(self, input: ResumeInput) -> BubblewrapHandle | None:
        try:
            with open(os.path.join(input.id, "sandbox.json"), "rb") as f:
                meta = msgspec.json.decode(f.read(), type=_Meta)
        except FileNotFoundError:
            return None
        if not os.path.isdir(meta.workspace):
            return None
        return self._handle(input.id, meta, None)

    async def destroy(self, input: DestroyInput) -> None:
        try:
            with open(os.path.join(input.id, "sandbox.json"), "rb") as f:
                meta = msgspec.json.decode(f.read(), type=_Meta)
        except FileNotFoundError:
            return
        await asyncio.to_thread(_teardown, input.id, meta, self._logger)


def bubblewrap_sandbox(
    dir: str | os.PathLike[str] | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    network: Literal["allow", "deny"] = "allow",
    ro_binds: Sequence[str] = (),
    bwrap: str = "bwrap",
    logger: Logger | None = None,
) -> BubblewrapProvider:
    """A provider that isolates each command with ``bwrap``: the workspace is its only writable bind.

    ``ro_binds`` adds host paths visible read-only at the same place (an agent CLI
    installed outside ``/usr``, say); ``network="deny"`` unshares the network.
    """
    return BubblewrapProvider(dir, base_dir=base_dir, network=network, ro_binds=ro_binds, bwrap=bwrap, logger=logger)
