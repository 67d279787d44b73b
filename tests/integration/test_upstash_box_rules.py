"""Upstash Box's seed rules, one test each, on the ``upstash-box`` SDK against its fake (fake_cloud/upstash_box.py).

Secrets travel as box env and session start-frame env, never in a command string or a
snapshot; a deleted box resumes as None (an auth failure raises); network deny is
``deny-all`` and a host list is refused; an abort or cancel during create leaves nothing
behind; preview URLs carry bearer or Basic auth when asked; ``/workspace`` is
``/workspace/home``; spawned processes have a real pid and a kill reaches a forked child;
leaked boxes are found by their ownership labels.
"""

from __future__ import annotations

import asyncio
import urllib.parse

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, RestoreInput, ResumeInput
from tests.support.cloud_providers import upstash_box_fake, upstash_box_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run, serve_http
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-9a2c4e-do-not-leak"


fake_required = require_fake("upstash-box")


def test_secrets_travel_as_box_env_and_frame_env_never_in_a_command_string_or_a_snapshot() -> None:
    fake = upstash_box_fake()
    provider = upstash_box_fake_provider()

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        restored = None
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET" | wc -c')
            assert seen.stdout.strip() == str(len(SECRET)), seen
            handle.env.set({"BW_SET": SECRET + "-set"})
            both = await handle.process.exec(
                'test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            )
            assert both.stdout == "ok\n", both
            # spawn is the exec-session WebSocket: its env rides the start frame, not the command.
            spawned = await handle.process.spawn(
                'test -n "$BW_SECRET$BW_SET$BW_CMD"', ProcessOptions(env={"BW_CMD": SECRET + "-spawn"})
            )
            assert (await spawned.wait()) == 0
            await handle.fs.write("/workspace/plain.txt", "no secret here")
            ref = await handle.snapshot("rule")
            restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id))
            probe = await restored.process.exec(
                'printf "[%s]" "$BW_SECRET"; grep -rlF -e "$NEEDLE" /root /tmp /etc /workspace 2>/dev/null; true',
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
    assert any((b.get("env_vars") or {}).get("BW_SECRET") == SECRET for b in fake.bodies), "create sent no env"
    # Nor in pieces: split over commands, encoded, in labels, a snapshot record or any create field but `env_vars`.
    rest = [repr({k: v for k, v in b.items() if k != "env_vars"}) for b in fake.bodies]
    snaps = [repr(s) for s in fake.snapshots.values()]
    assert secret_pieces([*commands, *rest, *snaps, *(repr(b.labels) for b in fake.boxes.values())], SECRET) == []


def test_a_deleted_box_resumes_as_none_a_paused_one_wakes_and_an_auth_failure_raises() -> None:
    fake = upstash_box_fake()
    provider = upstash_box_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        alive = await provider.resume(ResumeInput(id=handle.id))
        assert alive is not None and alive.id == handle.id
        fake.boxes[handle.id].status = "paused"
        woke = await provider.resume(ResumeInput(id=handle.id))
        assert woke is not None and fake.boxes[handle.id].status == "running"
        assert (await woke.process.exec("echo up")).stdout == "up\n"
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        assert await provider.resume(ResumeInput(id="box-never-existed")) is None
        await handle.destroy()  # already gone is success
        intruder = upstash_box_fake_provider(api_key="box_wrong_key")
        with pytest.raises(Exception) as caught:
            await intruder.resume(ResumeInput(id=handle.id))
        assert getattr(caught.value, "status_code", None) == 401, caught.value

    run(body)


def test_network_deny_is_deny_all_in_the_box_and_a_host_list_is_refused() -> None:
    fake = upstash_box_fake()
    provider = upstash_box_fake_provider()

    async def body() -> None:
        denied = await provider.create(CreateInput(network=NetworkPolicy(mode="deny")))
        try:
            assert fake.boxes[denied.id].network_policy == {"mode": "deny-all"}
            probe = await denied.process.exec("ls /sys/class/net")
            assert probe.stdout.split() == ["lo"], probe  # only loopback inside
        finally:
            await denied.destroy()
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await provider.create(CreateInput(network=NetworkPolicy(mode="deny", allow_hosts=("pypi.org",))))
        assert caught.value.provider == "upstash-box" and caught.value.capability == "network_policy"

    run(body)


def test_abort_or_cancel_during_create_destroys_what_was_made() -> None:
    fake = upstash_box_fake()
    provider = upstash_box_fake_provider()

    async def body() -> None:
        before = set(fake.boxes)
        await abort_and_cancel_create(fake, provider)
        for _ in range(300):  # up to 30 s for the late create answers and their deletes
            if all(fake.boxes[b].status == "deleted" for b in set(fake.boxes) - before):
                break
            await asyncio.sleep(0.1)
        made = set(fake.boxes) - before
        assert len(made) == 2, f"expected the two aborted creates to have reached the API, got {made}"
        left = {b: fake.boxes[b].status for b in made if fake.boxes[b].status != "deleted"}
        assert left == {}, f"a box made during an aborted create was left behind: {left}"

    run(body)


def test_preview_urls_have_no_auth_by_default_and_bearer_or_basic_when_asked() -> None:
    fake = upstash_box_fake()

    async def body() -> None:
        for auth in (None, "bearer", "basic"):
            handle = await upstash_box_fake_provider(public_url_auth=auth).create()
            try:
                await serve_http(handle, "hello from the box")
                channel = await handle.ports.connect(8080)
                host = str(urllib.parse.urlsplit(channel.url).hostname)
                assert channel.url == f"https://{handle.id}-8080.box.fake", channel
                async with httpx.AsyncClient(base_url=fake.base_url, timeout=20) as client:
                    bare = await client.get("/index.html", headers={"Host": host})
                    if auth is None:
                        assert channel.headers is None and bare.status_code == 200, (channel, bare.text)
                        continue
                    assert bare.status_code == 401, bare.text
                    assert channel.headers is not None
                    scheme = channel.headers["Authorization"].split()[0]
                    assert scheme == ("Bearer" if auth == "bearer" else "Basic"), channel.headers
                    if auth == "bearer":
                        assert channel.token and channel.token in channel.headers["Authorization"]
                    authed = await client.get("/index.html", headers={"Host": host, **channel.headers})
                    assert authed.status_code == 200 and authed.text == "hello from the box", authed.text
            finally:
                await handle.destroy()

    run(body)


def test_workspace_is_the_box_home_and_spawned_processes_have_a_real_pid_and_tree_kill() -> None:
    provider = upstash_box_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            assert handle.workspace_root == "/workspace/home"
            assert (await handle.process.exec("pwd")).stdout == "/workspace/home\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /workspace/home/sub/f.txt")).stdout == "mapped"
            listed = await handle.fs.list("/workspace/sub")
            assert [(e.name, e.path) for e in listed] == [("f.txt", "/workspace/sub/f.txt")]
            child = await handle.process.spawn("sleep 600 & echo $!; wait")
            forked = int(await anext(aiter(child.stdout)))
            assert child.pid > 0 and forked != child.pid
            assert (await handle.process.exec(f"kill -0 {child.pid} && kill -0 {forked}")).exit_code == 0
            await child.kill()
            assert await child.wait() > 128
            assert (await handle.process.exec(f"kill -0 {forked}")).exit_code != 0, "the forked child survived"
        finally:
            await handle.destroy()

    run(body)


def test_leaked_boxes_are_found_by_their_ownership_labels() -> None:
    fake = upstash_box_fake()
    provider = upstash_box_fake_provider(run_id="run-owned-7")

    async def body() -> None:
        handles = [await provider.create(CreateInput(id=f"key{i}")) for i in range(2)]
        try:
            owned = [o.id for o in await provider.list_owned({"boxwright-run-": "run-owned-7"})]
            assert sorted(owned) == sorted(h.id for h in handles)
            labels = fake.boxes[handles[0].id].labels
            assert "boxwright-managed" in labels and "boxwright-sandbox-key0" in labels and "boxwright-test" in labels
            assert any(label.startswith("boxwright-owner-") for label in labels)
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright-run-": "run-owned-7"}) == []

    run(body)
