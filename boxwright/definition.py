"""define_sandbox, the instance key, ensure(), and the lifecycle of one run's sandbox.

A definition is lazy: nothing happens until ``ensure`` finds the sandbox for a
thread again (resume), brings it back from a snapshot (restore) or makes a new
one (create + bootstrap), in that order and under a per-key lock, so two
callers for the same thread never create two sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from ._faults import fault_point
from .abort import AbortSignal
from .errors import EpochFencedError
from .file_hooks import FileHook
from .policy import SandboxPolicy, network_policy_for
from .sandbox import (
    CreateInput,
    DestroyInput,
    ListsForKey,
    RestoreInput,
    ResumeInput,
    SandboxHandle,
    SandboxProvider,
)
from .secrets import resolve_all_secrets
from .stores.base import (
    DEFAULT_LEASE_TTL_MS,
    InstanceRecord,
    LockStore,
    SandboxInstanceStore,
    hold_lock,
    warn_if_not_durable,
)
from .stores.memory import MemoryInstanceStore, MemoryLockStore
from .workspace import BootstrapResult, Workspace, bootstrap, stable_hash, workspace_hash

log = logging.getLogger("boxwright.definition")

DESTROY_TIMEOUT_S = 60.0
SnapshotMode = Literal["after-setup", "after-run", "none"]
Outcome = Literal["resumed", "native-restored", "created"]


class Lifecycle(msgspec.Struct, frozen=True, kw_only=True):
    reuse: Literal["thread", "none"] = "thread"
    # None: "after-setup" where the provider has snapshots, else "none".
    snapshot: SnapshotMode | None = None
    keep_alive: str | None = None
    destroy_on_complete: bool = False
    snapshot_max_age: str | None = None

    def __post_init__(self) -> None:
        if self.keep_alive is not None:
            # Accepting it and doing nothing would let an app believe its sandboxes expire.
            raise ValueError(
                f"Lifecycle(keep_alive={self.keep_alive!r}) is not supported: boxwright has no idle timer, a "
                "completed run's sandbox stays until it is destroyed (destroy_on_complete=True destroys it after "
                "every run); leave keep_alive unset"
            )


HandleHook = Callable[[SandboxHandle], Awaitable[None] | None]
ErrorHook = Callable[[BaseException], Awaitable[None] | None]
PlainHook = Callable[[], Awaitable[None] | None]


@dataclass(frozen=True)
class SandboxHooks:
    """Lifecycle hooks, and file-event hooks called for every run's workspace events (``file_hooks``)."""

    on_ready: HandleHook | None = None
    on_error: ErrorHook | None = None
    on_destroy: PlainHook | None = None
    on_file: FileHook | None = None
    on_file_create: FileHook | None = None
    on_file_change: FileHook | None = None
    on_file_delete: FileHook | None = None


class Tenant(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    user_id: str | None = None
    org_id: str | None = None


@dataclass
class EnsureContext:
    thread_id: str
    run_id: str
    store: SandboxInstanceStore | None = None
    locks: LockStore | None = None
    tenant: Tenant | None = None
    signal: AbortSignal | None = None
    adapter_name: str | None = None
    # The sandbox lock's lease (renewed while held): how long a host that died inside ``ensure`` keeps
    # others out of the sandbox. A service passes its run lease, so a successor waits that out, not more.
    lock_ttl_ms: int = DEFAULT_LEASE_TTL_MS


@dataclass
class EnsureResult:
    handle: SandboxHandle
    key: str
    outcome: Outcome
    bootstrap: BootstrapResult | None = None


# -- where records and locks live (R37): explicit option > ambient > one in-memory default ---------

_process_store = MemoryInstanceStore()
_process_locks = MemoryLockStore()
_ambient: ContextVar[tuple[SandboxInstanceStore | None, LockStore | None]] = ContextVar(
    "boxwright_sandbox_stores", default=(None, None)
)


@contextlib.contextmanager
def provide_sandbox_stores(store: SandboxInstanceStore | None = None, locks: LockStore | None = None) -> Iterator[None]:
    """Make ``store``/``locks`` the ambient ones for code run inside this block (a platform layer's seam)."""
    token = _ambient.set((store, locks))
    try:
        yield None
    finally:
        _ambient.reset(token)


def _stores(ctx: EnsureContext) -> tuple[SandboxInstanceStore, LockStore]:
    ambient_store, ambient_locks = _ambient.get()
    store = next(s for s in (ctx.store, ambient_store, _process_store) if s is not None)
    locks = next(lk for lk in (ctx.locks, ambient_locks, _process_locks) if lk is not None)
    return store, locks


def parse_max_age(value: str | None) -> float | None:
    """``<n>h`` or ``<n>m`` in seconds; anything else is unset, with a warning (R34)."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([hm])\s*", value)
    if match is None:
        log.warning("snapshot_max_age %r is not <n>h or <n>m; ignored", value)
        return None
    return int(match[1]) * (3600 if match[2] == "h" else 60)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _maybe_await(result: Awaitable[None] | None) -> None:
    if result is not None:
        await result


@dataclass(frozen=True)
class SandboxDefinition:
    id: str
    provider: SandboxProvider
    workspace: Workspace | None = None
    policy: SandboxPolicy | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    hooks: SandboxHooks = field(default_factory=SandboxHooks)
    file_events: bool = True

    # -- identity --------------------------------------------------------------------------------

    def workspace_hash(self) -> str:
        return workspace_hash(self.workspace)

    def instance_key(self, ctx: EnsureContext) -> str:
        """Hash of thread, sandbox id, provider, workspace and tenant; never a secret value (R32)."""
        thread = ctx.thread_id if self.lifecycle.reuse == "thread" else f"{ctx.thread_id}:{ctx.run_id}"
        tenant = msgspec.to_builtins(ctx.tenant) if ctx.tenant is not None else None
        return stable_hash(
            {
                "threadId": thread,
                "sandboxId": self.id,
                "providerName": _provider_identity(self.provider),
                "workspaceHash": self.workspace_hash(),
                "tenant": tenant or None,
            }
        )

    def snapshot_mode(self) -> SnapshotMode:
        if self.lifecycle.snapshot is not None:
            return self.lifecycle.snapshot
        return "after-setup" if self.provider.capabilities().snapshots else "none"

    # -- ensure (R33) ----------------------------------------------------------------------------

    async def ensure(self, ctx: EnsureContext) -> EnsureResult:
        store, locks = _stores(ctx)
        key = self.instance_key(ctx)

        async with hold_lock(locks, f"sandbox:{key}", ttl_ms=ctx.lock_ttl_ms):
            stored = await store.get(key)
            record = self._if_fresh(stored)
            if record is not None:
                # A provider without resume by id (local-process, decision 5) creates again instead.
                found = await self._resume(store, record, ctx) if _resumes_by_id(self.provider) else None
                if found is not None:
                    return found
                restored = await self._restore(store, record, ctx)
                if restored is not None:
                    return restored
            if locks.durable:
                await self._destroy_unrecorded(key, stored)
            fault_point("sandbox.create")  # a host dying here holds the lock until its lease runs out
            return await self._create(store, key, ctx)

    async def ensure_existing(self, ctx: EnsureContext) -> EnsureResult | None:
        """Resume only: ``None`` for a missing or stale record or a failed resume (R35)."""
        store, locks = _stores(ctx)
        key = self.instance_key(ctx)

        async with hold_lock(locks, f"sandbox:{key}", ttl_ms=ctx.lock_ttl_ms):
            record = await self._fresh_record(store, key)
            return None if record is None else await self._resume(store, record, ctx)

    async def destroy(self, ctx: EnsureContext, handle: SandboxHandle | None = None) -> None:
        """Destroy the recorded sandbox under a fresh 60 s scope, then forget it (R36).

        Never bounded by the caller's signal or task: a cancelled run must still
        tear down what it is billed for. A raising destroy keeps the record.
        With the live ``handle``, it is destroyed first: only a handle knows the
        processes it started (a provider-level destroy of local-process kills nothing).
        """
        store, _ = _stores(ctx)
        key = self.instance_key(ctx)
        record = await store.get(key)
        if handle is not None:
            await _detached(_destroy_handle(handle))
        if record is None:
            return
        await _detached(self._destroy_record(store, record))

    async def _destroy_record(self, store: SandboxInstanceStore, record: InstanceRecord) -> None:
        await asyncio.wait_for(self.provider.destroy(DestroyInput(id=record.provider_sandbox_id)), DESTROY_TIMEOUT_S)
        await store.delete(record.key)

    async def _destroy_unrecorded(self, key: str, stored: InstanceRecord | None) -> None:
        """Destroy the sandboxes of ``key`` no record names: a creator that died inside ``_create``.

        Called holding the key's lock, and only a lock that holds across processes: then nobody
        else can be creating under the key, so a sandbox of it that no record names was left by a
        creator that died between the provider's create and the record's write (bootstrap and the
        after-setup snapshot run in between), and would bill until a reaper's lease ran out.
        Destroyed, not adopted: its bootstrap may be half done. An in-process lock proves nothing
        about another process, so it sweeps nothing. A failure here never fails the run: the
        leftover stays for the reaper, as before.
        """
        if not isinstance(self.provider, ListsForKey):
            return
        spared = stored.provider_sandbox_id if stored is not None else None
        try:
            left = [i for i in await self.provider.list_for_key(key) if i != spared]
        except Exception as exc:
            log.warning("sandbox %s: could not list the sandboxes a dead creator may have left: %s", key, exc)
            return
        destroyed: list[str] = []
        for sandbox_id in left:
            try:
                await _detached(_destroy_id(self.provider, sandbox_id))
            except Exception as exc:
                log.warning(
                    "sandbox %s: could not destroy %s, left unrecorded by a dead creator: %s", key, sandbox_id, exc
                )
            else:
                destroyed.append(sandbox_id)
        if destroyed:
            log.warning(
                "sandbox %s: destroyed %s, created under this key's lock but never recorded (its creator died)",
                key,
                ", ".join(destroyed),
            )

    def _if_fresh(self, record: InstanceRecord | None) -> InstanceRecord | None:
        max_age = parse_max_age(self.lifecycle.snapshot_max_age)
        if record is not None and max_age is not None and _now_ms() - record.updated_at > max_age * 1000:
            return None
        return record

    async def _fresh_record(self, store: SandboxInstanceStore, key: str) -> InstanceRecord | None:
        return self._if_fresh(await store.get(key))

    def _secrets(self) -> dict[str, str]:
        return resolve_all_secrets(self.workspace.secrets) if self.workspace is not None else {}

    def _reapply_secrets(self, handle: SandboxHandle) -> None:
        secrets = self._secrets()
        if secrets:
            handle.env.set(secrets)

    async def _resume(
        self, store: SandboxInstanceStore, record: InstanceRecord, ctx: EnsureContext
    ) -> EnsureResult | None:
        handle = await self.provider.resume(ResumeInput(id=record.provider_sandbox_id, signal=ctx.signal))
        if handle is None:
            return None
        self._reapply_secrets(handle)
        await store.upsert(msgspec.structs.replace(record, latest_run_id=ctx.run_id, updated_at=_now_ms()))
        return EnsureResult(handle, record.key, "resumed")

    async def _restore(
        self, store: SandboxInstanceStore, record: InstanceRecord, ctx: EnsureContext
    ) -> EnsureResult | None:
        restore = self.provider.restore_snapshot
        if record.latest_snapshot_id is None or restore is None or not self.provider.capabilities().snapshots:
            return None
        handle = await restore(
            RestoreInput(
                snapshot_id=record.latest_snapshot_id,
                workspace=self.workspace,
                network=network_policy_for(self.policy),
                env=self._secrets(),
                signal=ctx.signal,
            )
        )
        self._reapply_secrets(handle)
        await store.upsert(
            msgspec.structs.replace(
                record, provider_sandbox_id=handle.id, latest_run_id=ctx.run_id, updated_at=_now_ms()
            )
        )
        return EnsureResult(handle, record.key, "native-restored")

    async def _create(self, store: SandboxInstanceStore, key: str, ctx: EnsureContext) -> EnsureResult:
        handle = await self.provider.create(
            CreateInput(
                id=key,
                workspace=self.workspace,
                network=network_policy_for(self.policy),
                env=self._secrets(),
                signal=ctx.signal,
                adapter_name=ctx.adapter_name,
            )
        )
        snapshot_id: str | None = None
        try:
            result = await bootstrap(handle, self.workspace, signal=ctx.signal) if self.workspace else None
            if self.snapshot_mode() == "after-setup" and handle.capabilities.snapshots:
                snapshot_id = (await handle.snapshot("after-setup")).id
        except BaseException:
            # An orphan would run (and bill) forever: destroy it, then report the real failure.
            with contextlib.suppress(Exception):
                await _detached(_destroy_handle(handle))
            raise
        await store.upsert(
            InstanceRecord(
                key=key,
                provider=self.provider.name,
                provider_sandbox_id=handle.id,
                thread_id=ctx.thread_id,
                updated_at=_now_ms(),
                latest_snapshot_id=snapshot_id,
                latest_run_id=ctx.run_id,
            )
        )
        return EnsureResult(handle, key, "created", result)


def _resumes_by_id(provider: SandboxProvider) -> bool:
    return getattr(provider, "resumes_by_id", True) is not False


def _provider_identity(provider: SandboxProvider) -> object:
    """The provider's name plus whatever identifies its image, so a new image means a new sandbox."""
    identity = getattr(provider, "instance_identity", None)
    extra = identity() if callable(identity) else None
    return provider.name if extra is None else {"name": provider.name, "config": extra}


async def _destroy_id(provider: SandboxProvider, sandbox_id: str) -> None:
    await asyncio.wait_for(provider.destroy(DestroyInput(id=sandbox_id)), DESTROY_TIMEOUT_S)


async def _destroy_handle(handle: SandboxHandle) -> None:
    await asyncio.wait_for(handle.destroy(), DESTROY_TIMEOUT_S)


async def _detached(work: Awaitable[None]) -> None:
    """Run teardown in its own task, so cancelling the caller cannot cut it short."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def define_sandbox(
    id: str,
    provider: SandboxProvider,
    workspace: Workspace | None = None,
    policy: SandboxPolicy | None = None,
    lifecycle: Lifecycle | None = None,
    hooks: SandboxHooks | None = None,
    *,
    file_events: bool = True,
) -> SandboxDefinition:
    """Bind a provider, a workspace and a policy under an id. Lazy: calls no provider (R31)."""
    if not id:
        raise ValueError("define_sandbox needs a non-empty id")
    return SandboxDefinition(
        id=id,
        provider=provider,
        workspace=workspace,
        policy=policy,
        lifecycle=lifecycle or Lifecycle(),
        hooks=hooks or SandboxHooks(),
        file_events=file_events,
    )


# -- one run's sandbox (R44-R48) -----------------------------------------------------------------


class RunDurability(Protocol):
    """What a durable run record offers the sandbox lifecycle (the run store implements it).

    ``stamp_detached`` raising ``EpochFencedError`` means another driver owns the run now: the
    sandbox is then neither stamped nor destroyed. An implementation may also offer
    ``async holds_run() -> bool`` (feature-detected): ``False`` means superseded, and this
    driver destroys nothing.
    """

    async def cancel_requested(self) -> bool: ...
    async def stamp_detached(self, sandbox_key: str) -> None: ...


# "superseded": another driver took the run over; its sandbox is the successor's, left untouched.
Ending = Literal["completed", "error", "aborted", "detached", "superseded"]


class SandboxRun:
    """The sandbox of one run, from before ensure until teardown."""

    def __init__(self, definition: SandboxDefinition, ctx: EnsureContext) -> None:
        self.definition = definition
        self.ctx = ctx
        self.key = definition.instance_key(ctx)
        self.ensured: EnsureResult | None = None
        self.ending: Ending | None = None
        self._drains: list[Callable[[], Awaitable[None]]] = []

    @property
    def handle(self) -> SandboxHandle:
        if self.ensured is None:
            raise RuntimeError("the sandbox is not ready yet")
        return self.ensured.handle

    def on_drain(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Register work to finish before teardown (the file watcher's in-flight diffs)."""
        self._drains.append(drain)

    async def _drain(self) -> None:
        drains, self._drains = self._drains, []
        for drain in drains:
            with contextlib.suppress(Exception):
                await drain()

    async def disconnect(self, durability: RunDurability) -> bool:
        """The client went away from a durable run: stamp the detach unless a cancel is recorded (R49).

        Never stops the work or destroys the sandbox. Returns whether the detach was stamped.
        """
        if await durability.cancel_requested():
            return False
        await durability.stamp_detached(self.key)
        return True

    async def destroy(self) -> None:
        if self.ensured is None:
            return
        await self.definition.destroy(self.ctx, self.ensured.handle)
        if self.definition.hooks.on_destroy is not None:
            await _maybe_await(self.definition.hooks.on_destroy())


@contextlib.asynccontextmanager
async def with_sandbox(
    definition: SandboxDefinition,
    ctx: EnsureContext,
    *,
    durability: RunDurability | None = None,
    detach_on_disconnect: bool = True,
) -> AsyncIterator[SandboxRun]:
    """Ensure the sandbox for one run and apply the lifecycle when the block ends.

    - success: an ``after-run`` snapshot where asked and supported; destroy iff
      ``destroy_on_complete`` (also when that snapshot failed, which re-raises);
    - error: ``on_error``, then destroy iff ``destroy_on_complete``;
    - abort (cancellation or ``ctx.signal``): a durable run with no cancel
      recorded detaches (stamps the record, keeps the sandbox; a failed stamp
      destroys); every other abort destroys, whatever ``destroy_on_complete`` says.
    """
    run = SandboxRun(definition, ctx)
    if durability is not None:
        # A durable run outlives this process; a lock that does not cross processes cannot guard it.
        warn_if_not_durable(ctx.locks if ctx.locks is not None else _ambient.get()[1], f"durable run {ctx.run_id}")
    try:
        run.ensured = await definition.ensure(ctx)
        if definition.hooks.on_ready is not None:
            await _maybe_await(definition.hooks.on_ready(run.ensured.handle))
        yield run
    except (asyncio.CancelledError, GeneratorExit):
        # GeneratorExit: the consumer of an async generator holding this block stopped reading.
        await _detached(_abort_teardown(run, durability, detach_on_disconnect))
        raise
    except BaseException as exc:
        if ctx.signal is not None and ctx.signal.aborted:
            await _detached(_abort_teardown(run, durability, detach_on_disconnect))
            raise
        run.ending = "error"
        await run._drain()
        if definition.hooks.on_error is not None:
            with contextlib.suppress(Exception):
                await _maybe_await(definition.hooks.on_error(exc))
        if definition.lifecycle.destroy_on_complete:
            await _detached(_destroy_if_held(run, durability))
        raise
    else:
        if ctx.signal is not None and ctx.signal.aborted:
            await _detached(_abort_teardown(run, durability, detach_on_disconnect))
            return
        run.ending = "completed"
        await run._drain()
        try:
            if definition.snapshot_mode() == "after-run" and run.handle.capabilities.snapshots:
                ref = await run.handle.snapshot(f"after-run-{ctx.run_id}")
                if ctx.store is not None:
                    record = await ctx.store.get(run.key)
                    if record is not None:
                        await ctx.store.upsert(msgspec.structs.replace(record, latest_snapshot_id=ref.id))
        finally:
            if definition.lifecycle.destroy_on_complete:
                await _detached(_destroy_if_held(run, durability))


async def _holds_run(durability: RunDurability | None) -> bool:
    """Whether this driver still owns the run (no durability, or one that cannot tell: yes)."""
    holds = getattr(durability, "holds_run", None)
    if holds is None:
        return True
    try:
        return bool(await holds())
    except Exception:
        return True


async def _destroy_if_held(run: SandboxRun, durability: RunDurability | None) -> None:
    if not await _holds_run(durability):
        run.ending = "superseded"
        log.info("run %s was taken over by another driver: its sandbox is left to it", run.ctx.run_id)
        return
    await run.destroy()


async def _abort_teardown(run: SandboxRun, durability: RunDurability | None, detach: bool) -> None:
    run.ending = "aborted"
    await run._drain()
    if durability is not None and detach and run.ensured is not None:
        try:
            cancelled = await durability.cancel_requested()
        except Exception:
            cancelled = False
        reason = run.ctx.signal.reason if run.ctx.signal is not None else None
        if not cancelled and reason != CANCEL_REASON:
            try:
                await durability.stamp_detached(run.key)
            except EpochFencedError as exc:
                # Superseded: the successor owns the record and the sandbox; touch neither.
                run.ending = "superseded"
                log.info("run %s: not detached, another driver owns it now (%s)", run.ctx.run_id, exc)
                return
            except Exception:
                log.warning("could not record the detach of run %s; destroying its sandbox", run.ctx.run_id)
            else:
                run.ending = "detached"
                return
    with contextlib.suppress(Exception):
        await _destroy_if_held(run, durability)


CANCEL_REASON = "boxwright:cancel-requested"
