"""``boxwright reap`` on every cloud provider of the registry, against its fake and the real SDK.

A leaked sandbox whose ownership lease ended is destroyed; one with a live lease and one
without boxwright's labels (someone else's) stay. A provider whose vendor stores no labels
(Railway) keeps every sandbox, saying why; one that cannot list its sandboxes (sbx,
Cloudflare) is refused with what to do instead.
"""

from __future__ import annotations

import asyncio

import pytest

from boxwright.cloud_reap import UNLISTABLE, CloudReapEntry, cloud_leak_sweeper, reap_provider
from boxwright.errors import UnsupportedCapabilityError
from boxwright.providers._remote import Reapable
from boxwright.sandbox import ResumeInput
from boxwright.testkit import RecordingLogger
from tests.support.cloud_providers import CLOUD_PROVIDERS, fake_problem
from tests.support.cloud_rules import run
from tests.support.require import missing

pytestmark = pytest.mark.integration


def _mine(entries: list[CloudReapEntry], ids: set[str]) -> dict[str, CloudReapEntry]:
    # The fake is shared with the other tests of this process: look at this test's sandboxes only.
    return {e.id: e for e in entries if e.id in ids}


@pytest.mark.parametrize("name", sorted(CLOUD_PROVIDERS))
def test_reap_destroys_expired_owned_sandboxes_and_keeps_live_and_foreign_ones(name: str) -> None:
    entry = CLOUD_PROVIDERS[name]
    problem = fake_problem(name)
    if problem is not None:
        missing(problem)
    provider = entry.fake(RecordingLogger())
    if not isinstance(provider, Reapable):

        async def attempt() -> None:
            await reap_provider(name, provider, dry_run=False)

        with pytest.raises(UnsupportedCapabilityError) as caught:
            run(attempt)
        assert caught.value.capability == "list_owned" and UNLISTABLE[name] in str(caught.value)
        return

    async def body() -> None:
        if entry.disown is None:  # the vendor stores no labels, so no lease: nothing is reaped
            handle = await provider.create()
            try:
                seen = _mine(await reap_provider(name, provider, dry_run=False), {handle.id})
                assert seen[handle.id].reason == "no-lease" and not seen[handle.id].removed, seen
                assert await provider.resume(ResumeInput(id=handle.id)) is not None
            finally:
                await handle.destroy()
            return
        expired = entry.fake(RecordingLogger(), lease_seconds=-60.0)
        leaked, live, foreign = await asyncio.gather(expired.create(), provider.create(), expired.create())
        entry.disown(foreign.id)
        ids = {leaked.id, live.id, foreign.id}
        try:
            planned = _mine(await reap_provider(name, provider, dry_run=True), ids)
            assert set(planned) == {leaked.id, live.id}, planned  # the foreign one is never listed
            assert planned[leaked.id].reason == "expired" and not planned[leaked.id].removed
            assert planned[live.id].reason == "live"
            assert await provider.resume(ResumeInput(id=leaked.id)) is not None, "a dry run destroyed it"
            # The reaper loop's hook (reap_detached_runs(sweep_leaks=...)) does the same sweep for real.
            leaks = [leak for leak in await cloud_leak_sweeper({name: provider})() if leak.id in ids]
            assert [(leak.id, leak.reason, leak.removed, leak.error) for leak in leaks] == [
                (leaked.id, "expired", True, None)
            ]
            assert await provider.resume(ResumeInput(id=leaked.id)) is None
            for kept in (live, foreign):
                assert await provider.resume(ResumeInput(id=kept.id)) is not None, f"{kept.id} was destroyed"
        finally:
            await asyncio.gather(leaked.destroy(), live.destroy(), foreign.destroy())

    run(body)
