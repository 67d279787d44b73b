"""E2B's seed rules, one test each, on the real ``e2b`` SDK against the fake (tests/support/fake_cloud/e2b.py).

Secrets never reach a command string or a snapshot; a gone sandbox resumes as None (and
an auth failure raises); network deny reaches the VM, a host list is refused; an abort
during create leaves nothing behind; ports carry the traffic token when public traffic
is off; ``/workspace`` is ``/home/user/workspace``; leaked sandboxes are found by their
ownership metadata across pages.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, RestoreInput, ResumeInput
from tests.support.cloud_providers import e2b_fake, e2b_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run, serve_http
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-7f3a9c-do-not-leak"


fake_required = require_fake("e2b")


def test_secrets_travel_as_envs_never_in_a_command_string_or_a_snapshot() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider()

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        restored = None
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET" | wc -c')
            assert seen.stdout.strip() == str(len(SECRET)), seen
            handle.env.set({"BW_SET": SECRET + "-set"})
            opts = ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            both = await handle.process.exec('test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', opts)
            assert both.stdout == "ok\n", both
            spawned = await handle.process.spawn('printf %s "$BW_SECRET$BW_SET" | wc -c')
            assert (await spawned.wait()) == 0
            await handle.fs.write("/workspace/plain.txt", "no secret here")
            ref = await handle.snapshot("rule")
            restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id))
            # The snapshot holds no value: not in the restored env, not on its disk.
            probe = await restored.process.exec(
                'printf "[%s]" "$BW_SECRET"; grep -rlF -e "$NEEDLE" /home /tmp /etc /dev/shm 2>/dev/null; true',
                ProcessOptions(env={"NEEDLE": SECRET}),
            )
            assert probe.stdout == "[]", probe
            assert await restored.fs.read("/workspace/plain.txt") == "no secret here"
        finally:
            await handle.destroy()
            if restored is not None:
                await restored.destroy()

    run(body)
    commands = fake.commands()
    assert commands, "the fake received no commands"
    leaked = [c for c in commands if SECRET in c]
    assert leaked == [], f"a secret reached a command string: {leaked[:3]}"
    # Nor in pieces: split over commands, encoded, in metadata or a snapshot record.
    records = [*commands, *(repr(b.metadata) for b in fake.boxes.values()), *map(repr, fake.snapshots.items())]
    assert secret_pieces(records, SECRET) == []


def test_a_gone_sandbox_resumes_as_none_and_an_auth_failure_raises() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        alive = await provider.resume(ResumeInput(id=handle.id))
        assert alive is not None and alive.id == handle.id
        fake.boxes[handle.id].end_at = time.time() - 1  # expired: E2B answers 404 to connect
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        assert await provider.resume(ResumeInput(id="never-existed-0000")) is None
        await handle.destroy()  # already gone is success
        intruder = e2b_fake_provider(api_key="e2b_wrong_key")
        with pytest.raises(Exception) as caught:
            await intruder.resume(ResumeInput(id=handle.id))
        assert "Invalid API key" in str(caught.value) or "401" in str(caught.value), caught.value

    run(body)


def test_network_deny_reaches_the_vm_and_a_host_list_is_refused() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider()

    async def body() -> None:
        denied = await provider.create(CreateInput(network=NetworkPolicy(mode="deny")))
        try:
            box = fake.boxes[denied.id]
            assert box.machine.network is False
            probe = await denied.process.exec("cat /sys/class/net/*/operstate 2>/dev/null | sort -u; ls /sys/class/net")
            assert probe.stdout.split()[-1:] == ["lo"], probe  # only loopback inside
        finally:
            await denied.destroy()
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await provider.create(CreateInput(network=NetworkPolicy(mode="deny", allow_hosts=("pypi.org",))))
        assert caught.value.provider == "e2b" and caught.value.capability == "network_policy"

    run(body)


def test_abort_or_cancel_during_create_destroys_what_was_made() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider()

    async def body() -> None:
        before = set(fake.boxes)
        await abort_and_cancel_create(fake, provider)
        # create returns (raises) only after its clean-up: nothing to wait for.
        assert set(fake.boxes) - before == set(), "a sandbox made during an aborted create was left behind"

    run(body)


def test_ports_are_e2b_hosts_and_carry_the_traffic_token_when_public_traffic_is_off() -> None:
    fake = e2b_fake()

    async def body() -> None:
        for public in (False, True):
            handle = await e2b_fake_provider(allow_public_traffic=public).create()
            try:
                await serve_http(handle, "hello from the sandbox")
                channel = await handle.ports.connect(8080)
                host = urllib.parse.urlsplit(channel.url).hostname
                assert channel.url == f"https://8080-{handle.id}.e2b.fake", channel
                async with httpx.AsyncClient(base_url=fake.api_url, timeout=20) as client:
                    bare = await client.get("/index.html", headers={"Host": str(host)})
                    if public:
                        assert channel.headers is None, channel
                        assert bare.status_code == 200 and bare.text == "hello from the sandbox"
                        continue
                    assert channel.headers is not None and set(channel.headers) == {"e2b-traffic-access-token"}
                    assert bare.status_code == 403, bare.text
                    authed = await client.get("/index.html", headers={"Host": str(host), **channel.headers})
                    assert authed.status_code == 200 and authed.text == "hello from the sandbox", authed.text
            finally:
                await handle.destroy()

    run(body)


def test_workspace_maps_to_home_user_workspace() -> None:
    provider = e2b_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            assert handle.workspace_root == "/home/user/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/home/user/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /home/user/workspace/sub/f.txt")).stdout == "mapped"
            listed = await handle.fs.list("/workspace/sub")
            assert [(e.name, e.path) for e in listed] == [("f.txt", "/workspace/sub/f.txt")]
            # /workspace itself is not the VM's: the sandbox user cannot create it.
            assert (await handle.process.exec("mkdir /workspace")).exit_code != 0
            assert (await handle.process.exec("whoami")).stdout == "user\n"
        finally:
            await handle.destroy()

    run(body)


def test_leaked_sandboxes_are_found_by_ownership_metadata_across_pages() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider(run_id="run-owned-1")

    async def body() -> None:
        handles = [await provider.create(CreateInput(id=f"key{i}")) for i in range(3)]
        try:
            pages_before = sum(1 for r in fake.requests if r == ("GET", "/v2/sandboxes"))
            owned = [o.id for o in await provider.list_owned({"boxwright.run": "run-owned-1"})]
            pages = sum(1 for r in fake.requests if r == ("GET", "/v2/sandboxes")) - pages_before
            assert sorted(owned) == sorted(h.id for h in handles)
            assert pages >= 2, f"{len(owned)} sandboxes at page size {fake.page_size} came in {pages} page(s)"
            meta = fake.boxes[handles[0].id].metadata
            assert meta["boxwright.managed"] == "1" and meta["boxwright.sandbox"] == "key0"
            assert meta["boxwright.run"] == "run-owned-1" and float(meta["boxwright.lease-expires"]) > time.time()
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "run-owned-1"}) == []

    run(body)


def test_the_sdk_kill_leaves_a_background_child_and_the_group_kill_does_not() -> None:
    """The seed's measurement, on the fake's process model: why every command runs under setsid."""
    provider = e2b_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            command = "( sleep 1.5 && touch {m} ) & wait"
            raw = await handle.sdk.commands.run(command.format(m="sdk-killed"), background=True, cwd=handle.workdir)
            ours = await handle.process.spawn(command.format(m="group-killed"))
            await asyncio.sleep(0.5)
            assert await raw.kill() is True  # envd's SIGKILL to the shell's pid
            await ours.kill()
            assert await asyncio.wait_for(ours.wait(), 15) == 128 + 9
            await asyncio.sleep(2.5)
            found = (await handle.process.exec("ls sdk-killed group-killed 2>/dev/null; true")).stdout.split()
            assert found == ["sdk-killed"], f"markers written after the kills: {found}"
        finally:
            await handle.destroy()

    run(body)


def test_a_command_cancelled_while_envd_starts_it_is_killed() -> None:
    fake = e2b_fake()
    provider = e2b_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            fake.start_delay = 1.5
            try:
                task = asyncio.ensure_future(handle.process.exec("( sleep 2 && touch late ) & sleep 2 && touch late2"))
                await asyncio.sleep(0.7)  # the command runs; envd has not answered yet
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                fake.start_delay = 0.0
            await asyncio.sleep(2.5)
            assert (await handle.process.exec("ls late late2 2>/dev/null; true")).stdout == ""
        finally:
            await handle.destroy()

    run(body)
