"""Bad input and provider-specific edges of local-process (and bubblewrap where they share them)."""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest

from boxwright.errors import (
    ProviderUnavailableError,
    SandboxPathError,
    UnsupportedCapabilityError,
)
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import CreateInput, DestroyInput, NetworkPolicy, ProcessOptions, ResumeInput
from boxwright.testkit import RecordingLogger, host_pids, skip_unavailable

pytestmark = pytest.mark.integration


def _providers(tmp_path, dir=None):
    found = [local_process_sandbox(dir, base_dir=tmp_path / "lp")]
    if probe().available:
        found.append(bubblewrap_sandbox(dir, base_dir=tmp_path / "bw"))
    return found


def test_fixed_dir_that_is_a_file_is_refused_clearly(tmp_path):
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    for provider in _providers(tmp_path, not_a_dir):
        with pytest.raises(SandboxPathError, match="is a file, not a directory") as caught:
            asyncio.run(provider.create())
        assert str(not_a_dir) in str(caught.value), provider.name
        assert not_a_dir.read_text() == "x"


def test_local_refuses_network_deny():
    with pytest.raises(UnsupportedCapabilityError) as caught:
        asyncio.run(local_process_sandbox().create(CreateInput(network=NetworkPolicy(mode="deny"))))
    assert (caught.value.provider, caught.value.capability) == ("local-process", "network_policy")
    assert "bubblewrap" in str(caught.value)  # the hint names the provider that can


def test_bubblewrap_refuses_a_host_allow_list(tmp_path):
    if not probe().available:
        skip_unavailable("bubblewrap", probe().reason)
    policy = NetworkPolicy(mode="deny", allow_hosts=("api.example.com",))
    with pytest.raises(UnsupportedCapabilityError) as caught:
        asyncio.run(bubblewrap_sandbox(base_dir=tmp_path).create(CreateInput(network=policy)))
    assert (caught.value.provider, caught.value.capability) == ("bubblewrap", "network_policy")
    assert not os.path.exists(tmp_path) or os.listdir(tmp_path) == []


def test_bubblewrap_without_bwrap_is_unavailable_with_help(tmp_path):
    provider = bubblewrap_sandbox(base_dir=tmp_path, bwrap=f"no-such-bwrap-{secrets.token_hex(3)}")
    with pytest.raises(ProviderUnavailableError, match="apt-get install bubblewrap") as caught:
        asyncio.run(provider.create())
    assert caught.value.provider == "bubblewrap"


def test_local_destroy_kills_processes_but_keeps_a_fixed_dir(tmp_path):
    workspace = tmp_path / "mine"
    workspace.mkdir()
    token = f"98762{secrets.randbelow(90000) + 10000}"

    async def main():
        provider = local_process_sandbox(workspace)
        handle = await provider.create()
        process = await handle.process.spawn(f"( sleep {token} ) & echo up; wait")
        async for chunk in process.stdout:
            assert chunk == "up\n"
            break
        for _ in range(100):
            if host_pids(["sleep", token]):
                break
            await asyncio.sleep(0.02)
        assert host_pids(["sleep", token])
        await handle.destroy()
        code = await asyncio.wait_for(process.wait(), 15)
        # A kept dir is still there for resume (K2), and provider.destroy does not remove what it does not own.
        await provider.destroy(DestroyInput(id=handle.id))
        resumed = await provider.resume(ResumeInput(id=handle.id))
        return code, resumed

    try:
        code, resumed = asyncio.run(main())
        assert code > 128
        assert not host_pids(["sleep", token]), "destroy() left a backgrounded child running"
        assert workspace.is_dir()
        assert resumed is not None and resumed.id == str(workspace)
    finally:
        for pid in host_pids(["sleep", token]):
            os.kill(pid, 9)


def test_local_resume_of_a_foreign_dir_does_not_own_it(tmp_path):
    """Resuming a directory this provider did not create must not delete it on destroy."""
    foreign = tmp_path / "users-project"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")

    async def main():
        provider = local_process_sandbox(base_dir=tmp_path / "generated")
        handle = await provider.resume(ResumeInput(id=str(foreign)))
        assert handle is not None
        await handle.destroy()
        await provider.destroy(DestroyInput(id=str(foreign)))
        own = await provider.create()
        again = await provider.resume(ResumeInput(id=own.id))
        assert again is not None
        await again.destroy()
        return own.id

    own = asyncio.run(main())
    assert (foreign / "precious.txt").read_text() == "keep me"
    assert not os.path.exists(own), "a resumed sandbox of our own base dir is still ours to remove"


def test_local_fork_of_a_fork_is_refused(tmp_path):
    async def main():
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            child = await handle.fork()
            try:
                with pytest.raises(UnsupportedCapabilityError) as caught:
                    await child.fork()
                return caught.value
            finally:
                await child.destroy()
        finally:
            await handle.destroy()

    error = asyncio.run(main())
    assert (error.provider, error.capability) == ("local-process", "fork")


def test_local_scrub_env_deletes_keys_even_over_explicit_env(tmp_path, monkeypatch):
    monkeypatch.setenv("BOXWRIGHT_TEST_API_KEY", "host-value")
    monkeypatch.setenv("BOXWRIGHT_TEST_KEEP", "kept")

    async def main():
        provider = local_process_sandbox(base_dir=tmp_path, scrub_env=["BOXWRIGHT_TEST_API_KEY"])
        handle = await provider.create(CreateInput(env={"BOXWRIGHT_TEST_API_KEY": "create"}))
        try:
            opts = ProcessOptions(env={"BOXWRIGHT_TEST_API_KEY": "command"})
            return await handle.process.exec('echo "${BOXWRIGHT_TEST_API_KEY-absent}/$BOXWRIGHT_TEST_KEEP"', opts)
        finally:
            await handle.destroy()

    assert asyncio.run(main()).stdout == "absent/kept\n"


def test_local_logger_gets_no_warning_from_a_normal_life(tmp_path):
    logger = RecordingLogger()

    async def main():
        handle = await local_process_sandbox(base_dir=tmp_path, logger=logger).create()
        process = await handle.process.spawn("sleep 30")
        await process.kill()
        await handle.process.exec("true")
        await handle.destroy()

    asyncio.run(main())
    assert logger.warnings == []
