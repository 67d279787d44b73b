"""Docker hardening, checked from inside real containers: what an agent gone wrong would try fails.

Non-root, no capabilities (mount, mknod, chown, raw sockets refused), no new privileges, no Docker socket,
pids/memory/cpu limits set, no network at all when the policy denies it, host.docker.internal when it allows it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from boxwright.sandbox import CreateInput, NetworkPolicy
from tests.support.docker import BASE_IMAGE, TEST_LABEL, image_problem, no_leaked_containers
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]


@pytest.fixture(autouse=True)
def _image() -> None:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)


def _inspect(cid: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", cid], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


def test_escape_attempts_fail_inside_the_container() -> None:
    from boxwright.providers.docker import docker_sandbox

    async def main() -> dict[str, Any]:
        handle = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}).create()
        try:
            run = handle.process.exec
            seen: dict[str, Any] = {"id": handle.id}
            seen["uid"] = (await run("id -u")).stdout.strip()
            status = (await run("cat /proc/self/status")).stdout
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            seen["cap_eff"] = fields["CapEff"].strip()
            seen["no_new_privs"] = fields["NoNewPrivs"].strip()
            seen["mount"] = (await run("mkdir -p m && mount -t tmpfs none m")).exit_code
            seen["mknod"] = (await run("mknod dev-null c 1 3")).exit_code
            seen["chown"] = (await run("touch f && chown 0:0 f")).exit_code
            seen["etc"] = (await run("echo x >> /etc/passwd")).exit_code
            seen["socket"] = (await run("test -e /var/run/docker.sock || test -e /run/docker.sock")).exit_code
            seen["gateway"] = (await run("getent hosts host.docker.internal")).exit_code
            seen["fork_bomb_limit"] = (await run("cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max")).stdout
            return seen
        finally:
            await handle.destroy()

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen["uid"] == "1000", seen
    assert int(seen["cap_eff"], 16) == 0, seen
    assert seen["no_new_privs"] == "1", seen
    for attempt in ("mount", "mknod", "chown", "etc"):
        assert seen[attempt] != 0, f"{attempt} succeeded inside the container: {seen}"
    assert seen["socket"] != 0, "the Docker socket is visible inside"
    assert seen["gateway"] == 0, "host.docker.internal does not resolve (the tool bridge is unreachable)"
    assert "max" not in seen["fork_bomb_limit"].split(), seen["fork_bomb_limit"]


def test_limits_are_set_and_network_deny_is_no_network() -> None:
    from boxwright.providers.docker import DockerLimits, docker_sandbox

    async def main() -> tuple[str, str, str]:
        provider = docker_sandbox(
            BASE_IMAGE, labels={TEST_LABEL: "1"}, limits=DockerLimits(pids=256, memory="512m", cpus=1.0)
        )
        handle = await provider.create(CreateInput(network=NetworkPolicy(mode="deny")))
        try:
            interfaces = (await handle.process.exec("ls /sys/class/net")).stdout
            egress = (await handle.process.exec("getent hosts host.docker.internal")).exit_code
            return handle.id, interfaces, str(egress)
        finally:
            inspected = _inspect(handle.id)
            await handle.destroy()
            config = inspected["HostConfig"]
            assert config["PidsLimit"] == 256 and config["Memory"] == 512 * 1024 * 1024, config
            assert config["NanoCpus"] == 1_000_000_000 and config["CapDrop"] == ["ALL"], config
            assert "no-new-privileges" in config["SecurityOpt"] and config["NetworkMode"] == "none", config
            assert inspected["Config"]["Labels"]["boxwright.managed"] == "1"

    _, interfaces, egress = asyncio.run(asyncio.wait_for(main(), 120))
    assert interfaces.split() == ["lo"], f"a denied network still has interfaces: {interfaces!r}"
    assert egress != "0"


def test_the_workspace_is_the_users_and_root_sticky_whoever_sets_it_up() -> None:
    from boxwright.providers.docker import docker_sandbox

    probe = "stat -c '%u %a' /workspace /; pwd; id -u; mkdir -p sub && rm -rf /workspace && ! test -e /workspace"

    async def main() -> list[str]:
        seen = []
        # The default keep-alive makes the workspace itself; any other one leaves the setup to the host.
        for keep_alive in (None, ("sh", "-c", "exec sleep infinity")):
            provider = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"})
            if keep_alive is not None:
                provider.keep_alive = list(keep_alive)
            handle = await provider.create()
            try:
                result = await handle.process.exec(probe)
                seen.append(f"{result.exit_code} {result.stdout.split()}")
            finally:
                await handle.destroy()
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen == ["0 ['1000', '755', '0', '1777', '/workspace', '1000']"] * 2, seen
