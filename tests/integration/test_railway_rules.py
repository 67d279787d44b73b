"""Railway's seed rules, one test each, on boxwright's Railway client against its fake (fake_cloud/railway.py).

Secrets travel as sandbox variables and exec-frame env, never in a command string or a
checkpoint; a gone sandbox resumes as None (an auth failure raises); network deny is
refused at create and restore; an abort or cancel during create leaves nothing running;
declared ports are public domains and other ports are refused; ``/workspace`` is a real
directory; kill is TERM then KILL after 2 s (KILL at once for an aborted spawn); lifetime,
size and region options reach the API as the seed says; both token kinds authenticate.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse

import httpx
import pytest

from boxwright.abort import AbortController
from boxwright.errors import UnsupportedCapabilityError
from boxwright.providers.railway import RailwayError, railway_sandbox
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, RestoreInput, ResumeInput
from tests.support.cloud_providers import railway_fake, railway_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-5e1d0b-do-not-leak"


fake_required = require_fake("railway")


def test_secrets_travel_as_variables_and_frame_env_never_in_a_command_string_or_a_checkpoint() -> None:
    fake = railway_fake()
    provider = railway_fake_provider()

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
            spawned = await handle.process.spawn('printf %s "$BW_SECRET$BW_SET" | wc -c')
            assert (await spawned.wait()) == 0
            await handle.fs.write("/workspace/plain.txt", "no secret here")
            ref = await handle.snapshot("rule")
            assert ref.label == "rule" and ref.id.startswith(f"boxwright-{handle.id}-"), ref
            restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id))
            # The checkpoint is the disk only: no value in the restored env, none on its disk.
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
    assert any(i.get("variables", {}).get("BW_SECRET") == SECRET for i in fake.inputs), "create sent no variables"
    # Nor in pieces: split over commands, encoded, in a checkpoint or any create field but `variables`.
    rest = [repr({k: v for k, v in i.items() if k != "variables"}) for i in fake.inputs]
    assert secret_pieces([*commands, *rest, *fake.checkpoints], SECRET) == []


def test_a_gone_sandbox_resumes_as_none_creating_is_waited_for_and_an_auth_failure_raises() -> None:
    fake = railway_fake()
    provider = railway_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        beats = fake.sandboxes[handle.id].heartbeats
        alive = await provider.resume(ResumeInput(id=handle.id))
        assert alive is not None and alive.id == handle.id
        assert fake.sandboxes[handle.id].heartbeats == beats + 1, "resume did not reset the idle countdown"
        await asyncio.to_thread(fake.expire, handle.id)  # the idle timeout destroyed it: a DESTROYED tombstone
        assert fake.sandboxes[handle.id].status == "DESTROYED"
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        assert await provider.resume(ResumeInput(id="00000000-never-existed")) is None
        await handle.destroy()  # already gone is success
        fake.sandboxes[handle.id].status = "FAILED"
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        # A CREATING sandbox is waited for, then handed back.
        fake.create_delay = 1.5
        try:
            created = await provider.create()
        finally:
            fake.create_delay = 0.0
        try:
            fake.sandboxes[created.id].status = "CREATING"
            asyncio.get_running_loop().call_later(1.0, lambda: setattr(fake.sandboxes[created.id], "status", "RUNNING"))
            woke = await provider.resume(ResumeInput(id=created.id))
            assert woke is not None and (await woke.process.exec("echo up")).stdout == "up\n"
        finally:
            await created.destroy()
        intruder = railway_fake_provider(token="rw-wrong-token")
        with pytest.raises(RailwayError) as caught:
            await intruder.resume(ResumeInput(id=created.id))
        assert "Not Authorized" in str(caught.value), caught.value

    run(body)


def test_network_deny_is_refused_at_create_and_restore_never_dropped() -> None:
    fake = railway_fake()
    provider = railway_fake_provider()

    async def body() -> None:
        made = len(fake.inputs)
        for call in (
            provider.create(CreateInput(network=NetworkPolicy(mode="deny"))),
            provider.restore_snapshot(RestoreInput(snapshot_id="boxwright-x", network=NetworkPolicy(mode="deny"))),
        ):
            with pytest.raises(UnsupportedCapabilityError) as caught:
                await call
            assert caught.value.provider == "railway" and caught.value.capability == "network_policy"
            assert "egress" in str(caught.value)
        assert len(fake.inputs) == made, "a denied create still asked Railway for a sandbox"
        assert provider.capabilities().network_policy is False

    run(body)


def test_abort_or_cancel_during_create_destroys_what_was_made() -> None:
    fake = railway_fake()
    provider = railway_fake_provider()

    async def body() -> None:
        before = set(fake.sandboxes)
        await abort_and_cancel_create(fake, provider)
        made = set(fake.sandboxes) - before
        assert len(made) == 2, f"expected the two aborted creates to have reached Railway, got {made}"
        for _ in range(300):  # up to 30 s for the destroys of the late create answers
            if all(fake.sandboxes[s].status == "DESTROYED" for s in made):
                break
            await asyncio.sleep(0.1)
        left = {s: fake.sandboxes[s].status for s in made if fake.sandboxes[s].status != "DESTROYED"}
        assert left == {}, f"a sandbox made during an aborted create was left behind: {left}"

    run(body)


def test_declared_ports_are_public_domains_and_other_ports_are_refused() -> None:
    fake = railway_fake()

    async def body() -> None:
        plain = await railway_fake_provider().create()
        try:
            assert plain.capabilities.ports is False
            with pytest.raises(UnsupportedCapabilityError):
                await plain.ports.connect(8080)
        finally:
            await plain.destroy()
        handle = await railway_fake_provider(network_isolation="PRIVATE", ports=[8080]).create()
        try:
            assert fake.inputs[-1]["domains"] == [{"port": 8080}] and fake.inputs[-1]["networkIsolation"] == "PRIVATE"
            await handle.fs.write("/workspace/www/index.html", "hello from railway")
            await handle.process.spawn("cd www && exec python3 -m http.server 8080 --bind 0.0.0.0")
            channel = await handle.ports.connect(8080)
            host = urllib.parse.urlsplit(channel.url).hostname
            assert channel.url == f"https://{fake.sandboxes[handle.id].domains[0]['domain']}", channel
            assert channel.headers is None and channel.token is None, "a Railway domain carries no preview token"
            async with httpx.AsyncClient(base_url=fake.url, timeout=20) as client:
                for _ in range(100):
                    page = await client.get("/index.html", headers={"Host": str(host)})
                    if page.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
            assert page.status_code == 200 and page.text == "hello from railway", page.text
            with pytest.raises(ValueError, match="not published"):
                await handle.ports.connect(3000)
        finally:
            await handle.destroy()

    run(body)
    with pytest.raises(ValueError, match="PRIVATE"):
        railway_sandbox(ports=[3000])
    with pytest.raises(ValueError, match="at most 10"):
        railway_sandbox(network_isolation="PRIVATE", ports=list(range(3000, 3011)))


def test_workspace_is_a_real_directory_made_at_boot() -> None:
    provider = railway_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            assert handle.workspace_root == "/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /workspace/sub/f.txt")).stdout == "mapped"
            listed = await handle.fs.list("/workspace/sub")
            assert [(e.name, e.path) for e in listed] == [("f.txt", "/workspace/sub/f.txt")]
            await handle.fs.write("/workspace/sub/deep/g.txt", "x")
            await handle.fs.remove("/workspace/sub")  # recursive
            assert not await handle.fs.exists("/workspace/sub")
        finally:
            await handle.destroy()
        other = await railway_fake_provider(workdir="/srv/work").create()
        try:
            assert (await other.process.exec("pwd")).stdout == "/srv/work\n"
        finally:
            await other.destroy()

    run(body)


def test_kill_is_term_then_kill_after_two_seconds_and_an_aborted_spawn_is_killed_at_once() -> None:
    provider = railway_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        try:
            # A command that ignores TERM: the KILL comes 2 s later, and kill() returns on the confirmed exit.
            stubborn = await handle.process.spawn("trap '' TERM; echo ready; sleep 600")
            await anext(aiter(stubborn.stdout))
            started = time.monotonic()
            await stubborn.kill()
            took = time.monotonic() - started
            assert 1.9 <= took < 12, f"TERM-then-KILL took {took:.2f} s"
            assert await stubborn.wait() == 137
            polite = await handle.process.spawn("echo ready; sleep 600")
            await anext(aiter(polite.stdout))
            await polite.kill()
            assert await polite.wait() == 143, "a TERM that ends the command is not followed by a KILL"
            # An aborted spawn gets KILL at once, even when it traps TERM.
            controller = AbortController()
            aborted = await handle.process.spawn(
                "trap '' TERM; echo ready; sleep 600", ProcessOptions(signal=controller.signal)
            )
            await anext(aiter(aborted.stdout))
            started = time.monotonic()
            controller.abort("stop")
            assert await aborted.wait() == 137 and time.monotonic() - started < 1.9
            # An aborted exec resolves with the code of the signal that ended it.
            controller = AbortController()
            asyncio.get_running_loop().call_later(0.5, controller.abort, "stop")
            result = await handle.process.exec("echo before; sleep 600", ProcessOptions(signal=controller.signal))
            assert (result.stdout, result.exit_code) == ("before\n", 143), result
            assert stubborn.pid == -1, "the exec bridge has no remote pid"
        finally:
            await handle.destroy()

    run(body)


def test_lifetime_size_region_and_fork_reach_the_api_as_the_seed_says() -> None:
    fake = railway_fake()
    provider = railway_fake_provider(
        region="eu-west4", idle_timeout_minutes=0, resources={"cpu": 0.5, "memory_gb": 2}, network_isolation="PRIVATE"
    )

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_PARENT": "p"}))
        child = None
        try:
            sent = fake.inputs[-1]
            assert sent["region"] == "eu-west4" and sent["idleTimeoutMinutes"] == 0
            assert sent["resources"] == {"cpu": 0.5, "memoryGB": 2} and sent["networkIsolation"] == "PRIVATE"
            assert provider.capabilities().durable_filesystem is False
            await handle.fs.write("/workspace/a.txt", "parent")
            handle.env.set({"BW_OVERLAY": "o"})
            child = await handle.fork()
            forked = fake.inputs[-1]
            assert forked["sourceSandboxId"] == handle.id and "region" not in forked, forked
            assert fake.sandboxes[child.id].region == "eu-west4" and fake.sandboxes[child.id].network == "PRIVATE"
            assert (await child.process.exec('cat a.txt; printf " %s %s" "$BW_PARENT" "$BW_OVERLAY"')).stdout == (
                "parent p o"
            )
            ref = await handle.snapshot()
        finally:
            for made in (child, handle):
                if made is not None:
                    await made.destroy()
        # The checkpoint outlives its source; the restore applies env, network and idle timeout again, no region.
        restored = await provider.restore_snapshot(RestoreInput(snapshot_id=ref.id, env={"BW_NEW": "n"}))
        try:
            sent = fake.inputs[-1]
            assert sent["template"] == {"name": ref.id} and "region" not in sent, sent
            assert sent["idleTimeoutMinutes"] == 0 and sent["variables"] == {"BW_NEW": "n"}
            assert sent["networkIsolation"] == "PRIVATE"
            assert (await restored.process.exec('cat a.txt; printf " %s" "$BW_NEW"')).stdout == "parent n"
        finally:
            await restored.destroy()

    run(body)


def test_project_tokens_use_their_own_header_and_reaping_lists_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = railway_fake()
    monkeypatch.setenv("RAILWAY_TOKEN", fake.project_token)
    monkeypatch.delenv("RAILWAY_API_TOKEN", raising=False)
    monkeypatch.setenv("RAILWAY_ENVIRONMENT_ID", fake.environment)
    provider = railway_sandbox(endpoint=fake.endpoint, exec_url=fake.exec_url)
    explicit = railway_fake_provider(token=fake.project_token, auth_type="project-token")

    async def body() -> None:
        handles = [await provider.create(), await explicit.create()]
        size, fake.page_size = fake.page_size, 1
        try:
            pages = fake.operations.count("Sandboxes")
            owned = [o.id for o in await provider.list_owned()]
            assert set(h.id for h in handles) <= set(owned), owned
            assert fake.operations.count("Sandboxes") - pages >= 2, "the listing did not cross a page"
        finally:
            fake.page_size = size
            for handle in handles:
                await handle.destroy()
        assert not {h.id for h in handles} & {o.id for o in await provider.list_owned()}

    run(body)
