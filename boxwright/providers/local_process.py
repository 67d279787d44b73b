"""Local process: commands run as children of this process, in a directory. No isolation.

For trusted or dev work only. The harness inherits the host env (with whatever
API keys are exported there); ``scrub_env`` deletes keys so a host CLI login
wins over them. No snapshots, and no resume by id (seed 000, decision 5): ``ensure()`` never
resumes a local-process sandbox, each run creates and bootstraps it again under the same
identity, which names the same directory (``<base_dir>/<instance key>``, or the fixed ``dir``),
so the thread's files stay and setup runs again. ``resume()`` remains only as a handle on a
directory that still exists, for what works beside a run's lifecycle (the reaper's probe).

The host ``/tmp`` is everybody's, so journals do not live in it: each sandbox has a
private state directory ``<base_dir>.state/<sha256(root)>`` (both levels 0700 and this
user's), outside the workspace so it never shows in git, and beside ``base_dir`` so that
stays one entry per sandbox. It is named by the root, so a process resuming the same root
finds the same journals, and destroy removes it even when the workspace directory is the user's.

A durable run's agent outlives the host that spawned it (its own session; the journal keeps its
output), so the state dir also records every process group a handle spawns (``processes/``, see
``_posix.ProcessRecord``): destroy by id, or a later handle's destroy, kills those still alive first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Mapping, Sequence

from ..errors import SandboxNotFoundError, SandboxPathError, UnsupportedCapabilityError
from ..git_exec import ExecGit
from ..sandbox import (
    Capabilities,
    CreateInput,
    DestroyInput,
    ResumeInput,
    SnapshotRef,
)
from ._hostfs import HostFs, PathMap
from ._posix import (
    HandleEnv,
    HostProcesses,
    LocalPorts,
    Logger,
    ProcessRecord,
    StdlibLogger,
    merged_env,
    remove_tree_with_retry,
)

NAME = "local-process"

CAPABILITIES = Capabilities(
    fs=True,
    exec=True,
    env=True,
    ports=True,
    background_processes=True,
    writable_stdin=True,
    # Measured by the conformance kill cases: the process group dies, backgrounded children too.
    killable_processes=True,
    snapshots=False,
    network_policy=False,
    durable_filesystem=True,
    fork=True,
)


def default_base_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "boxwright-sandboxes")


def state_dir_for(base_dir: str, root: str) -> str:
    """The private state directory of the sandbox at ``root``: derived, so every host agrees."""
    digest = hashlib.sha256(os.path.realpath(root).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(base_dir.rstrip(os.sep) + ".state", digest)


def _ensure_private_dir(path: str) -> None:
    """``path`` and its parent as 0700 directories of this user. Either one a symlink or someone
    else's is refused: under a shared /tmp another user can pre-create the predictable names, or
    swap an entry of a parent they may write, to read the journals."""
    for level in (os.path.dirname(path), path):
        os.makedirs(os.path.dirname(level), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(level, 0o700)
        info = os.lstat(level)
        owner = os.geteuid() if hasattr(os, "geteuid") else info.st_uid
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != owner:
            raise SandboxPathError(
                level,
                os.path.dirname(level),
                "is not a directory of this user (a symlink, a file, or another user's), so it cannot hold "
                "the sandbox's journals; remove it, or give the provider a base_dir of your own, under",
            )
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(level, 0o700)


class LocalProcessHandle:
    provider = NAME
    capabilities = CAPABILITIES

    def __init__(
        self,
        root: str,
        *,
        owned: bool,
        base_dir: str,
        scrub_env: Sequence[str],
        logger: Logger | None,
        env: Mapping[str, str] | None = None,
        is_fork: bool = False,
    ) -> None:
        self.id = root
        self.workspace_root = root
        self._owned = owned
        self._base_dir = base_dir
        self._state_dir = state_dir_for(base_dir, root)
        _ensure_private_dir(self._state_dir)
        # Read by journal_dir_of: this sandbox's journals, never the host's shared /tmp.
        self.journal_dir = os.path.join(self._state_dir, "journals")
        self._scrub = tuple(scrub_env)
        self._logger = logger
        self._is_fork = is_fork
        self._paths = PathMap([("/workspace", root)], fallback=root)
        self.env = HandleEnv(env)
        self.fs = HostFs(self._paths)
        record = process_record_of(self._state_dir, logger)
        record.prepare()
        self.process = HostProcesses(self._launch, logger, record)
        self.git = ExecGit(self.process, shell_path=self._paths.host)
        self.ports = LocalPorts()
        self._destroyed = False

    def _launch(
        self, command: str, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[list[str], str, dict[str, str]]:
        if not os.path.isdir(self.workspace_root):
            raise SandboxNotFoundError(NAME, self.id, "has no workspace root any more (the directory is gone)")
        host_cwd = self._paths.host(cwd) if cwd else self.workspace_root
        if not os.path.isdir(host_cwd):
            raise SandboxPathError(cwd or host_cwd, self.workspace_root, "is not a directory inside")
        return ["sh", "-c", command], host_cwd, merged_env(os.environ, self.env.get(), env, self._scrub)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshot", "local-process keeps no snapshots; each run bootstraps")

    async def fork(self) -> LocalProcessHandle:
        if self._is_fork:
            raise UnsupportedCapabilityError(NAME, "fork", "a fork cannot be forked again")
        target = os.path.join(self._base_dir, f"fork-{uuid.uuid4().hex}")
        await asyncio.to_thread(shutil.copytree, self.workspace_root, target, symlinks=True)
        return LocalProcessHandle(
            target,
            owned=True,
            base_dir=self._base_dir,
            scrub_env=self._scrub,
            logger=self._logger,
            env=self.env.get(),
            is_fork=True,
        )

    async def destroy(self) -> None:
        # Kill first even when the directory is kept: a destroyed sandbox runs nothing.
        await self.process.kill_all()
        if not self._destroyed:
            # The state dir (journals: raw agent output) is ours even when the workspace is the user's.
            await asyncio.to_thread(remove_tree_with_retry, self._state_dir, self._logger)
        if self._owned and not self._destroyed:
            await asyncio.to_thread(remove_tree_with_retry, self.workspace_root, self._logger)
        self._destroyed = True


class LocalProcessProvider:
    name = NAME
    restore_snapshot = None
    # Read by ensure(): a run creates again under the same identity instead of resuming.
    resumes_by_id = False

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        remove_on_destroy: bool | None = None,
        scrub_env: Sequence[str] = (),
        logger: Logger | None = None,
    ) -> None:
        self._dir = os.path.abspath(dir) if dir is not None else None
        self._base_dir = os.path.abspath(base_dir) if base_dir is not None else default_base_dir()
        # A generated directory is ours to remove; a directory the user named is not, unless told.
        self._remove = remove_on_destroy if remove_on_destroy is not None else dir is None
        self._scrub = tuple(scrub_env)
        self._logger = logger if logger is not None else StdlibLogger("boxwright.providers.local_process")

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def instance_identity(self) -> dict[str, object]:
        """Where this provider's sandboxes live: another place means another sandbox."""
        return {"dir": self._dir, "baseDir": self._base_dir}

    def _handle(self, root: str, env: Mapping[str, str] | None = None, owned: bool | None = None) -> LocalProcessHandle:
        return LocalProcessHandle(
            root,
            owned=self._remove if owned is None else owned,
            base_dir=self._base_dir,
            scrub_env=self._scrub,
            logger=self._logger,
            env=env,
        )

    async def create(self, input: CreateInput | None = None) -> LocalProcessHandle:
        input = input or CreateInput()
        if input.signal is not None:
            input.signal.throw_if_aborted()
        if input.network is not None and input.network.mode == "deny":
            raise UnsupportedCapabilityError(
                NAME, "network_policy", "local-process cannot deny network; use bubblewrap_sandbox(network='deny')"
            )
        # The same identity (ensure's instance key) is the same directory: creating again finds it.
        root = self._dir or os.path.join(self._base_dir, _dir_name(input.id) if input.id else uuid.uuid4().hex)
        if os.path.exists(root) and not os.path.isdir(root):
            raise SandboxPathError(root, root, "is a file, not a directory; it cannot be the workspace root")
        os.makedirs(root, exist_ok=True)
        return self._handle(os.path.realpath(root), input.env)

    def _is_own(self, path: str) -> bool:
        """The fixed ``dir``, or a directory under ``base_dir``: what this provider creates."""
        return (self._dir is not None and _same(path, self._dir)) or _within(path, self._base_dir)

    async def resume(self, input: ResumeInput) -> LocalProcessHandle | None:
        if not os.path.isdir(input.id):
            return None
        # Only a directory this provider would remove itself is owned: destroying a resumed
        # foreign directory (any existing path resumes) must not delete the user's files.
        return self._handle(input.id, owned=self._remove and self._is_own(input.id))

    async def destroy(self, input: DestroyInput) -> None:
        # No handle here, but the record names what every handle of this sandbox spawned (a dead host's
        # durable agent too): killed first, then the state dir, and the directory only if we own it.
        state_dir = state_dir_for(self._base_dir, input.id)
        await process_record_of(state_dir, self._logger).kill_all()
        await asyncio.to_thread(remove_tree_with_retry, state_dir, self._logger)
        if self._remove and self._is_own(input.id):
            await asyncio.to_thread(remove_tree_with_retry, input.id, self._logger)


def process_record_of(state_dir: str, logger: Logger | None) -> ProcessRecord:
    """Where the process groups of the sandbox whose state dir is ``state_dir`` are recorded."""
    return ProcessRecord(os.path.join(state_dir, "processes"), logger)


def _dir_name(id: str) -> str:
    """``id`` as one safe path component: itself when it is one, else a digest of it."""
    if _SAFE_NAME.fullmatch(id):
        return id
    return "id-" + hashlib.sha256(id.encode("utf-8", "surrogateescape")).hexdigest()[:32]


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _within(path: str, root: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def local_process_sandbox(
    dir: str | os.PathLike[str] | None = None,
    scrub_env: Sequence[str] = (),
    logger: Logger | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    remove_on_destroy: bool | None = None,
) -> LocalProcessProvider:
    """A provider that runs commands on this host in ``dir`` (or a fresh directory per sandbox)."""
    return LocalProcessProvider(
        dir, base_dir=base_dir, remove_on_destroy=remove_on_destroy, scrub_env=scrub_env, logger=logger
    )
