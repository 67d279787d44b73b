"""Leaks and bad input on Docker: `boxwright reap` finds the orphan of a SIGKILLed host process, a terminal
run's container goes, a live one stays; a missing image, a container removed from outside and a daemon that
stops answering are each a clear error, and nothing hangs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from boxwright.errors import ProviderUnavailableError, SandboxNotFoundError
from tests.support.docker import (
    BASE_IMAGE,
    TEST_LABEL,
    image_problem,
    labelled_containers,
    no_leaked_containers,
    remove_images,
    session_label,
)
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
    # Narrowed to this session: on a shared engine, the other sessions' leftovers are not this test's.
    dry = _boxwright("reap", "--json", "--label", session_label())
    assert dry.returncode == 0, dry.stderr
    assert cid in dry.stdout and "lease-expired" in dry.stdout
    assert labelled_containers(tag) == [cid], "a dry run removed the container"
    done = _boxwright("reap", "--yes", "--label", session_label())
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


def _image_of(cid: str) -> str:
    inspected = subprocess.run(["docker", "inspect", "--format", "{{.Config.Image}}", cid], capture_output=True)
    return inspected.stdout.decode().strip()


def _image_labels(ref: str) -> dict[str, str]:
    inspected = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=True, timeout=30)
    return json.loads(inspected.stdout)[0]["Config"]["Labels"] or {}  # type: ignore[no-any-return]


def _image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=30).returncode == 0


def test_a_forks_image_goes_with_the_fork() -> None:
    from boxwright.providers.docker import docker_sandbox

    async def main() -> str:
        handle = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}).create()
        try:
            child = await handle.fork()
            image = await asyncio.to_thread(_image_of, child.id)
            assert image.startswith("boxwright-fork:") and await asyncio.to_thread(_image_exists, image), image
            labels = await asyncio.to_thread(_image_labels, image)
            assert labels["boxwright.kind"] == "fork" and float(labels["boxwright.lease-expires"]) > time.time()
            await child.destroy()
            return image
        finally:
            await handle.destroy()

    image = asyncio.run(asyncio.wait_for(main(), 120))
    assert not _image_exists(image), "the fork's image outlived the fork"


def test_reap_images_by_lease_by_use_and_by_their_sandbox() -> None:
    from boxwright.docker_reap import DEFAULT_IMAGE_GRACE, instance_snapshot_is_current, reap_docker_images
    from boxwright.providers.docker import docker_sandbox
    from boxwright.sandbox import CreateInput, RestoreInput
    from boxwright.stores.base import InstanceRecord
    from boxwright.stores.memory import MemoryInstanceStore

    kept_key, gone_key = os.urandom(8).hex(), os.urandom(8).hex()
    lasting = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"})
    expiring = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, snapshot_lease_seconds=0)
    refs: dict[str, str] = {}

    async def main() -> None:
        handles = [
            await lasting.create(CreateInput(id=kept_key)),
            await lasting.create(CreateInput(id=gone_key)),
            await expiring.create(),
        ]
        try:
            kept, gone, short = handles
            refs["kept"] = (await kept.snapshot("kept")).id
            refs["gone"] = (await gone.snapshot("gone")).id
            refs["expired"] = (await short.snapshot("expired")).id
            refs["used"] = (await short.snapshot("used")).id
            handles.append(await expiring._restore(RestoreInput(snapshot_id=refs["used"])))
            fork = await kept.fork()
            refs["fork"] = await asyncio.to_thread(_image_of, fork.id)
            # The fork's container removed from outside (as a SIGKILLed host leaves it): its image stays behind.
            await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", fork.id], capture_output=True, timeout=60)
            await gone.destroy()  # its sandbox is gone: no instance record names its snapshot
            instances = MemoryInstanceStore()
            await instances.upsert(
                InstanceRecord(
                    key=kept_key,
                    provider="docker",
                    provider_sandbox_id=kept.id,
                    thread_id="t",
                    updated_at=0,
                    latest_snapshot_id=refs["kept"],
                )
            )
            current = instance_snapshot_is_current(instances)

            def reasons(found: list[Any]) -> dict[str, str]:
                names = {ref: name for name, ref in refs.items()}
                return {names[tag]: r.reason for r in found for tag in r.tags if tag in names}

            # Within the grace: only the lease rule; a fork or a snapshot being recorded is left alone.
            now = await reap_docker_images(dry_run=True, snapshot_is_current=current, label=session_label())
            assert reasons(now) == {"expired": "lease-expired"}, now
            later = time.time() + DEFAULT_IMAGE_GRACE + 5
            dry = await reap_docker_images(dry_run=True, snapshot_is_current=current, now=later, label=session_label())
            expected = {"expired": "lease-expired", "gone": "sandbox-gone", "fork": "fork-unused"}
            assert reasons(dry) == expected, dry
            assert all(_image_exists(refs[name]) for name in expected), "a dry run removed an image"
            done = await reap_docker_images(snapshot_is_current=current, now=later, label=session_label())
            assert reasons(done) == expected and all(r.removed and r.error is None for r in done), done
            # What a sandbox still restores from, and what a container uses, stays.
            assert [name for name in refs if _image_exists(refs[name])] == ["kept", "used"]
        finally:
            for handle in handles:
                await handle.destroy()

    try:
        asyncio.run(asyncio.wait_for(main(), 240))
    finally:
        remove_images([ref for ref in refs.values() if _image_exists(ref)])


def test_the_reaper_loop_sweeps_docker_leaks() -> None:
    from boxwright.docker_reap import docker_leak_sweeper
    from boxwright.providers.docker import docker_sandbox
    from boxwright.reaper import reap_detached_runs
    from boxwright.runs import RunPatch
    from boxwright.sandbox import CreateInput
    from boxwright.stores.memory import MemoryInstanceStore, MemoryLockStore, memory_run_backend

    async def unused(*_args: Any) -> Any:
        raise AssertionError("no run is detached: the sweep must not probe or drive one")

    async def main() -> None:
        runs, log = memory_run_backend()
        await runs.create("r-done", "t")
        await runs.update("r-done", RunPatch(status="completed"))
        await runs.create("r-live", "t2")
        ended = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, run_id="r-done").create()
        expired = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, lease_seconds=0).create()
        live = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, run_id="r-live").create()
        gone = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}).create(CreateInput(id=os.urandom(8).hex()))
        snapshot = (await gone.snapshot("after-setup")).id
        await gone.destroy()
        try:
            result = await reap_detached_runs(
                runs,
                MemoryLockStore(),
                log,
                has_finished=unused,
                drive=unused,
                now_ms=int(time.time() * 1000),
                detached_run_ttl_ms=60_000,
                sweep_leaks=docker_leak_sweeper(runs, MemoryInstanceStore(), grace=0, label=session_label()),
            )
            found = {(leak.kind, leak.id): (leak.reason, leak.removed, leak.error) for leak in result.leaks}
            assert not await asyncio.to_thread(_image_exists, snapshot), "the gone sandbox's snapshot is still there"
            assert found.pop(("container", ended.id)) == ("run-terminal", True, None), result.leaks
            assert found.pop(("container", expired.id)) == ("lease-expired", True, None), result.leaks
            assert [(kind, reason) for (kind, _), (reason, *_) in found.items()] == [("image", "sandbox-gone")]
            assert result.leak_error is None and result.considered == 0
            assert await live.fs.exists("/workspace"), "the live run's container was touched"
            down = await reap_detached_runs(
                runs,
                MemoryLockStore(),
                log,
                has_finished=unused,
                drive=unused,
                now_ms=int(time.time() * 1000),
                detached_run_ttl_ms=60_000,
                sweep_leaks=docker_leak_sweeper(base_url="unix:///nonexistent/docker.sock"),
            )
            assert down.leaks == [] and down.leak_error is not None and "nonexistent" in down.leak_error, down
        finally:
            for handle in (ended, expired, live):
                await handle.destroy()
            remove_images([snapshot] if _image_exists(snapshot) else [])

    asyncio.run(asyncio.wait_for(main(), 240))


def test_a_container_killed_from_outside_mid_run_ends_the_run_with_a_clear_error() -> None:
    from contextlib import aclosing

    from boxwright import Lifecycle, define_sandbox, run_agent
    from boxwright.events import RunErrorEvent, TextMessageContentEvent
    from boxwright.harnesses.command import command_harness
    from boxwright.providers.docker import docker_sandbox
    from boxwright.stores.memory import MemoryInstanceStore

    case = f"{TEST_LABEL}.case=killed-{os.getpid()}-{os.urandom(3).hex()}"
    key, value = case.split("=")
    sandbox = define_sandbox(
        "killed",
        docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1", key: value}),
        lifecycle=Lifecycle(snapshot="none", destroy_on_complete=True),
    )
    killed: list[str] = []

    async def main() -> list[Any]:
        events: list[Any] = []
        stream = run_agent(
            sandbox, command_harness("echo up; sleep 1000"), "go", thread_id="t-killed", store=MemoryInstanceStore()
        )
        async with aclosing(stream):
            async for event in stream:
                events.append(event)
                if isinstance(event, TextMessageContentEvent) and "up" in event.delta and not killed:
                    killed.extend(await asyncio.to_thread(labelled_containers, case))
                    await asyncio.to_thread(
                        subprocess.run, ["docker", "kill", *killed], check=True, capture_output=True, timeout=60
                    )
        return events

    events = asyncio.run(asyncio.wait_for(main(), 120))  # nothing hangs: the run ends by itself (3.4 s here)
    assert len(killed) == 1, killed
    assert isinstance(events[-1], RunErrorEvent), [e.type for e in events]
    message = events[-1].message
    assert killed[0][:12] in message and "stopped or removed" in message, message
    assert labelled_containers(case) == [], "destroy_on_complete left the killed container"


def test_the_daemon_stopping_mid_run_ends_the_run_with_a_clear_error(tmp_path: Any) -> None:
    from contextlib import aclosing

    from boxwright import Lifecycle, define_sandbox, run_agent
    from boxwright.events import RunErrorEvent, TextMessageContentEvent
    from boxwright.harnesses.command import command_harness
    from boxwright.providers.docker import docker_sandbox
    from boxwright.stores.memory import MemoryInstanceStore
    from tests.support.docker import EngineProxy

    case = f"{TEST_LABEL}.case=daemon-{os.getpid()}-{os.urandom(3).hex()}"
    key, value = case.split("=")
    proxy = EngineProxy(str(tmp_path))
    sandbox = define_sandbox(
        "daemon-gone",
        docker_sandbox(BASE_IMAGE, base_url=proxy.url, labels={TEST_LABEL: "1", key: value}),
        lifecycle=Lifecycle(snapshot="none", destroy_on_complete=True),
    )

    async def main() -> list[Any]:
        events: list[Any] = []
        stream = run_agent(
            sandbox, command_harness("echo up; sleep 1000"), "go", thread_id="t-daemon", store=MemoryInstanceStore()
        )
        async with aclosing(stream):
            async for event in stream:
                events.append(event)
                if isinstance(event, TextMessageContentEvent) and "up" in event.delta:
                    proxy.cut()
        return events

    try:
        events = asyncio.run(asyncio.wait_for(main(), 120))  # the run ends by itself, bounded
    finally:
        # The engine is fine, only this client lost it: the container is removed through the real socket.
        left = labelled_containers(case)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)
    assert len(left) == 1, "the run's container should outlive a client that lost its engine"
    assert isinstance(events[-1], RunErrorEvent), [e.type for e in events]
    message = events[-1].message
    assert "does not answer" in message and proxy.path in message, message
