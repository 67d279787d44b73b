"""Sprites' seed rules, one test each, on the real ``sprites-py`` SDK against its fake (fake_cloud/sprites.py).

Secrets reach neither a command string, a request URL or body, nor a checkpoint; a destroyed
and a never-made Sprite resume as None while an auth failure raises; network deny is refused;
an abort or cancel during create leaves no Sprite; only the HTTP port is reachable, private
until ``connect`` makes it public; ``/workspace`` is ``/home/sprite/workspace``; a checkpoint
restores in place and there is no ``restore_snapshot``; leaked Sprites are found by their
ownership labels across pages.
"""

from __future__ import annotations

import json

import httpx
import pytest

from boxwright.errors import UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, ResumeInput
from tests.support.cloud_providers import sprites_fake, sprites_fake_provider
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

SECRET = "bw-secret-5pr1te-do-not-leak"


fake_required = require_fake("sprites")


def test_secrets_never_reach_a_command_a_url_a_body_or_a_checkpoint() -> None:
    fake = sprites_fake()
    provider = sprites_fake_provider()
    seen = len(fake.requests), len(fake.bodies)

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        try:
            await sees_secret_env(handle, SECRET)
            await handle.fs.write("/workspace/big.bin", b"x" * 200_000)  # contents over stdin, not the URL
            assert len(await handle.fs.read_bytes("/workspace/big.bin")) == 200_000
            await handle.snapshot("after-secrets")
            swept = await handle.process.exec(
                'grep -rlF -e "$BW_SECRET" /var/lib/fake-sprite-checkpoints; echo "rc=$?"'
            )
            assert swept.stdout.strip() == "rc=1", swept  # grep found nothing in the checkpoint
        finally:
            await handle.destroy()

    run(body)
    assert_no_secret_in_commands(fake, SECRET)
    urls = [path for _, path in fake.requests[seen[0] :]]
    assert any("/exec?" in u for u in urls), urls[:5]
    assert [u for u in urls if SECRET in u] == [], "a secret reached a request URL"
    assert [b for b in fake.bodies[seen[1] :] if SECRET in b] == [], "a secret reached a request body"


def test_gone_and_never_made_resume_as_none_and_auth_failure_raises() -> None:
    fake = sprites_fake()
    provider = sprites_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and resumed.id == handle.id
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"
        refused = await resume_with_token(provider, fake, handle.id, "fake-org/1/tok_rotated/other")
        assert type(refused).__name__ == "AuthenticationError", refused
        await gone_resumes_as_none(provider, handle)

    run(body)


def test_network_deny_is_refused_not_dropped() -> None:
    fake = sprites_fake()
    provider = sprites_fake_provider()

    async def body() -> None:
        await refuses_network_deny(provider, lambda: set(fake.sprites))

    run(body)


def test_abort_or_cancel_during_create_destroys_what_was_made() -> None:
    fake = sprites_fake()
    provider = sprites_fake_provider()

    async def body() -> None:
        before = set(fake.sprites)
        await abort_and_cancel_create(fake, provider)
        assert set(fake.sprites) - before == set(), "a Sprite made during an aborted create was left behind"

    run(body)


def test_only_the_http_port_private_until_connect_makes_it_public() -> None:
    fake = sprites_fake()

    async def body() -> None:
        handle = await sprites_fake_provider().create()
        try:
            await serve_http(handle, "hello from a sprite")
            host = {"Host": f"{handle.id}.sprites.fake"}
            async with httpx.AsyncClient(base_url=fake.api_url, timeout=20) as client:
                private = await client.get("/index.html", headers=host)
                assert private.status_code == 401, private.text  # URL auth "sprite": the org token only
                with pytest.raises(UnsupportedCapabilityError):
                    await handle.ports.connect(3000)
                channel = await handle.ports.connect(8080)
                assert channel.url == f"http://{handle.id}.sprites.fake", channel
                assert channel.headers is None and channel.token is None, channel
                public = await client.get("/index.html", headers=host)
                assert public.status_code == 200 and public.text == "hello from a sprite", public.text
        finally:
            await handle.destroy()

    run(body)


def test_workspace_maps_to_the_sprite_home() -> None:
    run(lambda: maps_workspace(sprites_fake_provider(), "/home/sprite/workspace"))


def test_a_checkpoint_restores_in_place_and_there_is_no_restore_snapshot() -> None:
    provider = sprites_fake_provider()
    assert provider.restore_snapshot is None  # checkpoints die with their Sprite

    async def body() -> None:
        handle = await provider.create()
        try:
            await handle.fs.write("/workspace/state.txt", "before")
            ref = await handle.snapshot("c1")
            await handle.fs.write("/workspace/state.txt", "after")
            await handle.fs.write("/workspace/extra.txt", "later")
            listed = await handle.list_checkpoints()
            assert [(c.id, c.label) for c in listed] == [(ref.id, "c1")], listed
            await handle.restore_checkpoint(ref.id)
            assert await handle.fs.read("/workspace/state.txt") == "before"
            assert not await handle.fs.exists("/workspace/extra.txt")
        finally:
            await handle.destroy()

    run(body)


def test_leaked_sprites_are_found_by_ownership_labels_across_pages() -> None:
    fake = sprites_fake()
    provider = sprites_fake_provider(run_id="run-owned-sp")

    async def body() -> None:
        handles = [await provider.create() for _ in range(3)]
        try:
            labels = fake.sprites[handles[0].id].labels
            assert "boxwright.managed=1" in labels and "boxwright.run=run-owned-sp" in labels, labels
            owned = [o.id for o in await provider.list_owned({"boxwright.run": "run-owned-sp"})]
            assert sorted(owned) == sorted(h.id for h in handles), owned  # page size 2: two pages
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "run-owned-sp"}) == []
        assert json.dumps(fake.bodies).count("boxwright.owner=") >= 3

    run(body)
