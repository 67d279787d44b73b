"""Find and remove leaked Docker sandboxes by their labels (``boxwright reap``).

Every container the Docker provider creates carries ``boxwright.managed``, the owner
host, the sandbox key, the run and a lease expiry (``providers.docker``). A container
is an orphan when its lease expired, or when its run is known to be terminal; any
host can reap it, also after the process that created it was SIGKILLed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from .providers.docker import LABEL_LEASE, LABEL_MANAGED, LABEL_OWNER, LABEL_RUN, LABEL_SANDBOX, DockerApi

# Answers whether a run id names a run that ended (finished, failed, cancelled).
RunIsTerminal = Callable[[str], Awaitable[bool]]


class ReapedContainer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    reason: Literal["lease-expired", "run-terminal"]
    owner: str | None = None
    sandbox: str | None = None
    run: str | None = None
    lease_expires: float | None = None
    removed: bool = False
    error: str | None = None


def _lease(labels: dict[str, str]) -> float | None:
    try:
        return float(labels[LABEL_LEASE])
    except (KeyError, ValueError):
        return None


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
