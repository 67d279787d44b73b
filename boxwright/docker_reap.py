"""Find and remove leaked Docker sandboxes and images by their labels (``boxwright reap``).

Every container the Docker provider creates carries ``boxwright.managed``, the owner
host, the sandbox key, the run and a lease expiry (``providers.docker``). A container
is an orphan when its lease expired, or when its run is known to be terminal; any
host can reap it, also after the process that created it was SIGKILLed.

Committed images keep those labels and add their kind and a lease of their own. An
image a container still uses is never removed. A fork's image serves its fork alone:
unused (past a short grace for a fork being made), it goes. A snapshot outlives its
container, since restoring after a destroy is its point: it goes when its lease runs
out, or, where the instance store is known, when its sandbox's record is gone or
names another snapshot (past a grace for the commit-then-record window of setup).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import msgspec

from .providers.docker import (
    FORK_REPOSITORY,
    LABEL_CREATED,
    LABEL_KIND,
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_RUN,
    LABEL_SANDBOX,
    SNAPSHOT_REPOSITORY,
    DockerApi,
)
from .reaper import LeakEntry, SweepLeaks
from .runs import RunStore, is_terminal_status
from .stores.base import SandboxInstanceStore

# Answers whether a run id names a run that ended (finished, failed, cancelled).
RunIsTerminal = Callable[[str], Awaitable[bool]]
# Answers whether snapshot image ``ref`` (``repo:tag``) is what sandbox ``key``'s record restores from.
SnapshotIsCurrent = Callable[[str, str], Awaitable[bool]]
# How long an unreferenced image is left alone: a fork between its commit and its container, a
# snapshot between its commit and the instance record that names it.
DEFAULT_IMAGE_GRACE = 600.0
ImageReason = Literal["lease-expired", "fork-unused", "sandbox-gone"]


class ReapedContainer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    reason: Literal["lease-expired", "run-terminal"]
    owner: str | None = None
    sandbox: str | None = None
    run: str | None = None
    lease_expires: float | None = None
    removed: bool = False
    error: str | None = None


class ReapedImage(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    reason: ImageReason
    tags: list[str] = msgspec.field(default_factory=list)
    kind: str | None = None
    sandbox: str | None = None
    run: str | None = None
    created: float | None = None
    lease_expires: float | None = None
    removed: bool = False
    error: str | None = None


class DockerReapResult(msgspec.Struct, frozen=True, kw_only=True):
    containers: list[ReapedContainer]
    images: list[ReapedImage]


def _number(labels: dict[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None


def _lease(labels: dict[str, str]) -> float | None:
    return _number(labels, LABEL_LEASE)


async def reap_docker(
    *,
    dry_run: bool = False,
    run_is_terminal: RunIsTerminal | None = None,
    now: float | None = None,
    label: str | None = None,
    api: DockerApi | None = None,
) -> list[ReapedContainer]:
    """Remove (or, with ``dry_run``, only list) boxwright's containers whose lease expired or run ended.

    ``label`` narrows the search to containers that also carry it (``key`` or ``key=value``).
    A container that cannot be removed is reported with its ``error``, never raised: one
    stuck container must not stop the sweep.
    """
    api = api or DockerApi()
    moment = time.time() if now is None else now
    filters = [LABEL_MANAGED] + ([label] if label else [])
    found = await api.call(api.api.containers, all=True, filters={"label": filters})
    reaped: list[ReapedContainer] = []
    for row in found:
        labels: dict[str, str] = row.get("Labels") or {}
        lease = _lease(labels)
        run = labels.get(LABEL_RUN)
        reason: Literal["lease-expired", "run-terminal"] | None = None
        if lease is not None and lease <= moment:
            reason = "lease-expired"
        elif run and run_is_terminal is not None and await run_is_terminal(run):
            reason = "run-terminal"
        if reason is None:
            continue
        entry = ReapedContainer(
            id=str(row["Id"]),
            reason=reason,
            owner=labels.get(LABEL_OWNER),
            sandbox=labels.get(LABEL_SANDBOX),
            run=run,
            lease_expires=lease,
        )
        if not dry_run:
            try:
                await api.call(api.api.remove_container, entry.id, force=True, v=True)
                entry = msgspec.structs.replace(entry, removed=True)
            except api.errors.NotFound:
                entry = msgspec.structs.replace(entry, removed=True)
            except Exception as exc:
                entry = msgspec.structs.replace(entry, error=f"{type(exc).__name__}: {exc}")
        reaped.append(entry)
    return reaped


def _image_kind(labels: dict[str, str], tags: Sequence[str]) -> str | None:
    """``snapshot`` or ``fork``: the label, else the repository (images committed before the label existed)."""
    if labels.get(LABEL_KIND) in ("snapshot", "fork"):
        return labels[LABEL_KIND]
    for tag in tags:
        repository = tag.rpartition(":")[0]
        if repository == SNAPSHOT_REPOSITORY:
            return "snapshot"
        if repository == FORK_REPOSITORY:
            return "fork"
    return None


async def reap_docker_images(
    *,
    dry_run: bool = False,
    snapshot_is_current: SnapshotIsCurrent | None = None,
    now: float | None = None,
    grace: float = DEFAULT_IMAGE_GRACE,
    label: str | None = None,
    api: DockerApi | None = None,
) -> list[ReapedImage]:
    """Remove (or, with ``dry_run``, only list) boxwright's snapshot and fork images nobody needs.

    An image any container uses (running or not) stays. Otherwise a fork image past
    ``grace`` goes (``fork-unused``); a snapshot goes when its lease expired, or, given
    ``snapshot_is_current``, when past ``grace`` its sandbox no longer restores from it
    (``sandbox-gone``). Images are removed unforced, by tag then by id; a failure is
    reported in ``error``, never raised.
    """
    api = api or DockerApi()
    moment = time.time() if now is None else now
    filters = [LABEL_MANAGED] + ([label] if label else [])
    found = await api.call(api.api.images, filters={"label": filters})
    containers = await api.call(api.api.containers, all=True)
    in_use = {str(row.get("ImageID")) for row in containers}
    reaped: list[ReapedImage] = []
    for row in found:
        image_id = str(row["Id"])
        labels: dict[str, str] = row.get("Labels") or {}
        tags = [t for t in (row.get("RepoTags") or []) if t and t != "<none>:<none>"]
        kind = _image_kind(labels, tags)
        if kind is None or image_id in in_use:
            continue  # the base and runner images carry no kind; a used image is a live sandbox's
        created = _number(labels, LABEL_CREATED) or float(row.get("Created") or moment)
        lease = _lease(labels)
        reason: ImageReason | None = None
        if kind == "fork":
            reason = "fork-unused" if created + grace <= moment else None
        elif lease is not None and lease <= moment:
            reason = "lease-expired"
        elif snapshot_is_current is not None and created + grace <= moment:
            key = labels.get(LABEL_SANDBOX)
            # No sandbox key: a snapshot taken outside ensure(), whose holder the lease alone protects.
            if key and tags:
                current = [await snapshot_is_current(key, tag) for tag in tags]
                reason = None if any(current) else "sandbox-gone"
        if reason is None:
            continue
        entry = ReapedImage(
            id=image_id,
            reason=reason,
            tags=tags,
            kind=kind,
            sandbox=labels.get(LABEL_SANDBOX),
            run=labels.get(LABEL_RUN),
            created=created,
            lease_expires=lease,
        )
        if not dry_run:
            entry = await _remove_image(api, entry)
        reaped.append(entry)
    return reaped


async def _remove_image(api: DockerApi, entry: ReapedImage) -> ReapedImage:
    try:
        # Each tag, then the id: removing by id alone refuses an image with several tags.
        for ref in [*entry.tags, entry.id]:
            try:
                await api.call(api.api.remove_image, ref)
            except api.errors.NotFound:
                continue
        return msgspec.structs.replace(entry, removed=True)
    except Exception as exc:
        return msgspec.structs.replace(entry, error=f"{type(exc).__name__}: {exc}")


async def sweep_docker(
    *,
    dry_run: bool = False,
    run_is_terminal: RunIsTerminal | None = None,
    snapshot_is_current: SnapshotIsCurrent | None = None,
    now: float | None = None,
    grace: float = DEFAULT_IMAGE_GRACE,
    label: str | None = None,
    api: DockerApi | None = None,
) -> DockerReapResult:
    """Containers first (removing one may free its image), then images: what ``boxwright reap`` runs."""
    api = api or DockerApi()
    containers = await reap_docker(dry_run=dry_run, run_is_terminal=run_is_terminal, now=now, label=label, api=api)
    images = await reap_docker_images(
        dry_run=dry_run, snapshot_is_current=snapshot_is_current, now=now, grace=grace, label=label, api=api
    )
    return DockerReapResult(containers=containers, images=images)


def run_store_is_terminal(runs: RunStore) -> RunIsTerminal:
    """``run_is_terminal`` from a run store: an unknown run is not terminal (another app's; its lease decides)."""

    async def terminal(run_id: str) -> bool:
        record = await runs.get(run_id)
        return record is not None and is_terminal_status(record.status)

    return terminal


def instance_snapshot_is_current(instances: SandboxInstanceStore) -> SnapshotIsCurrent:
    """``snapshot_is_current`` from the instance store: the sandbox's record names this snapshot."""

    async def current(key: str, ref: str) -> bool:
        record = await instances.get(key)
        return record is not None and record.latest_snapshot_id == ref

    return current


def docker_leak_sweeper(
    runs: RunStore | None = None,
    instances: SandboxInstanceStore | None = None,
    *,
    dry_run: bool = False,
    grace: float = DEFAULT_IMAGE_GRACE,
    label: str | None = None,
    base_url: str | None = None,
) -> SweepLeaks:
    """A ``sweep_leaks`` for ``reap_detached_runs``: ``sweep_docker`` with the app's stores.

    With ``runs``, a container of a terminal run goes too; with ``instances``, a snapshot its
    sandbox no longer restores from. The client is made on the first sweep, off the loop.
    """
    state: dict[str, Any] = {}

    async def sweep() -> list[LeakEntry]:
        if "api" not in state:
            state["api"] = await asyncio.to_thread(DockerApi, base_url)
        result = await sweep_docker(
            dry_run=dry_run,
            run_is_terminal=run_store_is_terminal(runs) if runs is not None else None,
            snapshot_is_current=instance_snapshot_is_current(instances) if instances is not None else None,
            grace=grace,
            label=label,
            api=state["api"],
        )
        return [
            *(
                LeakEntry(kind="container", id=c.id, reason=c.reason, removed=c.removed, error=c.error)
                for c in result.containers
            ),
            *(
                LeakEntry(kind="image", id=i.id, reason=i.reason, removed=i.removed, error=i.error)
                for i in result.images
            ),
        ]

    return sweep
