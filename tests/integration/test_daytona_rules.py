"""Daytona's seed rules, one test each, on the real ``daytona`` SDK against its fake (fake_cloud/daytona.py).

Secrets become organization Secrets (the sandbox sees placeholders; no value in the
create record or a command string; per-command values arrive through an uploaded file);
a gone sandbox resumes as None, a stopped one is started; network deny is block-all, a
host list is refused; an abort during create leaves nothing (sandbox or secret) behind;
ports are signed preview URLs unless public; ``/workspace`` is ``/home/daytona/workspace``;
the kill that is not measured (``killable_processes=False``) does leave a background child.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.parse

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, RestoreInput, ResumeInput
from tests.support.cloud_providers import daytona_fake, daytona_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run, serve_http
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "dtn-secret-51b7e2-do-not-leak"


fake_required = require_fake("daytona")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_secrets_are_organization_secrets_and_never_in_a_command_string_or_a_snapshot() -> None:
    fake = daytona_fake()
    provider = daytona_fake_provider()

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        restored = None
        try:
            seen = (await handle.process.exec('printf %s "$BW_SECRET"')).stdout
            assert seen.startswith("dtn_secret_placeholder_") and SECRET not in seen, seen
            assert [s for s in fake.secrets.values() if s.get("value") == SECRET], "no organization Secret was made"
            handle.env.set({"BW_SET": SECRET + "-set"})
            opts = ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            hashed = await handle.process.exec('printf %s "$BW_SET" | sha256sum; printf %s "$BW_CMD" | sha256sum', opts)
            assert hashed.stdout.split()[::2] == [_sha(SECRET + "-set"), _sha(SECRET + "-cmd")], hashed
            await handle.fs.write("/workspace/plain.txt", "no secret here")
            ref = await handle.snapshot("rule")
            restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id))
            probe = await restored.process.exec(
                'grep -rlF -e "$NEEDLE" /home /tmp /etc /dev/shm 2>/dev/null; true',
                ProcessOptions(env={"NEEDLE": SECRET}),
            )
            assert probe.stdout == "", probe
            assert await restored.fs.read("/workspace/plain.txt") == "no secret here"
        finally:
            await handle.destroy()
            if restored is not None:
                await restored.destroy()

    run(body)
    assert all(SECRET not in body for body in fake.create_bodies), "a secret value is in a create record"
    leaked = [c for c in fake.commands() if SECRET in c]
    assert leaked == [], f"a secret reached a command string: {leaked[:3]}"
    # Nor in pieces: split over commands, encoded, in a create record, labels or a snapshot record.
    labels = [repr(b.labels) for b in fake.boxes.values()]
    records = [*fake.commands(), *fake.create_bodies, *labels, *map(repr, fake.snapshots.items())]
    assert secret_pieces(records, SECRET) == []
    assert not [s for s in fake.secrets.values() if s.get("value") == SECRET], "destroy left the Secret"


def test_a_gone_sandbox_resumes_as_none_a_stopped_one_is_started_and_auth_failures_raise() -> None:
    fake = daytona_fake()
    provider = daytona_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        await handle.sdk.stop()
        assert fake.boxes[handle.id].state == "stopped"
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and fake.boxes[handle.id].state == "started"
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        assert await provider.resume(ResumeInput(id="never-existed")) is None
        await handle.destroy()  # already gone is success
        with pytest.raises(Exception) as caught:
            await daytona_fake_provider(api_key="wrong").resume(ResumeInput(id=handle.id))
        assert "nauthorized" in str(caught.value) or "401" in str(caught.value), caught.value

    run(body)


def test_network_deny_is_block_all_and_a_host_list_is_refused() -> None:
    fake = daytona_fake()
    provider = daytona_fake_provider()

    async def body() -> None:
        denied = await provider.create(CreateInput(network=NetworkPolicy(mode="deny")))
        try:
            assert fake.boxes[denied.id].block_all is True
            assert (await denied.process.exec("ls /sys/class/net")).stdout.split() == ["lo"]
        finally:
            await denied.destroy()
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await provider.create(CreateInput(network=NetworkPolicy(mode="deny", allow_hosts=("pypi.org",))))
        assert caught.value.provider == "daytona" and caught.value.capability == "network_policy"

    run(body)


def test_abort_or_cancel_during_create_destroys_the_sandbox_and_its_secrets() -> None:
    fake = daytona_fake()
    provider = daytona_fake_provider()

    async def body() -> None:
        before, secrets_before = set(fake.boxes), set(fake.secrets)
        await abort_and_cancel_create(fake, provider, after=0.5, env={"BW_SECRET": SECRET})
        assert set(fake.boxes) - before == set(), "a sandbox made during an aborted create was left behind"
        assert set(fake.secrets) - secrets_before == set(), "a Secret made during an aborted create was left behind"

    run(body)


def test_ports_are_signed_preview_urls_unless_public() -> None:
    fake = daytona_fake()

    async def body() -> None:
        for public in (False, True):
            handle = await daytona_fake_provider(public=public).create()
            try:
                await serve_http(handle, "hello from daytona", 3000)
                channel = await handle.ports.connect(3000)
                host = str(urllib.parse.urlsplit(channel.url).hostname)
                async with httpx.AsyncClient(base_url=fake.server.url, timeout=20) as client:
                    got = await client.get("/index.html", headers={"Host": host})
                    assert got.status_code == 200 and got.text == "hello from daytona", got.text
                    if public:
                        assert channel.token is None and host == f"3000-{handle.id}.proxy.daytona.fake"
                        continue
                    # The signed URL carries its own token; the plain preview host needs the header.
                    assert channel.token and channel.token in host, channel
                    plain = await client.get("/index.html", headers={"Host": f"3000-{handle.id}.proxy.daytona.fake"})
                    assert plain.status_code == 401, plain.text
            finally:
                await handle.destroy()

    run(body)


def test_workspace_maps_to_home_daytona_workspace() -> None:
    provider = daytona_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            assert handle.workspace_root == "/home/daytona/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/home/daytona/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /home/daytona/workspace/sub/f.txt")).stdout == "mapped"
            assert (await handle.process.exec("mkdir /workspace")).exit_code != 0
            assert (await handle.process.exec("whoami")).stdout == "daytona\n"
        finally:
            await handle.destroy()

    run(body)


def test_kill_is_not_measured_to_reach_a_background_child_so_killable_is_false() -> None:
    provider = daytona_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            assert handle.capabilities.killable_processes is False
            process = await handle.process.spawn("( sleep 1.5 && touch survivor ) & wait")
            await asyncio.sleep(0.5)
            await process.kill()
            assert await asyncio.wait_for(process.wait(), 15) > 128
            await asyncio.sleep(2.5)
            # The session's shell died; its background child did not: a `true` here would leak a `tail -f`.
            assert (await handle.process.exec("test -e survivor")).exit_code == 0
        finally:
            await handle.destroy()

    run(body)


def test_leaked_sandboxes_are_found_by_ownership_labels_across_pages() -> None:
    fake = daytona_fake()
    provider = daytona_fake_provider(run_id="dtn-run-owned")

    async def body() -> None:
        handles = [await provider.create(CreateInput(id=f"dtn-key-{i}-{int(time.time())}")) for i in range(3)]
        try:
            pages_before = sum(1 for r in fake.requests if r == ("GET", "/api/sandbox"))
            owned = [o.id for o in await provider.list_owned({"boxwright.run": "dtn-run-owned"})]
            pages = sum(1 for r in fake.requests if r == ("GET", "/api/sandbox")) - pages_before
            assert sorted(owned) == sorted(h.id for h in handles)
            assert pages >= 2, f"{len(owned)} sandboxes at page size {fake.page_size} came in {pages} page(s)"
            labels = fake.boxes[handles[0].id].labels
            assert labels["boxwright.managed"] == "1" and labels["boxwright.sandbox"].startswith("dtn-key-0")
            assert fake.boxes[handles[0].id].name == labels["boxwright.sandbox"], "create must honour the id as name"
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "dtn-run-owned"}) == []

    run(body)
