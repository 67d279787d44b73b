"""What bubblewrap isolates, proved from inside a real sandbox (needs a working `bwrap`)."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import tempfile

import pytest

from boxwright.providers import bubblewrap_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import CreateInput, DestroyInput, NetworkPolicy, ResumeInput
from boxwright.testkit import host_pids, skip_unavailable

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _bwrap_available():
    found = probe()
    if not found.available:
        skip_unavailable("bubblewrap", found.reason)


def _nonce() -> str:
    return secrets.token_hex(6)


async def _read_until(stream, needle: str, timeout: float = 30.0) -> str:
    text = ""

    async def read() -> None:
        nonlocal text
        async for chunk in stream:
            text += chunk
            if needle in text:
                return
        raise AssertionError(f"stream ended before {needle!r}: {text!r}")

    await asyncio.wait_for(read(), timeout)
    return text


def test_cannot_write_outside_the_workspace(tmp_path):
    name = f"boxwright-canary-{_nonce()}"
    host_tmp_dir = tempfile.gettempdir()
    targets = ["/usr", "/etc", "/root", "/home", "/var", host_tmp_dir, "/", "/workspace/.."]

    async def main():
        provider = bubblewrap_sandbox(base_dir=tmp_path)
        handle = await provider.create()
        try:
            script = "; ".join(f"(echo x > {t.rstrip('/')}/{name}) 2>/dev/null && echo wrote:{t}" for t in targets)
            result = await handle.process.exec(script + "; echo inside > /workspace/ok.txt")
            return result, os.path.dirname(handle.workspace_root)
        finally:
            await handle.destroy()

    result, state_dir = asyncio.run(main())
    assert result.exit_code == 0, result
    # Inside, only the sandbox's private /tmp (and bwrap's throwaway root) take writes.
    for read_only in ("/usr", "/etc", "/root", "/home", "/var"):
        assert f"wrote:{read_only}\n" not in result.stdout, result.stdout
    host_dirs = ("/usr", "/etc", "/root", "/home", "/var", host_tmp_dir, "/", state_dir, os.path.dirname(state_dir))
    for directory in host_dirs:
        assert not os.path.exists(os.path.join(directory, name)), f"the sandbox wrote {name} into host {directory}"


def test_cannot_read_a_host_file_outside_the_binds(tmp_path):
    secret = f"secret-{_nonce()}"
    host_dir = tmp_path / "host-only"
    host_dir.mkdir()
    (host_dir / "secret.txt").write_text(secret)
    var_tmp = tempfile.mkdtemp(prefix="boxwright-secret-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    with open(os.path.join(var_tmp, "secret.txt"), "w") as f:
        f.write(secret)

    async def main():
        handle = await bubblewrap_sandbox(base_dir=tmp_path / "state").create()
        try:
            results = []
            for path in (host_dir / "secret.txt", os.path.join(var_tmp, "secret.txt")):
                results.append(await handle.process.exec(f"cat '{path}'"))
            # Positive control: the same command reads a file the sandbox does see.
            await handle.fs.write("/workspace/visible.txt", secret)
            control = await handle.process.exec("cat /workspace/visible.txt")
            return results, control
        finally:
            await handle.destroy()

    try:
        results, control = asyncio.run(main())
    finally:
        import shutil

        shutil.rmtree(var_tmp, ignore_errors=True)
    assert control.stdout == secret and control.exit_code == 0
    for result in results:
        assert result.exit_code != 0, result
        assert secret not in result.stdout + result.stderr


def test_env_has_no_host_variable(tmp_path, monkeypatch):
    name, value = f"BOXWRIGHT_CANARY_{_nonce().upper()}", f"canary-{_nonce()}"
    monkeypatch.setenv(name, value)

    async def main():
        handle = await bubblewrap_sandbox(base_dir=tmp_path).create(CreateInput(env={"GIVEN": "yes"}))
        try:
            return await handle.process.exec("env")
        finally:
            await handle.destroy()

    result = asyncio.run(main())
    assert result.exit_code == 0
    assert "GIVEN=yes" in result.stdout.splitlines(), "the create env must reach the sandbox"
    assert name not in result.stdout and value not in result.stdout
    host_only = [k for k in ("HOME", "USER", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST") if k in os.environ]
    inside = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    for key in host_only:
        assert inside.get(key) != os.environ[key], f"host {key} leaked into the sandbox"


def test_network_deny(tmp_path):
    found = probe()
    if not found.network_deny:
        skip_unavailable("bubblewrap network deny", "bwrap --unshare-net does not work here")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')"
    connect = f'python3 -c "{code}"'

    async def run(network: str):
        provider = bubblewrap_sandbox(base_dir=tmp_path / network, network=network)
        handle = await provider.create()
        try:
            return (
                provider.capabilities(),
                await handle.process.exec("cat /proc/net/dev"),
                await handle.process.exec(connect),
            )
        finally:
            await handle.destroy()

    try:
        caps, devices, denied = asyncio.run(run("deny"))
        _, _, allowed = asyncio.run(run("allow"))
    finally:
        listener.close()
    assert caps.network_policy is True
    interfaces = [line.split(":")[0].strip() for line in devices.stdout.splitlines()[2:] if ":" in line]
    assert interfaces == ["lo"], devices.stdout
    assert denied.exit_code != 0 and "connected" not in denied.stdout, denied
    # Positive control: the same probe connects when the network is allowed.
    assert allowed.exit_code == 0 and "connected" in allowed.stdout, allowed


def test_network_deny_per_create(tmp_path):
    if not probe().network_deny:
        skip_unavailable("bubblewrap network deny", "bwrap --unshare-net does not work here")

    async def main():
        handle = await bubblewrap_sandbox(base_dir=tmp_path).create(CreateInput(network=NetworkPolicy(mode="deny")))
        try:
            return await handle.process.exec("cat /proc/net/dev")
        finally:
            await handle.destroy()

    devices = asyncio.run(main())
    assert [line.split(":")[0].strip() for line in devices.stdout.splitlines()[2:]] == ["lo"], devices.stdout


def test_kill_ends_the_whole_pid_namespace_including_a_setsid_escapee(tmp_path):
    if not probe().killable:
        skip_unavailable("bubblewrap kill", "a group kill does not empty the bwrap pid namespace here")
    token = f"98764{secrets.randbelow(90000) + 10000}"

    async def main():
        handle = await bubblewrap_sandbox(base_dir=tmp_path).create()
        try:
            process = await handle.process.spawn(f"setsid sleep {token} & sleep {token}1 & echo started; wait")
            await _read_until(process.stdout, "started\n")
            for _ in range(100):
                if host_pids(["sleep", token]) and host_pids(["sleep", f"{token}1"]):
                    break
                await asyncio.sleep(0.05)
            assert host_pids(["sleep", token]), "the setsid escapee never started"
            await process.kill()
            code = await asyncio.wait_for(process.wait(), 15)
            for _ in range(40):
                if not host_pids(["sleep", token]) and not host_pids(["sleep", f"{token}1"]):
                    break
                await asyncio.sleep(0.05)
            return code
        finally:
            await handle.destroy()

    try:
        code = asyncio.run(main())
        assert code > 128
        assert not host_pids(["sleep", token]), "the setsid escapee survived kill()"
        assert not host_pids(["sleep", f"{token}1"]), "the backgrounded child survived kill()"
    finally:
        for argv in (["sleep", token], ["sleep", f"{token}1"]):
            for pid in host_pids(argv):
                os.kill(pid, 9)


def test_destroy_by_id_from_a_fresh_provider(tmp_path):
    token = f"98763{secrets.randbelow(90000) + 10000}"

    async def main():
        handle = await bubblewrap_sandbox(base_dir=tmp_path).create()
        process = await handle.process.spawn(f"setsid sleep {token}1 & echo started; sleep {token}")
        await _read_until(process.stdout, "started\n")
        for _ in range(100):
            if host_pids(["sleep", token]) and host_pids(["sleep", f"{token}1"]):
                break
            await asyncio.sleep(0.05)
        assert host_pids(["sleep", token]) and host_pids(["sleep", f"{token}1"])
        fresh = bubblewrap_sandbox(base_dir=tmp_path)
        await fresh.destroy(DestroyInput(id=handle.id))
        code = await asyncio.wait_for(process.wait(), 15)
        gone = await fresh.resume(ResumeInput(id=handle.id))
        await fresh.destroy(DestroyInput(id=handle.id))  # already gone is success
        return handle.id, code, gone

    try:
        state, code, resumed = asyncio.run(main())
        assert code != 0
        assert not host_pids(["sleep", token]), "destroy by id left the sandbox's command running"
        assert not host_pids(["sleep", f"{token}1"]), "destroy by id left a setsid escapee running"
        assert not os.path.exists(state), "destroy by id left the state directory"
        assert resumed is None
    finally:
        for argv in (["sleep", token], ["sleep", f"{token}1"]):
            for pid in host_pids(argv):
                os.kill(pid, 9)


def test_fixed_dir_survives_destroy(tmp_path):
    workspace = tmp_path / "mine"
    workspace.mkdir()
    (workspace / "keep.txt").write_text("keep")

    async def main():
        handle = await bubblewrap_sandbox(workspace, base_dir=tmp_path / "state").create()
        await handle.process.exec("echo more > more.txt")
        await handle.destroy()
        return handle.id

    state = asyncio.run(main())
    assert (workspace / "keep.txt").read_text() == "keep" and (workspace / "more.txt").exists()
    assert not os.path.exists(state)
