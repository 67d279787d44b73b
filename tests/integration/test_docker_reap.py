"""Leaks and bad input on Docker: `boxwright reap` finds the orphan of a SIGKILLed host process, a terminal
run's container goes, a live one stays; a missing image, a container removed from outside and a daemon that
stops answering are each a clear error, and nothing hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from boxwright.errors import ProviderUnavailableError, SandboxNotFoundError
from tests.support.docker import BASE_IMAGE, TEST_LABEL, image_problem, labelled_containers, no_leaked_containers
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _image() -> None:
    problem = image_problem(BASE_IMAGE)
    if problem is not None:
        missing(problem)


def _boxwright(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boxwright", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_reap_removes_the_orphan_of_a_sigkilled_host_process() -> None:
    tag = f"{TEST_LABEL}.orphan=sigkill-{os.getpid()}"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from boxwright.providers.docker import docker_sandbox
        async def main():
            provider = docker_sandbox({BASE_IMAGE!r}, labels={{{TEST_LABEL!r}: "1", {tag.split("=")[0]!r}: \
{tag.split("=")[1]!r}}}, run_id="r-orphan", lease_seconds=2)
            handle = await provider.create()
            await handle.process.spawn("echo up; sleep 1000")
            print(handle.id, flush=True)
            await asyncio.sleep(3600)
        asyncio.run(main())
        """
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert host.stdout is not None
        cid = host.stdout.readline().strip()
        assert cid, "the host process printed no container id"
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=10)
    finally:
        if host.poll() is None:
            host.kill()
    assert labelled_containers(tag) == [cid], "the SIGKILLed host's container should still be there"
    time.sleep(2.5)  # its 2 s lease runs out
    dry = _boxwright("reap", "--json")
    assert dry.returncode == 0, dry.stderr
    assert cid in dry.stdout and "lease-expired" in dry.stdout
    assert labelled_containers(tag) == [cid], "a dry run removed the container"
    done = _boxwright("reap", "--yes")
    assert done.returncode == 0, done.stderr
    assert cid[:12] in done.stdout and "removed" in done.stdout
    assert labelled_containers(tag) == []


def test_reap_removes_a_terminal_runs_container_and_keeps_a_live_one() -> None:
    from boxwright.docker_reap import reap_docker
    from boxwright.providers.docker import docker_sandbox

    async def main() -> None:
        ended = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, run_id="r-ended").create()
        live = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, run_id="r-live").create()
        try:

            async def terminal(run: str) -> bool:
                return run == "r-ended"

            reaped = await reap_docker(run_is_terminal=terminal, label=TEST_LABEL)
            assert [(r.id, r.reason, r.removed) for r in reaped] == [(ended.id, "run-terminal", True)]
            assert await live.fs.exists("/workspace"), "the live run's container was touched"
            assert await ended._provider.resume(__import__("boxwright").sandbox.ResumeInput(id=ended.id)) is None
        finally:
            await live.destroy()
            await ended.destroy()

    asyncio.run(main())


def test_a_missing_image_is_a_clear_error_and_never_pulled() -> None:
    from boxwright.providers.docker import docker_sandbox

    image = "boxwright-no-such-image:nope"
    with pytest.raises(ProviderUnavailableError) as info:
        asyncio.run(docker_sandbox(image, labels={TEST_LABEL: "1"}).create())
    assert image in str(info.value) and "never pulls" in str(info.value)
    assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0


def test_a_container_removed_from_outside_is_a_clear_error() -> None:
    from boxwright.providers.docker import docker_sandbox

    async def main() -> None:
        handle = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}).create()
        process = await handle.process.spawn("echo up; sleep 1000")
        await asyncio.to_thread(
            subprocess.run, ["docker", "rm", "-f", handle.id], check=True, capture_output=True, timeout=60
        )
        # The stream ends and wait() says the sandbox is gone, within a bound: nothing hangs.
        with pytest.raises(SandboxNotFoundError) as gone:
            await asyncio.wait_for(process.wait(), 30)
        assert handle.id in str(gone.value) and ("removed" in str(gone.value) or "gone" in str(gone.value))
        with pytest.raises(SandboxNotFoundError) as info:
            await asyncio.wait_for(handle.process.exec("true"), 30)
        assert handle.id in str(info.value)
        await asyncio.wait_for(handle.destroy(), 30)  # already gone is success

    asyncio.run(main())


def test_no_engine_is_a_clear_error() -> None:
    from boxwright.providers.docker import docker_sandbox

    provider = docker_sandbox(BASE_IMAGE, base_url="unix:///nonexistent/docker.sock", labels={TEST_LABEL: "1"})
    with pytest.raises(ProviderUnavailableError) as info:
        asyncio.run(asyncio.wait_for(provider.create(), 30))
    text = str(info.value)
    assert ("no Docker engine" in text or "does not answer" in text) and "dockerd" in text and "nonexistent" in text


def test_the_daemon_stopping_mid_run_is_a_clear_error(tmp_path: object) -> None:
    from boxwright.providers.docker import docker_sandbox
    from tests.support.docker import EngineProxy

    proxy = EngineProxy(str(tmp_path))
    provider = docker_sandbox(BASE_IMAGE, base_url=proxy.url, labels={TEST_LABEL: "1"})
    created: list[str] = []

    async def main() -> None:
        handle = await provider.create()
        created.append(handle.id)
        process = await handle.process.spawn("echo up; sleep 1000")
        assert "up" in await asyncio.wait_for(process.stdout.__anext__(), 30)
        proxy.cut()
        # The stream ends, and the exit code cannot be learnt: a clear error within a bound.
        with pytest.raises(ProviderUnavailableError) as info:
            await asyncio.wait_for(process.wait(), 30)
        assert "does not answer" in str(info.value)
        with pytest.raises(ProviderUnavailableError):
            await asyncio.wait_for(handle.process.exec("true"), 30)
        await asyncio.wait_for(process.kill(), 30)  # never raises, never hangs

    try:
        asyncio.run(main())
    finally:
        for cid in created:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)
