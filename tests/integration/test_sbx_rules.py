"""Docker Sandboxes' seed rules (spec §2.3), one test each, through the fake ``sbx`` CLI and its daemon.

Env values reach the host CLI's argv only, never the VM's command; the workspace must be git
(a git URL becomes an owned clone that destroy removes); a missing CLI and a missing login give
install and login help; the network plan (machine policy check, adapter host, deny allowlist,
``**`` for allow); a destroyed sandbox resumes as None, a stopped one restarts on exec; ports are
published to ``http://localhost:<host>``; names are one path segment.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import httpx
import pytest

from boxwright.abort import AbortController
from boxwright.errors import AbortError, ProviderUnavailableError, SandboxCommandError, UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, ResumeInput
from boxwright.workspace import Workspace, git_source
from tests.support.cloud_providers import sbx_fake, sbx_fake_provider
from tests.support.cloud_rules import require_fake, run
from tests.support.secret_scan import secret_pieces

pytestmark = pytest.mark.integration

SECRET = "bw-secret-5b%-do-not-leak"


fake_required = require_fake("sbx")


def test_env_values_reach_the_cli_argv_never_the_vm_command() -> None:
    fake = sbx_fake()

    async def body() -> None:
        handle = await sbx_fake_provider().create(CreateInput(env={"BW_SECRET": SECRET}))
        try:
            seen = await handle.process.exec('printf %s "$BW_SECRET"', ProcessOptions(env={"BW_CMD": "x"}))
            assert seen.stdout == SECRET, seen
            handle.env.set({"BW_SET": SECRET + "-set"})
            opts = ProcessOptions(env={"BW_CMD": SECRET + "-cmd"})
            both = await handle.process.exec('test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', opts)
            assert both.stdout == "ok\n", both
            spawned = await handle.process.spawn('test -n "$BW_SECRET$BW_CMD" && echo ok', opts)
            assert (await spawned.wait()) == 0
        finally:
            await handle.destroy()

    run(body)
    assert [c for c in fake.commands() if SECRET in c] == [], "a secret reached the VM's command"
    # Nor in pieces inside the VM (the CLI's own argv carries `-e K=V` by design, S6: not scanned here).
    assert secret_pieces(fake.commands(), SECRET) == []
    assert any(f"BW_SECRET={SECRET}" in argv for argv in fake.invocations), "env did not travel as -e K=V"


def test_the_workspace_must_be_git_and_a_git_url_is_an_owned_clone() -> None:
    fake = sbx_fake()

    async def body() -> None:
        plain = tempfile.mkdtemp(prefix="boxwright-sbx-plain-")
        try:
            with pytest.raises(ProviderUnavailableError) as caught:
                await sbx_fake_provider(workspace_dir=plain).create()
            assert "git" in str(caught.value)
        finally:
            os.rmdir(plain)
        source = sbx_fake_provider().workspace_dir
        clones = tempfile.mkdtemp(prefix="boxwright-sbx-clones-")
        provider = sbx_fake_provider(workspace_dir=None, clone_root=clones)
        handle = await provider.create(CreateInput(id="bw-clone-1", workspace=Workspace(source=git_source(source))))
        try:
            assert os.path.isdir(os.path.join(clones, "bw-clone-1", ".git"))
            assert os.path.exists(os.path.join(clones, "bw-clone-1.owned"))
            assert (await handle.process.exec("cat README.md")).stdout == "fake sbx workspace\n"
        finally:
            await handle.destroy()
        assert os.listdir(clones) == [], "destroy left the owned clone"
        os.rmdir(clones)
        assert "bw-clone-1" not in fake.vms

    run(body)


def test_a_missing_cli_and_a_missing_login_say_how_to_fix_them() -> None:
    fake = sbx_fake()

    async def body() -> None:
        with pytest.raises(ProviderUnavailableError) as caught:
            await sbx_fake_provider(binary="/nonexistent/sbx").create()
        assert "PATH" in str(caught.value) and "Docker Sandboxes" in str(caught.value)
        fake.logged_in = False
        try:
            with pytest.raises(ProviderUnavailableError) as caught:
                await sbx_fake_provider().resume(ResumeInput(id="anything"))
            assert "sbx login" in str(caught.value) and "--password-stdin" in str(caught.value)
        finally:
            fake.logged_in = True

    run(body)


def test_the_network_plan_per_policy() -> None:
    fake = sbx_fake()
    provider = sbx_fake_provider(allow_network=("registry.npmjs.org",))

    async def body() -> None:
        made = []
        try:
            cases = [
                (None, "claude-code", [("allow", "api.anthropic.com"), ("allow", "localhost")]),
                (None, None, []),
                (NetworkPolicy(mode="allow"), None, [("allow", "**")]),
                (
                    NetworkPolicy(mode="deny", allow_hosts=("example.com",)),
                    "codex",
                    [("allow", h) for h in ("api.openai.com", "localhost", "registry.npmjs.org", "example.com")],
                ),
            ]
            for policy, adapter, rules in cases:
                handle = await provider.create(CreateInput(network=policy, adapter_name=adapter))
                made.append(handle)
                assert fake.vms[handle.id].rules == rules, (policy, adapter, fake.vms[handle.id].rules)
            assert fake.policies and fake.policies[0]["preset"] == "deny-all"  # initialised when it had none
            with pytest.raises(UnsupportedCapabilityError):
                await sbx_fake_provider().create(CreateInput(network=NetworkPolicy(mode="deny")))
            saved = list(fake.policies)
            fake.policies[:] = [{"preset": "open"}, {"action": "allow", "resource": "example.com"}]
            try:
                with pytest.raises(ProviderUnavailableError) as caught:
                    await provider.create()
                assert "fails closed" in str(caught.value)
            finally:
                fake.policies[:] = saved
        finally:
            for handle in made:
                await handle.destroy()

    run(body)


def test_a_destroyed_sandbox_resumes_as_none_and_a_stopped_one_restarts_on_exec() -> None:
    fake = sbx_fake()
    provider = sbx_fake_provider()

    async def body() -> None:
        handle = await provider.create()
        await handle.fs.write("/workspace/kept.txt", "kept")
        await provider.host(["stop", handle.id], "stop")
        assert fake.vms[handle.id].status == "stopped"
        resumed = await provider.resume(ResumeInput(id=handle.id))
        assert resumed is not None and resumed.workspace_root == handle.workspace_root
        assert await resumed.fs.read("/workspace/kept.txt") == "kept"
        await handle.destroy()
        assert await provider.resume(ResumeInput(id=handle.id)) is None
        await handle.destroy()  # already gone is success
        with pytest.raises(ValueError):
            await provider.create(CreateInput(id="../escape"))

    run(body)


def test_ports_are_published_to_localhost() -> None:
    async def body() -> None:
        handle = await sbx_fake_provider().create()
        try:
            # Path mapping (S4): `/workspace` is the cloned repo, the VM's `sbx exec N pwd`.
            assert handle.workspace_root == sbx_fake().vms[handle.id].workspace, handle.workspace_root
            await handle.fs.write("/workspace/www/index.html", "hello from sbx")
            mapped = await handle.process.exec(f"cat {handle.workspace_root}/www/index.html")
            assert mapped.stdout == "hello from sbx", mapped
            await handle.process.spawn("cd www && exec python3 -m http.server 8080 --bind 0.0.0.0")
            probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8080))'"
            for _ in range(100):
                if (await handle.process.exec(probe)).exit_code == 0:
                    break
                await asyncio.sleep(0.1)
            channel = await handle.ports.connect(8080)
            assert channel.url.startswith("http://localhost:"), channel
            async with httpx.AsyncClient(timeout=20) as client:
                got = await client.get(channel.url.replace("localhost", "127.0.0.1") + "/index.html")
            assert got.status_code == 200 and got.text == "hello from sbx", got.text
        finally:
            await handle.destroy()

    run(body)


def test_a_failed_cancelled_or_aborted_create_removes_the_vm_it_made() -> None:
    fake = sbx_fake()
    provider = sbx_fake_provider()

    async def body() -> None:
        try:
            # S4: `sbx create` made the VM, then failed: the VM is removed, the error is the create's.
            fake.create_fails_after_making = True
            with pytest.raises(SandboxCommandError) as caught:
                await provider.create(CreateInput(id="bw-failed-create"))
            assert "timed out" in str(caught.value), caught.value
            assert "bw-failed-create" not in fake.vms, "a failed create left its VM"
            fake.create_fails_after_making = False
            # A name in use is another's sandbox: the failed create leaves it alone.
            other = await provider.create(CreateInput(id="bw-taken"))
            try:
                with pytest.raises(SandboxCommandError):
                    await provider.create(CreateInput(id="bw-taken"))
                assert "bw-taken" in fake.vms, "a create that found the name in use removed the sandbox"
            finally:
                await other.destroy()
            # Cancelled while the CLI creates: the CLI child keeps going, so create waits for it, then removes.
            fake.create_delay = 1.5
            task = asyncio.ensure_future(provider.create(CreateInput(id="bw-cancelled-create")))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "bw-cancelled-create" not in fake.vms, "a cancelled create left its VM"
            # Aborted while the CLI creates: the same clean-up, and an AbortError.
            controller = AbortController()
            asyncio.get_running_loop().call_later(0.5, controller.abort, "user cancelled")
            with pytest.raises(AbortError):
                await provider.create(CreateInput(id="bw-aborted-create", signal=controller.signal))
            assert "bw-aborted-create" not in fake.vms, "an aborted create left its VM"
        finally:
            fake.create_fails_after_making = False
            fake.create_delay = 0.0

    run(body)
