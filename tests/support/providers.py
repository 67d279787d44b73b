"""Providers for lifecycle tests, built on the real local-process provider.

``SpyProvider`` records every call and delegates; ``SnapshottingProvider`` adds
real snapshots (a copy of the workspace tree on disk) to local-process, which
has none, so ensure()'s restore path runs against real files.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from boxwright.errors import UnsupportedCapabilityError
from boxwright.providers.local_process import LocalProcessHandle, LocalProcessProvider
from boxwright.sandbox import Capabilities, CreateInput, DestroyInput, RestoreInput, ResumeInput, SnapshotRef


@dataclass
class SpyProvider:
    inner: Any
    calls: list[tuple[str, Any]] = field(default_factory=list)
    fail_destroy: bool = False

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def restore_snapshot(self) -> Any:
        inner = self.inner.restore_snapshot
        if inner is None:
            return None

        async def restore(input: RestoreInput) -> Any:
            self.calls.append(("restore", input))
            return await inner(input)

        return restore

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()  # type: ignore[no-any-return]

    @property
    def resumes_by_id(self) -> bool:
        return getattr(self.inner, "resumes_by_id", True) is not False

    def count(self, what: str) -> int:
        return sum(1 for name, _ in self.calls if name == what)

    async def create(self, input: CreateInput | None = None) -> Any:
        self.calls.append(("create", input))
        return await self.inner.create(input)

    async def resume(self, input: ResumeInput) -> Any:
        self.calls.append(("resume", input))
        return await self.inner.resume(input)

    async def destroy(self, input: DestroyInput) -> None:
        self.calls.append(("destroy", input))
        if self.fail_destroy:
            raise RuntimeError("destroy failed on purpose")
        await self.inner.destroy(input)


class ResumingLocalProvider(LocalProcessProvider):
    """Local-process with resume by id: stands in for a provider that has it (Docker, E2B, ...)
    where a test is about ensure()'s resume path. The real local-process has none (decision 5)."""

    name = "local-resuming"
    resumes_by_id = True


class SnapshotHandle(LocalProcessHandle):
    capabilities = msgspec.structs.replace(LocalProcessHandle.capabilities, snapshots=True)
    snapshot_dir = ""
    fail_snapshot = False

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        if self.fail_snapshot:
            raise UnsupportedCapabilityError(self.provider, "snapshot", "failing on purpose")
        target = os.path.join(self.snapshot_dir, f"{uuid.uuid4().hex}-{label or 'snap'}")
        await asyncio.to_thread(shutil.copytree, self.workspace_root, target, symlinks=True)
        return SnapshotRef(id=target, label=label)


class SnapshottingProvider(LocalProcessProvider):
    name = "local-snapshots"
    resumes_by_id = True  # as the providers with snapshots do

    def __init__(self, base_dir: str, *, fail_snapshot: bool = False) -> None:
        super().__init__(base_dir=base_dir)
        self._snapshots = os.path.join(base_dir, "snapshots")
        os.makedirs(self._snapshots, exist_ok=True)
        self.fail_snapshot = fail_snapshot
        self.restore_snapshot = self._restore  # type: ignore[assignment]

    def capabilities(self) -> Capabilities:
        return SnapshotHandle.capabilities

    def _handle(self, root: str, env: Any = None, owned: bool | None = None) -> SnapshotHandle:
        handle = SnapshotHandle(
            root, owned=True, base_dir=self._base_dir, scrub_env=self._scrub, logger=self._logger, env=env
        )
        handle.snapshot_dir = self._snapshots
        handle.fail_snapshot = self.fail_snapshot
        return handle

    async def _restore(self, input: RestoreInput) -> SnapshotHandle:
        handle = await self.create(CreateInput(env=input.env))
        await asyncio.to_thread(
            shutil.copytree, input.snapshot_id, handle.workspace_root, symlinks=True, dirs_exist_ok=True
        )
        return handle  # type: ignore[return-value]
