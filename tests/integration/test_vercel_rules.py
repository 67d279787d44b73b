"""Vercel's seed rules, one test each, on the real ``vercel-sandbox`` SDK against its fake (fake_cloud/vercel.py).

Secrets reach neither a command string nor the sandbox's configuration (what its snapshots
keep); a deleted and a never-made sandbox resume as None while an auth failure raises; a
stopped persistent sandbox resumes with its files; network deny is refused; an abort or cancel
during create leaves no sandbox; only declared ports have (public) domains; ``/workspace`` is
``/vercel/sandbox``; the server-side kill alone leaves a forked child running (why
``killable_processes`` is false); leaked sandboxes are found by their ownership tags across pages.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, ResumeInput
from tests.support.cloud_providers import vercel_fake, vercel_fake_provider
from tests.support.cloud_rules import (
    abort_and_cancel_create,
    assert_no_secret_in_commands,
    gone_resumes_as_none,
    maps_workspace,
    refuses_network_deny,
    require_fake,
    resume_with_token,
    run,
    sees_secret_env,
    serve_http,
)

pytestmark = pytest.mark.integration

SECRET = "bw-secret-v3rce1-do-not-leak"

fake_required = require_fake("vercel")


def test_secrets_never_reach_a_command_string_or_the_sandbox_config() -> None:
    fake = vercel_fake()
    provider = vercel_fake_provider()
    seen = len(fake.bodies)

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        try:
            await sees_secret_env(handle, SECRET)
            await handle.fs.write("/workspace/f.txt", "plain")  # helper commands carry no handle env
        finally:
            await handle.destroy()

    run(body)
    assert_no_secret_in_commands(fake, SECRET)
    bodies = [json.loads(b) for b in fake.bodies[seen:] if b]
    creates = [b for b in bodies if "projectId" in b]
    assert creates and all(SECRET not in json.dumps(b) for b in creates), "a secret reached the sandbox config"
    runs = [b for b in bodies if "command" in b]
    assert all(SECRET not in json.dumps([b["command"], b.get("args")]) for b in runs), "a secret in argv"
    with_env = [b for b in runs if SECRET in json.dumps(b.get("env"))]
    assert len(with_env) == 2, with_env  # the two user commands, as their env field
    assert all("base64" not in json.dumps(b.get("args")) for b in with_env)


def test_gone_and_never_made_resume_as_none_stopped_resumes_and_auth_failure_raises() -> None:
    fake = vercel_fake()
    provider = vercel_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        session = fake.sandboxes[handle.id].session
        await asyncio.to_thread(fake.stop, handle.id)  # the session ended (its time limit): the disk stays
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and resumed.id == handle.id
        assert fake.sandboxes[handle.id].session != session, "a resume starts a new session"
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"
        refused = await resume_with_token(provider, fake, handle.id, "rotated")
        assert getattr(refused, "status_code", None) == 401, refused
        await gone_resumes_as_none(provider, handle)

    run(body)


def test_network_deny_is_refused_not_dropped() -> None:
    fake = vercel_fake()
    provider = vercel_fake_provider()

    async def body() -> None:
        await refuses_network_deny(provider, lambda: set(fake.sandboxes))

    run(body)


def test_abort_or_cancel_during_create_deletes_what_was_made() -> None:
    fake = vercel_fake()
    provider = vercel_fake_provider()

    async def body() -> None:
        before = set(fake.sandboxes)
        await abort_and_cancel_create(fake, provider)
        assert set(fake.sandboxes) - before == set(), "a sandbox made during an aborted create was left behind"

    run(body)


def test_declared_ports_have_public_domains_others_raise() -> None:
    fake = vercel_fake()

    async def body() -> None:
        handle = await vercel_fake_provider(ports=[8080]).create()
        try:
            await serve_http(handle, "hello from vercel")
            with pytest.raises(UnsupportedCapabilityError) as caught:
                await handle.ports.connect(3000)
            assert "8080" in str(caught.value)
            channel = await handle.ports.connect(8080)
            assert channel.url.startswith("https://") and channel.url.endswith(".vercel.fake"), channel
            assert channel.headers is None and channel.token is None, channel
            host = {"Host": channel.url.removeprefix("https://")}
            async with httpx.AsyncClient(base_url=fake.api_url, timeout=20) as client:
                public = await client.get("/index.html", headers=host)  # no credentials: a public domain
            assert public.status_code == 200 and public.text == "hello from vercel", public.text
        finally:
            await handle.destroy()

    run(body)


def test_workspace_maps_to_vercel_sandbox() -> None:
    run(lambda: maps_workspace(vercel_fake_provider(), "/vercel/sandbox"))


def test_the_server_side_kill_alone_leaves_a_forked_child() -> None:
    provider = vercel_fake_provider()
    assert provider.capabilities().killable_processes is False

    async def body() -> None:
        handle = await provider.create()
        try:
            process = await handle.process.spawn("( sleep 987650 ) & wait")
            await asyncio.sleep(0.5)
            await process._command.kill()  # Vercel's Command.kill: the command's own pid
            await asyncio.sleep(0.5)
            left = await handle.process.exec("ps -eo args | grep -cx 'sleep 987650'")
            assert left.stdout.strip() == "1", left  # the forked child survived it
            await process.kill()  # boxwright's: the group inside the sandbox
            assert await asyncio.wait_for(process.wait(), 30) > 128
            gone = await handle.process.exec("ps -eo args | grep -cx 'sleep 987650'")
            assert gone.stdout.strip() == "0", gone
        finally:
            await handle.destroy()

    run(body)


def test_leaked_sandboxes_are_found_by_ownership_tags_across_pages() -> None:
    fake = vercel_fake()
    provider = vercel_fake_provider(run_id="run-owned-vc")

    async def body() -> None:
        handles = [await provider.create() for _ in range(3)]
        try:
            tags = fake.sandboxes[handles[0].id].tags
            assert tags["boxwright.managed"] == "1" and tags["boxwright.run"] == "run-owned-vc", tags
            owned = await provider.list_owned({"boxwright.run": "run-owned-vc"})
            assert sorted(o.id for o in owned) == sorted(h.id for h in handles), owned  # page size 2
            assert all(o.lease_expires is not None for o in owned), owned
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "run-owned-vc"}) == []

    run(body)
