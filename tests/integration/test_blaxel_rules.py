"""Blaxel's seed rules, one test each, on the real ``blaxel`` SDK against the fake (tests/support/fake_cloud/blaxel.py).

Secrets never reach a command string or the sandbox spec; a destroyed sandbox (kept as
TERMINATED), a missing one and a teardown state resume as None while DEACTIVATED resumes, and
an auth failure raises; network deny is refused; an abort during create leaves nothing behind;
previews are private with the ``X-Blaxel-Preview-Token`` header unless ``public_previews``;
``/workspace`` is ``/blaxel/workspace``; an output stream past its cap kills the command; the
process-global auth refuses a second workspace; leaked sandboxes are found by their ownership
labels across pages.
"""

from __future__ import annotations

import json

import httpx
import pytest

from boxwright.errors import ProviderUnavailableError, UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, ResumeInput
from tests.support.cloud_providers import blaxel_fake, blaxel_fake_provider
from tests.support.cloud_rules import abort_and_cancel_create, require_fake, run, serve_http
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-b1a8e1-do-not-leak"


fake_required = require_fake("blaxel")


def test_secrets_travel_as_request_env_never_in_a_command_string_or_the_spec() -> None:
    fake = blaxel_fake()
    provider = blaxel_fake_provider()
    seen_bodies = len(fake.bodies)

    async def body() -> None:
        handle = await provider.create(CreateInput(env={"BW_SECRET": SECRET}))
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET" | wc -c')
            assert seen.stdout.strip() == str(len(SECRET)), seen
            handle.env.set({"BW_SET": SECRET + "-set"})
            both = await handle.process.exec(
                'test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            )
            assert both.stdout == "ok\n", both
            # spawn goes through the supervisor: its env rides the process request, not the command.
            spawned = await handle.process.spawn(
                'test -n "$BW_SECRET$BW_SET$BW_CMD"', ProcessOptions(env={"BW_CMD": SECRET + "-spawn"})
            )
            assert (await spawned.wait()) == 0
            record = fake.boxes[handle.id].record
            assert SECRET not in json.dumps(record), "a secret reached the sandbox record"
        finally:
            await handle.destroy()

    run(body)
    commands = fake.commands()
    assert commands, "the fake received no commands"
    assert [c for c in commands if SECRET in c] == [], "a secret reached a command string"
    creates = [b for b in fake.bodies[seen_bodies:] if '"runtime"' in b]
    assert creates and all(SECRET not in b for b in creates), "a secret reached the create request"
    # Nor in pieces: split over commands, encoded, in a create request or a sandbox record (its labels).
    records = [*commands, *creates, *(json.dumps(b.record) for b in fake.boxes.values())]
    assert secret_pieces(records, SECRET) == []


def test_gone_states_resume_as_none_deactivated_resumes_and_auth_failure_raises() -> None:
    fake = blaxel_fake()
    provider = blaxel_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        name = handle.id
        fake.boxes[name].record["status"] = "DEACTIVATED"  # idle suspend: resumable, files kept
        resumed = await provider.resume(ResumeInput(id=name))
        assert resumed is not None and resumed.id == name
        fake.boxes[name].record["status"] = "DEPLOYED"
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"
        for status in ("DELETING", "DEACTIVATING", "FAILED"):
            fake.boxes[name].record["status"] = status
            assert await provider.resume(ResumeInput(id=name)) is None, status
        fake.boxes[name].record["status"] = "DEPLOYED"
        await handle.destroy()
        assert fake.boxes[name].record["status"] == "TERMINATED"  # still readable: Blaxel's retention
        assert await provider.resume(ResumeInput(id=name)) is None
        assert await provider.resume(ResumeInput(id="never-made-1")) is None
        await handle.destroy()  # already gone is success
        key = fake.api_key
        fake.api_key = "rotated"
        try:
            with pytest.raises(Exception) as caught:
                await provider.resume(ResumeInput(id=name))
            assert getattr(caught.value, "status_code", None) == 401, caught.value
        finally:
            fake.api_key = key

    run(body)


def test_network_deny_is_refused_not_dropped() -> None:
    fake = blaxel_fake()
    provider = blaxel_fake_provider()

    async def body() -> None:
        before = set(fake.boxes)
        for policy in (NetworkPolicy(mode="deny"), NetworkPolicy(mode="deny", allow_hosts=("api.anthropic.com",))):
            with pytest.raises(UnsupportedCapabilityError) as caught:
                await provider.create(CreateInput(network=policy))
            assert caught.value.capability == "network_policy"
        assert set(fake.boxes) == before, "a refused create still made a sandbox"

    run(body)


def test_abort_or_cancel_during_create_deletes_what_was_made() -> None:
    fake = blaxel_fake()
    provider = blaxel_fake_provider()

    async def body() -> None:
        before = {n for n, b in fake.boxes.items() if b.record["status"] != "TERMINATED"}
        await abort_and_cancel_create(fake, provider)
        live = {n for n, b in fake.boxes.items() if b.record["status"] != "TERMINATED"}
        assert live - before == set(), "a sandbox made during an aborted create was left behind"

    run(body)


def test_previews_are_private_with_the_token_header_unless_public() -> None:
    async def body() -> None:
        for public in (False, True):
            handle = await blaxel_fake_provider(public_previews=public).create()
            try:
                await serve_http(handle, "hello from blaxel")
                channel = await handle.ports.connect(8080)
                assert channel.url.endswith(f"/preview/{handle.id}/8080"), channel
                async with httpx.AsyncClient(timeout=20) as client:
                    bare = await client.get(channel.url + "/index.html")
                    if public:
                        assert channel.headers is None and channel.token is None, channel
                        assert bare.status_code == 200 and bare.text == "hello from blaxel", bare.text
                        continue
                    assert channel.headers is not None and set(channel.headers) == {"X-Blaxel-Preview-Token"}
                    assert channel.token == channel.headers["X-Blaxel-Preview-Token"]
                    assert bare.status_code == 401, bare.text
                    authed = await client.get(channel.url + "/index.html", headers=channel.headers)
                    assert authed.status_code == 200 and authed.text == "hello from blaxel", authed.text
            finally:
                await handle.destroy()

    run(body)


def test_workspace_maps_to_blaxel_workspace() -> None:
    async def body() -> None:
        handle = await blaxel_fake_provider().create()
        try:
            assert handle.workspace_root == "/blaxel/workspace"
            assert (await handle.process.exec("pwd")).stdout == "/blaxel/workspace\n"
            await handle.fs.write("/workspace/sub/f.txt", "mapped")
            assert (await handle.process.exec("cat /blaxel/workspace/sub/f.txt")).stdout == "mapped"
            listed = await handle.fs.list("/workspace/sub")
            assert [(e.name, e.path) for e in listed] == [("f.txt", "/workspace/sub/f.txt")]
        finally:
            await handle.destroy()

    run(body)


def test_an_output_stream_past_its_cap_kills_the_command() -> None:
    async def body() -> None:
        handle = await blaxel_fake_provider(output_limit=64 * 1024).create()
        try:
            result = await handle.process.exec("head -c 300000 /dev/zero | tr '\\0' a; echo survived >&2; sleep 30")
            assert result.exit_code == 137, result.exit_code
            assert len(result.stdout) <= 64 * 1024 + 3000, len(result.stdout)
            assert "passed 65536 bytes; the command was killed" in result.stderr, result.stderr[-200:]
            gone = await handle.process.exec("ps -eo args | grep -c '[s]leep 30'")
            assert gone.stdout.strip() == "0", gone
        finally:
            await handle.destroy()

    run(body)


def test_a_second_workspace_in_the_same_process_is_refused() -> None:
    blaxel_fake_provider()  # binds the fake's workspace
    with pytest.raises(ProviderUnavailableError) as caught:
        blaxel_fake_provider(workspace="another-ws")
    assert "another-ws" in str(caught.value) and "global" in str(caught.value)


def test_leaked_sandboxes_are_found_by_ownership_labels_across_pages() -> None:
    fake = blaxel_fake()
    provider = blaxel_fake_provider(run_id="run-owned-bl")

    async def body() -> None:
        handles = [await provider.create() for _ in range(3)]
        try:
            labels = fake.boxes[handles[0].id].record["metadata"]["labels"]
            assert labels["boxwright.managed"] == "1" and labels["boxwright.run"] == "run-owned-bl", labels
            owned = [o.id for o in await provider.list_owned({"boxwright.run": "run-owned-bl"})]
            assert sorted(owned) == sorted(h.id for h in handles), owned  # page size 2: three pages' worth
        finally:
            for handle in handles:
                await handle.destroy()
        assert await provider.list_owned({"boxwright.run": "run-owned-bl"}) == []

    run(body)
