"""boxd's seed rules, one test each, on the real ``boxd`` SDK against the fake (tests/support/fake_cloud/boxd.py).

Secrets travel on stdin, never in a command string, and never reach a snapshot; a destroyed
machine resumes as None, a stopped one is started, an auth failure raises; network deny is
refused; an abort during create deletes the machine; the one public URL is pointed at the port;
``/workspace`` is ``/home/boxd/workspace``; snapshots are ``<machine>-<label>``; machines are
isolated and found by their ownership labels.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, RestoreInput, ResumeInput
from tests.support.cloud_providers import boxd_fake, boxd_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run, serve_http
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-b0xd41-do-not-leak"


fake_required = require_fake("boxd")


def test_secrets_travel_on_stdin_never_in_a_command_string_or_a_snapshot() -> None:
    fake = boxd_fake()
    provider = boxd_fake_provider()

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET, "BW_QUOTE": "it's $HOME `x`"}))
        restored = None
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET" | wc -c; printf %s "$BW_QUOTE"')
            assert seen.stdout == f"{len(SECRET)}\nit's $HOME `x`", seen
            handle.env.set({"BW_SET": SECRET + "-set"})
            opts = ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            both = await handle.process.exec('test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', opts)
            assert both.stdout == "ok\n", both
            spawned = await handle.process.spawn("read line; echo got:$line")
            await spawned.stdin.write("hello\n")
            await spawned.stdin.end()
            assert (await spawned.wait()) == 0
            await handle.fs.write("/workspace/plain.txt", "no secret here")
            ref = await handle.snapshot("rule")
            assert ref.id.startswith(f"{handle.name}-rule"), ref
            restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id))
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
    assert [c for c in commands if SECRET in c] == [], "a secret reached a command string"
    # Nor in pieces: split over commands, encoded, in labels or a snapshot record.
    records = [*commands, *(repr(v.labels) for v in fake.vms.values()), *map(repr, fake.snapshots.items())]
    assert secret_pieces(records, SECRET) == []


def test_a_destroyed_machine_resumes_as_none_a_stopped_one_starts_and_auth_failure_raises() -> None:
    fake = boxd_fake()
    provider = boxd_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        vm = fake.vms[handle.id]
        await asyncio.to_thread(fake.run_on_loop, vm.machine.cloud.stop(vm.machine))
        vm.status = "stopped"
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and resumed.id == handle.id
        assert "StartVm" in fake.calls
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"  # the disk survives stop
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        await handle.destroy()  # already gone is success
        with pytest.raises(Exception) as caught:
            await boxd_fake_provider(token="bxd_wrong").resume(ResumeInput(id="vm_missing"))
        assert type(caught.value).__name__ == "AuthenticationError", caught.value

    run(body)


def test_network_deny_is_refused_not_dropped() -> None:
    fake = boxd_fake()

    async def body() -> None:
        before = set(fake.vms)
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await boxd_fake_provider().create(CreateInput(network=NetworkPolicy(mode="deny")))
        assert caught.value.capability == "network_policy"
        assert set(fake.vms) == before

    run(body)


def test_abort_or_cancel_during_create_deletes_the_machine_after_the_call() -> None:
    fake = boxd_fake()
    provider = boxd_fake_provider()

    async def body() -> None:
        before = set(fake.vms)
        await abort_and_cancel_create(fake, provider)
        assert set(fake.vms) - before == set(), "a machine made during an aborted create was left behind"

    run(body)


def test_the_one_public_url_is_pointed_at_the_connected_port() -> None:
    fake = boxd_fake()

    async def body() -> None:
        handle = await boxd_fake_provider().create()
        try:
            await serve_http(handle, "on 8080", 8080)
            await serve_http(handle, "on 3000", 3000)
            async with httpx.AsyncClient(base_url=fake.http_url, timeout=20) as client:
                for port in (8080, 3000):
                    channel = await handle.ports.connect(port)
                    assert channel.url == f"https://{handle.name}.boxd.fake", channel
                    assert channel.headers is None and channel.token is None  # public: no auth
                    got = await client.get("/index.html", headers={"Host": f"{handle.name}.boxd.fake"})
                    assert got.status_code == 200 and got.text == f"on {port}", got.text
        finally:
            await handle.destroy()

    run(body)


def test_workspace_maps_to_home_boxd_workspace_and_machines_are_isolated_and_owned() -> None:
    fake = boxd_fake()
    provider = boxd_fake_provider(run_id="run-owned-boxd")

    async def body() -> None:
        handles = [await provider.create() for _ in range(2)]
        try:
            handle = handles[0]
            assert handle.workspace_root == "/home/boxd/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/home/boxd/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /home/boxd/workspace/sub/f.txt")).stdout == "mapped"
            info = fake.info(fake.vms[handle.id])
            assert info.isolated and info.labels["boxwright.run"] == "run-owned-boxd", info
            owned = [o.id for o in await provider.list_owned({"boxwright.run": "run-owned-boxd"})]
            assert sorted(owned) == sorted(h.id for h in handles), owned
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "run-owned-boxd"}) == []

    run(body)
