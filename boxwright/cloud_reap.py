"""``boxwright reap --provider NAME``: destroy this host's leaked cloud sandboxes whose lease ran out.

Every sandbox a cloud provider makes carries boxwright's managed and owner labels and the
epoch second its lease ends (``providers/_remote.ownership``). A provider that can list them
is ``Reapable``: its ``list_owned`` returns only this host's boxwright sandboxes, so one
without those labels (someone else's) is never seen, let alone destroyed. Of what it returns,
an expired lease is destroyed; a live lease stays (a run may still use it), and so does a
sandbox whose vendor stores no lease (Railway has no labels): a person decides about those.

A provider that cannot list its sandboxes at all (Docker Sandboxes, Cloudflare) is named with
the reason and how to find them by hand, never skipped in silence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from .errors import BoxwrightError, UnsupportedCapabilityError
from .providers._remote import Reapable
from .reaper import LeakEntry, SweepLeaks
from .sandbox import DestroyInput

Kept = Literal["expired", "live", "no-lease"]

# Why a provider boxwright has cannot be reaped by listing, and what to do instead.
UNLISTABLE = {
    "sbx": "Docker Sandboxes carry no labels to find boxwright's by: list them with `sbx ls` and remove with `sbx rm`",
    "cloudflare": (
        "a Durable Object carries no labels and cannot be listed: boxwright's sandbox ids start with `bw-`; "
        "destroy one with `cloudflare_sandbox().destroy(DestroyInput(id=...))`"
    ),
}


class CloudReapEntry(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """One owned sandbox the sweep saw: ``expired`` (destroyed unless a dry run), or why it stays."""

    provider: str
    id: str
    reason: Kept
    lease_expires: float | None = None
    removed: bool = False
    error: str | None = None


class CloudReapResult(msgspec.Struct, rename="camel", kw_only=True):
    sandboxes: list[CloudReapEntry] = msgspec.field(default_factory=list)
    # provider -> why it could not be swept (cannot list, bad credentials, the service down).
    errors: dict[str, str] = msgspec.field(default_factory=dict)


def _factories() -> dict[str, Callable[[], Any]]:
    # Imported on use: each provider's module needs its own extra (its vendor SDK) only when named.
    def make(module: str, factory: str) -> Callable[[], Any]:
        def build() -> Any:
            imported = __import__(f"boxwright.providers.{module}", fromlist=[factory])
            return getattr(imported, factory)()

        return build

    return {
        "e2b": make("e2b", "e2b_sandbox"),
        "daytona": make("daytona", "daytona_sandbox"),
        "railway": make("railway", "railway_sandbox"),
        "upstash-box": make("upstash_box", "upstash_box_sandbox"),
        "blaxel": make("blaxel", "blaxel_sandbox"),
        "boxd": make("boxd", "boxd_sandbox"),
        "sbx": make("sbx", "sbx_sandbox"),
        "cloudflare": make("cloudflare", "cloudflare_sandbox"),
    }


PROVIDER_NAMES = tuple(_factories())


def provider_named(name: str) -> Any:
    """The provider ``name`` configured from its environment variables (as ``boxwright doctor`` lists them)."""
    factories = _factories()
    if name not in factories:
        raise ValueError(f"unknown provider {name!r} to reap: one of docker, {', '.join(factories)}")
    return factories[name]()


async def reap_provider(
    name: str,
    provider: object,
    *,
    dry_run: bool,
    labels: Mapping[str, str] | None = None,
    now: float | None = None,
) -> list[CloudReapEntry]:
    """Destroy ``provider``'s owned sandboxes whose lease ended before ``now``; report every one it listed.

    Raises ``UnsupportedCapabilityError`` for a provider that cannot list its sandboxes, and
    whatever listing raises (credentials, transport); a failed destroy is the entry's ``error``.
    """
    if not isinstance(provider, Reapable):
        why = UNLISTABLE.get(name, f"{type(provider).__name__} has no list_owned")
        raise UnsupportedCapabilityError(name, "list_owned", why)
    moment = time.time() if now is None else now
    entries = []
    for sandbox in await provider.list_owned(labels):
        lease = sandbox.lease_expires
        reason: Kept = "no-lease" if lease is None else "expired" if lease <= moment else "live"
        entry = CloudReapEntry(provider=name, id=sandbox.id, reason=reason, lease_expires=lease)
        if reason == "expired" and not dry_run:
            try:
                await provider.destroy(DestroyInput(id=sandbox.id))
                entry.removed = True
            except Exception as exc:
                entry.error = f"{type(exc).__name__}: {exc}"
        entries.append(entry)
    return entries


async def reap_cloud(
    providers: Mapping[str, object],
    *,
    dry_run: bool,
    labels: Mapping[str, str] | None = None,
    now: float | None = None,
) -> CloudReapResult:
    """``reap_provider`` on each of ``providers`` (name -> provider); one's failure is its ``errors`` line."""
    result = CloudReapResult()
    for name, provider in providers.items():
        try:
            result.sandboxes.extend(await reap_provider(name, provider, dry_run=dry_run, labels=labels, now=now))
        except Exception as exc:
            result.errors[name] = str(exc) if isinstance(exc, BoxwrightError) else repr(exc)
    return result


def cloud_leak_sweeper(
    providers: Mapping[str, object], *, dry_run: bool = False, labels: Mapping[str, str] | None = None
) -> SweepLeaks:
    """A ``sweep_leaks`` for ``reap_detached_runs``: each sweep destroys the providers' expired sandboxes.

    Only what it destroyed (or failed to) becomes a ``LeakEntry``; a provider that could not be
    listed is one entry with its ``error`` (the reaper logs it), so one provider down hides no other's.
    """

    async def sweep() -> Sequence[LeakEntry]:
        result = await reap_cloud(providers, dry_run=dry_run, labels=labels)
        leaks = [
            LeakEntry(kind=f"{e.provider} sandbox", id=e.id, reason=e.reason, removed=e.removed, error=e.error)
            for e in result.sandboxes
            if e.reason == "expired"
        ]
        leaks.extend(
            LeakEntry(kind=f"{name} sandbox", id="*", reason="not-listed", error=why)
            for name, why in result.errors.items()
        )
        return leaks

    return sweep
