"""Cloudflare's rules (spec §2.7), one test each, against the fake of boxwright's Worker.

Secrets travel in request bodies, never in a command string; a destroyed (or wiped) sandbox
resumes as None; network deny is refused; ports need ``preview_hostname`` and give the preview
URL; ``/workspace`` is the container's own; ``kill()`` cannot reach a process and says so once;
stdin raises; a wrong token is a ``ProviderUnavailableError`` naming the Worker's setup.
"""

from __future__ import annotations

import asyncio

import pytest

from boxwright.abort import AbortController
from boxwright.errors import AbortError, ProviderUnavailableError, UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, ResumeInput
from boxwright.testkit import RecordingLogger
from tests.support.cloud_providers import cloudflare_fake, cloudflare_fake_provider
from tests.support.cloud_rules import require_fake, run
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-c10udf-do-not-leak"


fake_required = require_fake("cloudflare")


def test_secrets_travel_in_request_bodies_never_in_a_command_string() -> None:
    fake = cloudflare_fake()

    async def body() -> None:
        handle = await cloudflare_fake_provider().create(CreateInput(env={"BW_SECRET": SECRET}))
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET" | wc -c')
            assert seen.stdout.strip() == str(len(SECRET)), seen
            opts = ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            spawned = await handle.process.spawn('test -n "$BW_CMD" && echo ok', opts)
            assert (await spawned.wait()) == 0
            handle.env.set({"BW_SET": SECRET + "-set"})
            both = await handle.process.exec('test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', opts)
            assert both.stdout == "ok\n", both
        finally:
            await handle.destroy()

    run(body)
    assert fake.commands(), "the fake received no commands"
    assert [c for c in fake.commands() if SECRET in c] == [], "a secret reached a command string"
    # Nor in pieces: split over commands or encoded in them.
    assert secret_pieces(fake.commands(), SECRET) == []


def test_a_destroyed_sandbox_resumes_as_none_and_a_live_one_keeps_its_files() -> None:
    provider = cloudflare_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and await resumed.fs.read("/workspace/kept.txt") == "kept"
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        await handle.destroy()  # already gone is success

    run(body)


def test_network_deny_is_refused_and_a_wrong_token_names_the_worker_setup() -> None:
    async def body() -> None:
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await cloudflare_fake_provider().create(CreateInput(network=NetworkPolicy(mode="deny")))
        assert caught.value.capability == "network_policy"
        with pytest.raises(ProviderUnavailableError) as refused:
            await cloudflare_fake_provider(token="wrong").create()
        assert "BOXWRIGHT_CLOUDFLARE_TOKEN" in str(refused.value)

    run(body)


def test_ports_need_a_preview_hostname_and_workspace_is_the_containers() -> None:
    async def body() -> None:
        handle = await cloudflare_fake_provider().create()
        bare = await cloudflare_fake_provider(preview_hostname=None).resume(ResumeInput(id=handle.id))
        try:
            channel = await handle.ports.connect(8080)
            assert channel.url == f"https://8080-{handle.id}.preview.cf.fake", channel
            assert bare is not None
            with pytest.raises(UnsupportedCapabilityError):
                await bare.ports.connect(8080)
            assert handle.workspace_root == "/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /workspace/sub/f.txt")).stdout == "mapped"
        finally:
            await handle.destroy()

    run(body)


def test_kill_cannot_reach_the_process_and_says_so_once_and_stdin_raises() -> None:
    logger = RecordingLogger()

    async def body() -> None:
        handle = await cloudflare_fake_provider(logger=logger).create()
        try:
            process = await handle.process.spawn("sleep 2; echo still-ran")
            with pytest.raises(UnsupportedCapabilityError):
                await process.stdin.write("x")
            await process.kill()
            await process.kill()
            assert (await process.wait()) == 0  # no signal crosses Workers RPC: it ran to its end
            assert not handle.capabilities.killable_processes
        finally:
            await handle.destroy()

    run(body)
    warned = [m for m, _ in logger.warnings if "cannot reach" in m]
    assert len(warned) == 1, logger.warnings


def test_abort_or_cancel_during_create_destroys_the_sandbox_it_made() -> None:
    fake = cloudflare_fake()
    provider = cloudflare_fake_provider()

    async def body() -> None:
        fake.mkdir_delay = 1.5
        try:
            controller = AbortController()
            asyncio.get_running_loop().call_later(0.5, controller.abort, "user cancelled")
            with pytest.raises(AbortError):
                await provider.create(CreateInput(id="bw-cf-aborted", env={"K": "v"}, signal=controller.signal))
            task = asyncio.ensure_future(provider.create(CreateInput(id="bw-cf-cancelled", env={"K": "v"})))
            for _ in range(300):  # cancel once the Durable Object exists (its container start is slow under load)
                if "bw-cf-cancelled" in fake.boxes:
                    break
                await asyncio.sleep(0.1)
            assert "bw-cf-cancelled" in fake.boxes and not task.done(), "the Durable Object was not made"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            fake.mkdir_delay = 0.0
        # create returns (raises) only after its clean-up: nothing to wait for.
        left = {"bw-cf-aborted", "bw-cf-cancelled"} & set(fake.boxes)
        assert left == set(), f"an aborted or cancelled create left {left}"

    run(body)
