"""The provider contract: what every sandbox provider and handle offers.

A provider creates, resumes and destroys sandboxes; a handle is one live
sandbox with its file system, processes, git, ports and env. Providers are
structural (``typing.Protocol``): a user's own provider needs no base class,
only these methods, and the conformance suite in ``boxwright.testkit``.

Paths: ``/workspace[/x]`` names the workspace inside the sandbox; each
provider maps it onto its ``workspace_root``.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from .abort import AbortSignal

WORKSPACE = "/workspace"


class Capabilities(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a provider promises. No field has a default: a provider states every flag.

    An omitted ``killable_processes`` read as true would give the journal a
    ``tail -f`` nobody can stop, so there is no default to fall back on.
    """

    fs: bool
    exec: bool
    env: bool
    ports: bool
    background_processes: bool
    writable_stdin: bool
    killable_processes: bool
    snapshots: bool
    network_policy: bool
    durable_filesystem: bool
    fork: bool


class ExecResult(msgspec.Struct, frozen=True, rename="camel"):
    stdout: str
    stderr: str
    exit_code: int


class ProcessOptions(msgspec.Struct, kw_only=True):
    """Per-command options. ``cwd`` defaults to the workspace root; ``env`` merges over the sandbox env."""

    cwd: str | None = None
    env: Mapping[str, str] | None = None
    signal: AbortSignal | None = None


class FsEntry(msgspec.Struct, frozen=True):
    name: str
    path: str
    type: Literal["file", "dir"]


class FsStat(msgspec.Struct, frozen=True):
    """``lstat`` of a path: the link itself, never its target. ``mode`` is the full ``st_mode``."""

    type: Literal["file", "dir", "symlink", "other"]
    mode: int
    size: int | None = None


class SandboxChannel(msgspec.Struct, frozen=True, omit_defaults=True):
    """How to reach a port of the sandbox; ``headers`` are the provider's, sent verbatim."""

    url: str
    token: str | None = None
    headers: dict[str, str] | None = None


class SnapshotRef(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    label: str | None = None


class NetworkPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Egress rule applied at create. A provider that cannot enforce ``deny`` refuses it."""

    mode: Literal["allow", "deny"] = "allow"
    allow_hosts: tuple[str, ...] = ()


class CreateInput(msgspec.Struct, kw_only=True):
    id: str | None = None
    workspace: Any = None
    network: NetworkPolicy | None = None
    env: Mapping[str, str] | None = None
    signal: AbortSignal | None = None
    adapter_name: str | None = None


class ResumeInput(msgspec.Struct, kw_only=True):
    id: str
    signal: AbortSignal | None = None


class RestoreInput(msgspec.Struct, kw_only=True):
    snapshot_id: str
    workspace: Any = None
    network: NetworkPolicy | None = None
    env: Mapping[str, str] | None = None
    signal: AbortSignal | None = None


class DestroyInput(msgspec.Struct, kw_only=True):
    id: str
    signal: AbortSignal | None = None


# -- handle parts ---------------------------------------------------------------------------------


class SandboxFs(Protocol):
    async def read(self, path: str) -> str: ...
    async def read_bytes(self, path: str) -> bytes: ...
    async def write(self, path: str, data: str | bytes) -> None: ...
    async def list(self, path: str) -> builtins.list[FsEntry]: ...
    async def mkdir(self, path: str) -> None: ...
    async def remove(self, path: str) -> None: ...
    async def rename(self, src: str, dst: str) -> None: ...
    async def exists(self, path: str) -> bool: ...
    async def lstat(self, path: str) -> FsStat | None: ...

    # Native change events, or None: the framework then polls with `find`.
    @property
    def watch(self) -> NativeWatch | None: ...


class FileChange(msgspec.Struct, frozen=True):
    """One change seen by a native watcher; ``path`` is relative to the watched directory."""

    type: Literal["create", "change", "delete"]
    path: str


# watch(path, stop) yields batches of changes under ``path`` until ``stop`` is set.
NativeWatch = Callable[[str, asyncio.Event], AsyncIterator[builtins.list[FileChange]]]


class StdinWriter(Protocol):
    async def write(self, data: str | bytes) -> None: ...
    async def end(self) -> None: ...


class SpawnHandle(Protocol):
    """A running process. ``stdout``/``stderr`` are single-consumer iterators of decoded text."""

    @property
    def pid(self) -> int: ...
    @property
    def stdout(self) -> AsyncIterator[str]: ...
    @property
    def stderr(self) -> AsyncIterator[str]: ...
    @property
    def stdin(self) -> StdinWriter: ...

    async def wait(self) -> int: ...
    async def kill(self, sig: int | None = None) -> None: ...


class SandboxProcesses(Protocol):
    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult: ...
    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> SpawnHandle: ...


class SandboxGit(Protocol):
    async def clone(
        self,
        url: str,
        dir: str,
        *,
        ref: str | None = None,
        auth: Mapping[str, str] | None = None,
        depth: int | Literal["full"] = 1,
    ) -> None: ...
    async def status(self, dir: str = WORKSPACE) -> str: ...
    async def add(self, paths: Sequence[str], dir: str = WORKSPACE) -> None: ...
    async def commit(self, message: str, dir: str = WORKSPACE) -> None: ...
    async def push(self, dir: str = WORKSPACE, *, auth: Mapping[str, str] | None = None) -> None: ...
    async def pull(self, dir: str = WORKSPACE, *, auth: Mapping[str, str] | None = None) -> None: ...
    async def branch(self, dir: str = WORKSPACE) -> str: ...


class SandboxPorts(Protocol):
    async def connect(self, port: int) -> SandboxChannel: ...


class SandboxEnv(Protocol):
    def set(self, values: Mapping[str, str]) -> None: ...
    def get(self) -> dict[str, str]: ...


@runtime_checkable
class SandboxHandle(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def workspace_root(self) -> str: ...
    @property
    def capabilities(self) -> Capabilities: ...
    @property
    def fs(self) -> SandboxFs: ...
    @property
    def git(self) -> SandboxGit: ...
    @property
    def process(self) -> SandboxProcesses: ...
    @property
    def ports(self) -> SandboxPorts: ...
    @property
    def env(self) -> SandboxEnv: ...

    async def snapshot(self, label: str | None = None) -> SnapshotRef: ...
    async def fork(self) -> SandboxHandle: ...
    async def destroy(self) -> None: ...


RestoreSnapshot = Callable[[RestoreInput], Awaitable[SandboxHandle]]


@runtime_checkable
class SandboxProvider(Protocol):
    @property
    def name(self) -> str: ...
    # None when the provider cannot restore (Sprites checkpoints restore in place).
    @property
    def restore_snapshot(self) -> RestoreSnapshot | None: ...

    def capabilities(self) -> Capabilities: ...
    async def create(self, input: CreateInput | None = None) -> SandboxHandle: ...
    async def resume(self, input: ResumeInput) -> SandboxHandle | None: ...
    async def destroy(self, input: DestroyInput) -> None: ...


@runtime_checkable
class ListsForKey(Protocol):
    """Optional: a provider that can list the sandboxes it created for one instance key.

    ``key`` is the ``CreateInput.id`` a create was given (Docker's ``boxwright.sandbox`` label, a
    cloud sandbox's metadata). ``ensure`` calls it holding that key's lock with no record naming
    them: a creator that died inside its create left them, and they would bill until a reaper's
    lease ran out. Returns ids ``destroy`` accepts, every page, none already being torn down, of
    any owner host (the lock, not the host, says nobody else is creating under the key). Absent
    where a leftover is not a billed box (local-process, bubblewrap: a dead process's directory),
    and where a fork keeps its parent's key (E2B's fork copies the metadata): a user's fork is no
    leftover, and nothing listed tells it apart.
    """

    async def list_for_key(self, key: str) -> builtins.list[str]: ...


def journal_read_strategy(caps: Capabilities) -> Literal["follow", "poll"]:
    """``follow`` (a ``tail -f`` we can kill) only where processes stream and are killable."""
    return "follow" if caps.background_processes and caps.killable_processes else "poll"
