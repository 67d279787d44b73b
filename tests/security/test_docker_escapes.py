"""From inside a real Docker container, what an agent gone wrong would try (issue 12): each attempt fails.

The same attempts as the bubblewrap suite (tests/support/escapes.py holds them), run as the provider's
non-root user with no capabilities and no new privileges, then a check on the host: its mount table,
its files, its processes, the other sandbox, the engine's own view of the container (``docker diff``,
the container's cgroup counters read from the host's /sys/fs/cgroup).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support import escapes
from tests.support.docker import BASE_IMAGE, TEST_LABEL, image_problem, no_leaked_containers, remove_images
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]

T = TypeVar("T")
ESRCH = 3
EAGAIN = 11
UID = "1000"


@pytest.fixture(autouse=True)
def _image() -> None:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)


class Shared:
    """One container for the attempts that need no limits of their own: a container costs seconds here."""

    def __init__(self) -> None:
        from boxwright.providers.docker import docker_sandbox

        self.loop = asyncio.new_event_loop()
        self.handle = self.loop.run_until_complete(
            asyncio.wait_for(docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}).create(), 180)
        )

    def run(self, body: Callable[[Any], Awaitable[T]]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(body(self.handle), 180))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(asyncio.wait_for(self.handle.destroy(), 120))
        finally:
            self.loop.close()


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Shared]:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)
    shared = Shared()
    try:
        yield shared
    finally:
        shared.close()


def _run(body: Callable[[Any], Awaitable[T]], **options: Any) -> T:
    """``body`` in a container of its own (limits of its own, or one it must leave changed)."""
    from boxwright.providers.docker import docker_sandbox

    async def main() -> T:
        handle = await docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"}, **options).create()
        try:
            return await body(handle)
        finally:
            await handle.destroy()

    return asyncio.run(asyncio.wait_for(main(), 180))


async def _diff(cid: str) -> list[str]:
    """What the container changed in its own layer, as the engine sees it (``A /path``, ``C /path``)."""
    run = await asyncio.to_thread(
        subprocess.run, ["docker", "diff", cid], capture_output=True, text=True, check=True, timeout=60
    )
    return run.stdout.splitlines()


def _cgroup(cid: str, controller: str, names: tuple[str, ...]) -> str:
    """A file of the container's cgroup, read on the host (cgroup v1 with cgroupfs or systemd, or v2)."""
    roots = [
        f"/sys/fs/cgroup/{controller}/docker/{cid}",
        f"/sys/fs/cgroup/{controller}/system.slice/docker-{cid}.scope",
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope",
        f"/sys/fs/cgroup/docker/{cid}",
    ]
    for root in roots:
        for name in names:
            if os.path.exists(f"{root}/{name}"):
                return Path(f"{root}/{name}").read_text()
    raise AssertionError(f"no {names} of container {cid[:12]} under {roots}: where does this engine put cgroups?")


def _counter(text: str, key: str) -> int:
    return int(next(line.split()[1] for line in text.splitlines() if line.split()[0] == key))


def test_the_posture_inside_is_non_root_with_nothing_to_escalate_with(sandbox: Shared) -> None:
    async def inside(handle: Any) -> Any:
        return await handle.process.exec(
            "id -u; grep -E '^(CapEff|CapBnd|CapPrm|Seccomp|NoNewPrivs):' /proc/self/status"
        )

    result = sandbox.run(inside)
    lines = result.stdout.split()
    assert result.exit_code == 0 and lines[0] == UID, result
    status = dict(zip(lines[1::2], lines[2::2], strict=True))
    zero = "0" * 16
    # Seccomp 2: the engine's default filter is on (the syscall tests below rely on it as well as on the caps).
    assert status == {"CapPrm:": zero, "CapEff:": zero, "CapBnd:": zero, "Seccomp:": "2", "NoNewPrivs:": "1"}, status


def test_remount_and_the_mount_syscall_fail_and_usr_is_untouched(sandbox: Shared) -> None:
    name = f"boxwright-escape-{secrets.token_hex(4)}"
    before = escapes.host_mounts()

    async def inside(handle: Any) -> tuple[list[Any], list[str]]:
        results = [
            await handle.process.exec(f"mount -o remount,rw /usr && touch /usr/{name} && echo WROTE"),
            await handle.process.exec(f"mount -o remount,rw / && touch /usr/bin/{name} && echo WROTE"),
            await handle.process.exec(escapes.python(escapes.MOUNT_SYSCALL)),
            await handle.process.exec("chmod 777 /usr/bin/env || touch /usr/bin/env || echo > /usr/bin/env"),
        ]
        return results, await _diff(handle.id)

    (remount, remount_root, syscall, chmod), diff = sandbox.run(inside)
    for result in (remount, remount_root):
        assert result.exit_code != 0 and "WROTE" not in result.stdout, result
    assert syscall.stdout.split() == ["mount", "-1", str(escapes.EPERM)], syscall
    assert chmod.exit_code != 0, chmod
    # The engine's own change: the init it bind-mounts (HostConfig.Init) shows up under /usr/sbin.
    engine = {"C /usr", "C /usr/sbin", "A /usr/sbin/docker-init"}
    assert not [line for line in diff if " /usr" in line and line not in engine], f"the container changed /usr: {diff}"
    assert not os.path.exists(f"/usr/{name}") and not os.path.exists(f"/usr/bin/{name}")
    assert escapes.host_mounts() == before, "a mount inside the container changed the host's mount table"


def test_mknod_fails(sandbox: Shared) -> None:
    async def inside(handle: Any) -> tuple[list[Any], list[str]]:
        results = [
            await handle.process.exec(f"mknod {where}/mem c 1 1 && echo MADE")
            for where in ("/workspace", "/tmp", "/dev/shm")
        ]
        results.append(await handle.process.exec("mknod /workspace/disk b 8 0 && echo MADE"))
        results.append(
            await handle.process.exec(
                escapes.python("import os; os.mknod('/workspace/null2', 0o20666, os.makedev(1, 3))")
            )
        )
        return results, await _diff(handle.id)

    results, diff = sandbox.run(inside)
    for result in results:
        assert result.exit_code != 0 and "MADE" not in result.stdout, result
        assert "Operation not permitted" in result.stderr, result
    made = [line for line in diff if line.rsplit("/", 1)[-1] in ("mem", "disk", "null2")]
    assert made == [], f"a device node was made: {made}"


def test_the_hosts_shadow_and_secrets_are_not_visible(sandbox: Shared) -> None:
    with open("/etc/shadow") as f:
        shadow = f.read()
    hashes = [line.split(":")[1] for line in shadow.splitlines() if len(line.split(":")) > 1]
    hashes = [h for h in hashes if len(h) > 3]  # locked accounts ("*", "!") are no secret

    async def inside(handle: Any) -> tuple[list[Any], Any]:
        attempts = [await handle.process.exec(f"cat {path} || ls -la {path}") for path in escapes.HIDDEN_ETC]
        hunt = await handle.process.exec(
            "cat /proc/1/root/etc/shadow /proc/self/root/etc/shadow 2>&1;"
            " find / -xdev -name 'shadow*' -exec cat {} + 2>/dev/null; cat /etc/ssh/ssh_host_*_key 2>&1"
        )
        control = await handle.process.exec("cat /etc/hosts >/dev/null && cat /etc/passwd >/dev/null && echo fine")
        return [*attempts, hunt], control

    results, control = sandbox.run(inside)
    shadow_read = results[0]
    # The container's own shadow is there and not readable; the rest of the host's secrets are not there.
    assert shadow_read.exit_code == 0 and "Permission denied" in shadow_read.stderr, shadow_read
    assert "root" not in shadow_read.stdout.split(":")[0:1], shadow_read
    for path, result in zip(escapes.HIDDEN_ETC[1:], results[1:], strict=False):
        assert "Permission denied" in result.stderr or "No such file" in result.stderr, (path, result)
    for result in results:
        seen = result.stdout + result.stderr
        assert shadow not in seen and not any(h in seen for h in hashes), "a host password hash was read"
    assert control.stdout == "fine\n", control  # positive control: what a userland needs is there


def test_writes_outside_the_workspace_fail_and_reach_no_host_path(sandbox: Shared, tmp_path: Path) -> None:
    name = f"boxwright-escape-{secrets.token_hex(4)}"
    # The container's `/` is its own writable layer, world-writable by design (providers/docker.py: the
    # user may remove its own workspace): a write there is tried, and checked to stay in that layer.
    own_root = ("/", "/workspace/..")
    must_fail = [t for t in escapes.OUTSIDE_TARGETS if t not in own_root]
    host_paths = [str(tmp_path), os.getcwd(), "/var/lib/docker", "/run"]

    async def inside(handle: Any) -> tuple[Any, Any, Any, list[str]]:
        script = escapes.write_outside(name, [*must_fail, *host_paths])
        result = await handle.process.exec(script + "; echo inside > /workspace/ok.txt")
        rooted = await handle.process.exec(escapes.write_outside(name, list(own_root)))
        sysctl = await handle.process.exec(escapes.SYSCTL_WRITE)
        return result, rooted, sysctl, await _diff(handle.id)

    result, rooted, sysctl, diff = sandbox.run(inside)
    assert result.exit_code == 0, result
    assert "wrote:" not in result.stdout, result.stdout
    assert sysctl.exit_code != 0 and "SYSCTL" not in sysctl.stdout, sysctl
    assert "wrote:/" in rooted.stdout, rooted  # the container's own layer (positive control of the diff below)
    written = sorted(line.split(" ", 1)[1] for line in diff if name in line)
    assert written == [f"/{name}"], f"the container's writes went beyond its own root: {written}"
    assert "A /workspace/ok.txt" in diff, diff
    for directory in [*(t for t in must_fail if not t.startswith("/proc")), "/", str(tmp_path), os.getcwd(), "/run"]:
        assert not os.path.exists(os.path.join(directory, name)), f"the container wrote {name} into host {directory}"


def test_host_processes_cannot_be_traced_signalled_or_seen(sandbox: Shared) -> None:
    host = subprocess.Popen(["sleep", f"3{secrets.randbelow(10**6)}"])
    try:

        async def inside(handle: Any) -> tuple[Any, Any]:
            probe = await handle.process.exec(escapes.python(escapes.host_process_probe(host.pid)))
            listing = await handle.process.exec("ps -eo comm= | sort -u")
            return probe, listing

        result, listing = sandbox.run(inside)
        with open(f"/proc/{host.pid}/status") as f:
            tracer = next(line.split()[1] for line in f if line.startswith("TracerPid:"))
        alive = host.poll() is None
    finally:
        host.kill()
        host.wait()
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.exit_code == 0, result
    # The host's pids do not exist in the container's pid namespace: nothing to attach to or signal.
    assert lines["ptrace"] == f"-1 {ESRCH}" and lines["seize"] == f"-1 {ESRCH}", result.stdout
    assert lines["kill"] == str(ESRCH) and lines["proc"] == "False", result.stdout
    assert alive and tracer == "0", "the host process was killed or traced from inside the container"
    seen = set(listing.stdout.split())
    assert not seen & {"dockerd", "containerd", "pytest", "python"}, f"host processes are visible inside: {seen}"


def test_another_sandbox_is_out_of_reach() -> None:
    from boxwright.providers.docker import docker_sandbox

    secret = f"sandbox-a-secret-{secrets.token_hex(6)}"
    provider = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"})

    async def main() -> tuple[list[Any], str, bool]:
        a, b = await provider.create(), await provider.create()
        try:
            await a.fs.write("/workspace/secret.txt", secret)
            await b.process.exec("true")
            for _ in range(200):  # a's exec server, the one network door into a (started in the background)
                if a._fast is not None:
                    break
                await asyncio.sleep(0.05)
            assert a._fast is not None, "container a's exec server never answered"
            # b knows a's address and port (both guessable on the bridge), not a's token.
            knock = escapes.python(
                "import json, socket, sys\n"
                f"for token in ('', 'guess', None):\n"
                f"    s = socket.create_connection(({a._fast.host!r}, {a._fast.port}), timeout=10)\n"
                "    req = {'argv': ['sh', '-c', 'cat /workspace/secret.txt; touch /workspace/planted']}\n"
                "    if token is not None: req['token'] = token\n"
                "    s.sendall(json.dumps(req).encode() + b'\\n')\n"
                "    print('answer', repr(s.recv(65536)))\n"
            )
            attempts = [
                await b.process.exec(knock),
                await b.process.exec(
                    "mknod /tmp/disk b 8 0; mkdir -p /tmp/mnt; mount -o ro /tmp/disk /tmp/mnt; ls /tmp/mnt"
                ),
                await b.process.exec(
                    "for p in /proc/[0-9]*; do cat $p/root/workspace/secret.txt $p/cwd/secret.txt; done 2>/dev/null"
                ),
                await b.process.exec("grep -rs sandbox-a-secret / --exclude-dir=proc --exclude-dir=sys 2>/dev/null"),
                await b.process.exec("ls -A /workspace"),
            ]
            return attempts, await a.fs.read("/workspace/secret.txt"), await a.fs.exists("/workspace/planted")
        finally:
            await a.destroy()
            await b.destroy()

    attempts, after, planted = asyncio.run(asyncio.wait_for(main(), 180))
    for result in attempts:
        assert secret not in result.stdout + result.stderr, result
    knock = attempts[0]
    assert knock.stdout.splitlines() == ["answer b''"] * 3, knock  # each connection closed, nothing run
    assert attempts[-1].stdout == "", attempts[-1]  # b's own workspace: empty, nothing of a's
    assert after == secret and not planted


def test_unshare_mount_and_kernel_surfaces_are_refused_inside(sandbox: Shared) -> None:
    numbers = escapes.syscall_numbers(*escapes.KERNEL_SYSCALLS)
    assert "unshare" in numbers and "mount" in numbers, numbers
    before = escapes.host_mounts()

    async def inside(handle: Any) -> list[Any]:
        return [
            await handle.process.exec(escapes.python(escapes.kernel_syscall_probe(numbers))),
            *[await handle.process.exec(command) for command in escapes.SHELL_UNSHARE_AND_MOUNT],
            await handle.process.exec(escapes.python(escapes.SPAWN_CONTROL)),
        ]

    calls, *shell, control = sandbox.run(inside)
    got = escapes.parse_calls(calls.stdout)
    assert calls.exit_code == 0, calls
    for name in numbers:
        # The engine's seccomp profile answers clone3 ENOSYS (glibc falls back to clone), the rest EPERM.
        expected = ["-1", str(escapes.ENOSYS)] if name == "clone3" else ["-1", str(escapes.EPERM)]
        assert got[name] == expected, (name, calls.stdout)
    for result in shell:
        assert result.exit_code != 0 and not any(m in result.stdout for m in escapes.MARKERS), result
    assert control.stdout == "0\n", control
    assert escapes.host_mounts() == before, "a mount inside the container changed the host's mount table"


def test_the_docker_socket_and_engine_are_out_of_reach(sandbox: Shared) -> None:
    from tests.support.docker import labelled_containers, session_label

    probe = escapes.python(
        "import os, socket\n"
        "print('env', sorted(k for k in os.environ if k.startswith('DOCKER')))\n"
        "for path in ('/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock'):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n        s.connect(path); print('unix', path, 'connected')\n"
        "    except OSError as e:\n        print('unix', path, e.errno)\n"
        "for port in (2375, 2376):\n"
        "    try:\n"
        "        socket.create_connection(('host.docker.internal', port), timeout=5); print('tcp', port, 'connected')\n"
        "    except OSError as e:\n        print('tcp', port, type(e).__name__)\n"
    )

    async def inside(handle: Any) -> tuple[Any, Any, list[str]]:
        sockets = await handle.process.exec("find / -xdev -type s 2>/dev/null; ls /var/run /run")
        return await handle.process.exec(probe), sockets, labelled_containers(session_label())

    result, sockets, containers = sandbox.run(inside)
    assert result.exit_code == 0, result
    assert "connected" not in result.stdout, result.stdout
    assert "env []" in result.stdout, result.stdout
    assert "docker.sock" not in sockets.stdout and "containerd" not in sockets.stdout, sockets.stdout
    assert len(containers) == 1, f"the engine's view changed from inside: {containers}"


def test_no_new_privileges_defeats_a_setuid_binary() -> None:
    suid = "/usr/local/bin/suid-python"
    probe = "import os\nprint('euid', os.geteuid())\ntry:\n    open('/etc/shadow').read(); print('shadow read')\n"
    probe += "except OSError as e:\n    print('shadow', e.errno)\n"
    images: list[str] = []

    async def inside(handle: Any) -> tuple[Any, Any, Any]:
        # Root in the container (no capabilities: as the file's owner it may still set the bit) plants a
        # setuid-root interpreter, as an image a user brings might hold one.
        plant = await handle._bare_exec(["sh", "-c", f"cp /usr/bin/python3 {suid} && chmod 4755 {suid}"], user="0:0")
        assert plant.exit_code == 0, plant
        ran = await handle.process.exec(f"ls -l {suid} | cut -c1-10; " + escapes.python(probe, interpreter=suid))
        su = await handle.process.exec("echo | su -c 'id -u' root")
        images.append((await handle.snapshot("setuid-control")).id)
        return plant, ran, su

    try:
        _, ran, su = _run(inside)
        # The control: the same binary, in a container of the same image WITHOUT no-new-privileges, does escalate.
        control = subprocess.run(
            ["docker", "run", "--rm", "--user", f"{UID}:{UID}", "--cap-drop", "ALL", "--label", f"{TEST_LABEL}=1",
             images[0], suid, "-c", probe],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        remove_images(images)
    assert ran.stdout.splitlines()[0] == "-rwsr-xr-x", ran  # the bit is there
    assert ran.stdout.splitlines()[1:] == [f"euid {UID}", "shadow 13"], ran  # and no effect: EACCES
    assert su.exit_code != 0 and "uid" not in su.stdout and su.stdout.strip() != "0", su
    assert control.stdout.splitlines() == ["euid 0", "shadow read"], control


def test_a_fork_bomb_stops_at_the_pids_limit() -> None:
    from boxwright.providers.docker import DockerLimits

    limit = 64
    # Bounded: at most 400 children, each gone after 30 s, the whole under `timeout 60`.
    bomb = escapes.python(
        "import os, signal, time\n"
        "children, error = [], None\n"
        "for _ in range(400):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        error = e.errno; break\n"
        "    if pid == 0:\n        time.sleep(30); os._exit(0)\n"
        "    children.append(pid)\n"
        "print('forked', len(children), 'errno', error, flush=True)\n"
        "for pid in children:\n    os.kill(pid, signal.SIGKILL)\n"
        "for pid in children:\n    os.waitpid(pid, 0)\n"
    )

    async def inside(handle: Any) -> tuple[Any, Any, str, str]:
        result = await handle.process.exec(f"timeout 60 {bomb}")
        after = await handle.process.exec("echo alive")
        events = await asyncio.to_thread(_cgroup, handle.id, "pids", ("pids.events",))
        maximum = await asyncio.to_thread(_cgroup, handle.id, "pids", ("pids.max",))
        return result, after, events, maximum

    result, after, events, maximum = _run(inside, limits=DockerLimits(pids=limit, memory="512m", cpus=1.0))
    words = result.stdout.split()
    assert result.exit_code == 0 and words[0] == "forked" and words[2] == "errno", result
    assert int(words[1]) < limit and words[3] == str(EAGAIN), result
    assert maximum.strip() == str(limit), maximum
    assert _counter(events, "max") > 0, f"the host's cgroup did not count the refused forks: {events}"
    assert after.stdout == "alive\n", after  # the container survived its bomb
    assert subprocess.run(["true"]).returncode == 0  # and the host can still fork


def test_the_memory_limit_holds() -> None:
    from boxwright.providers.docker import DockerLimits

    # Bounded: 32 MiB at a time, written (so resident), at most 1 GiB.
    hog = escapes.python(
        "chunks = []\n"
        "for i in range(32):\n"
        "    chunks.append(b'x' * (32 << 20))\n"
        "    print('held', (i + 1) * 32, flush=True)\n"
        "print('ALLOCATED', flush=True)\n"
    )

    async def inside(handle: Any) -> tuple[Any, Any, str, str]:
        result = await handle.process.exec(hog)
        after = await handle.process.exec("echo alive")
        oom = await asyncio.to_thread(_cgroup, handle.id, "memory", ("memory.oom_control", "memory.events"))
        limit = await asyncio.to_thread(_cgroup, handle.id, "memory", ("memory.limit_in_bytes", "memory.max"))
        return result, after, oom, limit

    result, after, oom, limit = _run(inside, limits=DockerLimits(pids=256, memory="128m", cpus=1.0))
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("held")]
    assert "ALLOCATED" not in result.stdout and result.exit_code == 137, result  # the kernel's OOM kill
    assert held and max(held) <= 128, held
    assert int(limit) == 128 << 20, limit
    assert _counter(oom, "oom_kill") > 0, f"the host's cgroup counted no OOM kill: {oom}"
    assert after.stdout == "alive\n", after  # only the hog died, not the container
