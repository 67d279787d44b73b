"""From inside a real bubblewrap sandbox, what an agent gone wrong would try (issue 9, point 1).

Run as root, as CI runs: bwrap alone would keep every capability there, so each
attempt below succeeded before the hardening (remount /usr rw and write it, mknod,
read /etc/shadow). Each test makes the attempt from inside, asserts it fails, and
checks on the host that nothing changed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from boxwright.providers import _seccomp, bubblewrap_sandbox
from boxwright.providers import bubblewrap as bw
from tests.support import escapes
from tests.support.escapes import EPERM
from tests.support.escapes import host_mounts as _mounts
from tests.support.escapes import python as _python
from tests.support.escapes import syscall_numbers as _syscall_numbers
from tests.support.require import missing

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _bwrap_and_python() -> None:
    found = bw.probe()
    if not found.available:
        missing(f"bubblewrap cannot run here: {found.reason}")
    if not os.path.exists("/usr/bin/python3"):
        missing("/usr/bin/python3 is not installed: the escape attempts are python scripts run inside the sandbox")


def _run(body: Callable[[Any], Awaitable[T]], base_dir: Path) -> T:
    async def main() -> T:
        handle = await bubblewrap_sandbox(base_dir=base_dir).create()
        try:
            return await body(handle)
        finally:
            await handle.destroy()

    return asyncio.run(main())


def test_the_posture_is_measured_and_full_as_root():
    posture = bubblewrap_sandbox().posture
    if os.geteuid() != 0:
        pytest.skip("the posture as root is what CI runs; here the caller is not root")
    # The kernel here allows user namespaces and libseccomp is installed: the full posture must hold.
    assert posture.uid == bw.SANDBOX_UID and posture.user_namespace, posture
    assert posture.capabilities_dropped and posture.seccomp, posture
    assert not any("seccomp" in why and "no seccomp" in why for why in posture.weaker), posture

    async def inside(handle: Any) -> Any:
        return await handle.process.exec(
            "id -u; id -un; grep -E '^(CapEff|CapBnd|Seccomp|NoNewPrivs):' /proc/self/status"
        )

    result = _run(inside, Path(os.environ.get("TMPDIR", "/tmp")) / f"bw-posture-{secrets.token_hex(3)}")
    lines = result.stdout.split()
    assert result.exit_code == 0, result
    assert lines[:2] == [str(bw.SANDBOX_UID), bw.SANDBOX_USER], result.stdout
    status = dict(zip(lines[2::2], lines[3::2], strict=True))
    assert status == {"CapEff:": "0" * 16, "CapBnd:": "0" * 16, "Seccomp:": "2", "NoNewPrivs:": "1"}, status
    from boxwright.cli import doctor_checks

    detail = next(c.detail for c in doctor_checks() if c.name == "bubblewrap")
    assert f"uid {bw.SANDBOX_UID} of a user namespace" in detail and "seccomp filter on" in detail, detail


def test_a_missing_filter_is_a_reported_weaker_posture(monkeypatch):
    exe = bw.shutil.which("bwrap")
    assert exe is not None
    monkeypatch.setattr(_seccomp, "build", lambda: _seccomp.Filter(None, "libseccomp.so.2 is not installed (test)"))
    hardening, posture = bw._measure_posture(exe)
    assert posture.seccomp is False
    assert any("no seccomp filter: libseccomp.so.2 is not installed (test)" in why for why in posture.weaker), posture
    assert "--seccomp" not in hardening
    assert "no seccomp filter" in bw.describe_posture(posture)


def test_remount_usr_read_write_fails_and_usr_is_untouched(tmp_path):
    name = f"boxwright-escape-{secrets.token_hex(4)}"
    before = _mounts()
    mount_syscall = _python(escapes.MOUNT_SYSCALL)

    async def inside(handle: Any) -> list[Any]:
        return [
            await handle.process.exec(f"mount -o remount,rw /usr && touch /usr/{name} && echo WROTE"),
            await handle.process.exec(f"mount -o remount,rw / && touch /{name} && echo WROTE"),
            await handle.process.exec(mount_syscall),
            # Host root's files show up as the sandbox user's: owning them must not make them writable.
            await handle.process.exec("chmod 777 /usr/bin/env; touch /usr/bin/env; echo > /usr/bin/env"),
        ]

    env_before = os.stat("/usr/bin/env")
    remount, remount_root, syscall, chmod = _run(inside, tmp_path)
    for result in (remount, remount_root):
        assert result.exit_code != 0 and "WROTE" not in result.stdout, result
    assert syscall.stdout.split() == ["mount", "-1", str(EPERM)], syscall
    assert chmod.exit_code != 0, chmod
    assert not os.path.exists(f"/usr/{name}") and not os.path.exists(f"/{name}")
    env_after = os.stat("/usr/bin/env")
    assert (env_after.st_mode, env_after.st_mtime_ns, env_after.st_size) == (
        env_before.st_mode,
        env_before.st_mtime_ns,
        env_before.st_size,
    )
    assert _mounts() == before, "a mount inside the sandbox changed the host's mount table"


def test_mknod_fails(tmp_path):
    async def inside(handle: Any) -> tuple[list[Any], str]:
        results = [
            await handle.process.exec(f"mknod {where}/mem c 1 1 && echo MADE") for where in ("/workspace", "/tmp")
        ]
        results.append(await handle.process.exec("mknod /workspace/disk b 8 0 && echo MADE"))
        results.append(
            await handle.process.exec(_python("import os; os.mknod('/workspace/null2', 0o20666, os.makedev(1, 3))"))
        )
        return results, handle.workspace_root

    results, _ = _run(inside, tmp_path)
    for result in results:
        assert result.exit_code != 0 and "MADE" not in result.stdout, result
        assert "Operation not permitted" in result.stderr, result
    for state in tmp_path.iterdir():
        for path in state.rglob("*"):
            assert not (path.is_char_device() or path.is_block_device()), f"a device node reached the host: {path}"


def test_host_secrets_in_etc_are_not_visible(tmp_path):
    hidden = list(escapes.HIDDEN_ETC)
    present = [path for path in hidden if os.path.exists(path)]
    assert "/etc/shadow" in present, "this test needs a host /etc/shadow to hide"
    with open("/etc/shadow", "rb") as f:
        shadow = f.read()

    async def inside(handle: Any) -> list[Any]:
        return [
            *[await handle.process.exec(f"ls -la {path} && cat {path}") for path in hidden],
            await handle.process.exec("cat /etc/passwd"),
            await handle.process.exec("cat /etc/hosts >/dev/null && git --version >/dev/null && echo fine"),
            await handle.process.exec("cat /etc/ssh/ssh_host_*_key 2>&1; find / -xdev -name 'shadow*' 2>/dev/null"),
        ]

    *attempts, passwd, control, hunt = _run(inside, tmp_path)
    for path, result in zip(hidden, attempts, strict=True):
        assert result.exit_code != 0, (path, result)
        assert "No such file or directory" in result.stderr, (path, result)
    first_hash = next((line.split(":")[1] for line in shadow.decode().splitlines() if ":" in line), "")
    for result in (*attempts, hunt):
        assert shadow.decode() not in result.stdout and (len(first_hash) < 3 or first_hash not in result.stdout)
    # The sandbox's passwd is generated: its own user, never the host's accounts.
    users = [line.split(":")[0] for line in passwd.stdout.splitlines()]
    assert users == ["root", bw.SANDBOX_USER, "nobody"], passwd.stdout
    assert control.stdout == "fine\n", control  # positive control: what a userland needs is there


def test_writes_outside_the_workspace_fail(tmp_path):
    name = f"boxwright-escape-{secrets.token_hex(4)}"
    targets = list(escapes.OUTSIDE_TARGETS)

    async def inside(handle: Any) -> tuple[Any, Any, str, str]:
        state = handle.id
        host_paths = [state, os.path.dirname(state), os.path.join(state, "etc"), str(tmp_path)]
        script = escapes.write_outside(name, [*targets, *host_paths])
        sysctl = await handle.process.exec(escapes.SYSCTL_WRITE)
        return (
            await handle.process.exec(script + "; echo inside > /workspace/ok.txt"),
            sysctl,
            state,
            handle.workspace_root,
        )

    result, sysctl, state, _ = _run(inside, tmp_path)
    assert result.exit_code == 0, result
    assert "wrote:" not in result.stdout, result.stdout
    assert sysctl.exit_code != 0 and "SYSCTL" not in sysctl.stdout, sysctl
    host_dirs = [p for p in targets if p.startswith("/") and "workspace" not in p and not p.startswith("/proc")]
    for directory in [*host_dirs, state, os.path.dirname(state), str(tmp_path)]:
        assert not os.path.exists(os.path.join(directory, name)), f"the sandbox wrote {name} into host {directory}"


def test_host_processes_cannot_be_traced_or_signalled(tmp_path):
    host = subprocess.Popen(["sleep", f"3{secrets.randbelow(10**6)}"])
    numbers = _syscall_numbers("ptrace", "process_vm_readv")
    code = escapes.host_process_probe(host.pid)
    try:

        async def inside(handle: Any) -> Any:
            return await handle.process.exec(_python(code))

        result = _run(inside, tmp_path)
        with open(f"/proc/{host.pid}/status") as f:
            tracer = next(line.split()[1] for line in f if line.startswith("TracerPid:"))
        alive = host.poll() is None
    finally:
        host.kill()
        host.wait()
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.exit_code == 0, result
    assert "ptrace" in numbers  # the filter refuses ptrace: EPERM before any pid lookup
    assert lines["ptrace"] == f"-1 {EPERM}" and lines["seize"] == f"-1 {EPERM}", result.stdout
    assert lines["kill"] == "3", result.stdout  # ESRCH: the host's pids do not exist inside
    assert lines["proc"] == "False", result.stdout
    assert alive and tracer == "0", "the host process was killed or traced from inside the sandbox"


def test_a_sibling_in_the_sandbox_cannot_be_traced(tmp_path):
    # A sibling in the same command, and a process of another command of the same sandbox.
    code = (
        "import ctypes, os, subprocess, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        "print('ptrace', libc.ptrace(16, child.pid, 0, 0), ctypes.get_errno())\n"
        "print('seize', libc.ptrace(0x4206, child.pid, 0, 0), ctypes.get_errno())\n"
        "print('traceme', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
        "class IoVec(ctypes.Structure):\n"
        "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "buf = ctypes.create_string_buffer(8); local = IoVec(ctypes.addressof(buf), 8); remote = IoVec(4096, 8)\n"
        "rc = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "print('vm_readv', rc, ctypes.get_errno())\n"
        "status = open(f'/proc/{child.pid}/status').read()\n"
        "print('tracer', [l.split()[1] for l in status.splitlines() if l.startswith('TracerPid')][0])\n"
        "known = (1, os.getpid(), os.getppid(), child.pid)\n"
        "print('others', sorted(p for p in os.listdir('/proc') if p.isdigit() and int(p) not in known))\n"
        "child.kill()\n"
    )
    token = f"7{secrets.randbelow(10**8)}"

    async def inside(handle: Any) -> tuple[Any, Any]:
        other = await handle.process.spawn(f"echo up; sleep {token}")
        async for chunk in other.stdout:
            if "up" in chunk:
                break
        try:
            return await handle.process.exec(_python(code)), await handle.process.exec("pgrep -x sleep || echo none")
        finally:
            await other.kill()

    result, seen = _run(inside, tmp_path)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.exit_code == 0, result
    for call in ("ptrace", "seize", "traceme", "vm_readv"):
        assert lines[call] == f"-1 {EPERM}", (call, result.stdout)
    assert lines["tracer"] == "0", result.stdout
    assert lines["others"] == "[]", result.stdout  # another command's processes are in another pid namespace
    assert seen.stdout == "none\n", seen
    # What stays open between processes of one command is said, not hidden.
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    if not yama.exists() or yama.read_text().strip() == "0":
        assert any("/proc/PID/mem" in why for why in bw.probe().posture.weaker), bw.probe().posture


def test_another_sandboxs_workspace_is_out_of_sight(tmp_path):
    secret = f"sandbox-a-secret-{secrets.token_hex(6)}"
    token = f"6{secrets.randbelow(10**8)}"

    async def main() -> tuple[list[Any], str, str]:
        provider = bubblewrap_sandbox(base_dir=tmp_path)
        a, b = await provider.create(), await provider.create()
        try:
            await a.fs.write("/workspace/secret.txt", secret)
            holder = await a.process.spawn(f"cd /workspace && echo up && sleep {token}")
            async for chunk in holder.stdout:
                if "up" in chunk:
                    break
            where = a.workspace_root
            # As root with every capability, the host disk itself was a way in: make its node, mount it.
            disk = os.stat(where).st_dev
            mount_disk = (
                f"mknod /tmp/disk b {os.major(disk)} {os.minor(disk)}; mkdir -p /tmp/mnt; "
                f"mount -o ro /tmp/disk /tmp/mnt || mount -o ro /dev/vda /tmp/mnt; cat /tmp/mnt{where}/secret.txt"
            )
            attempts = [
                await b.process.exec(mount_disk),
                await b.process.exec(f"cat {where}/secret.txt"),
                await b.process.exec(f"echo planted > {where}/planted.txt"),
                await b.process.exec(f"ls {os.path.dirname(where)} {os.path.dirname(os.path.dirname(where))}"),
                await b.process.exec(
                    "grep -rs sandbox-a-secret / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr"
                    " 2>/dev/null | head -3"
                ),
                await b.process.exec(
                    "for p in /proc/[0-9]*; do cat $p/root/workspace/secret.txt $p/cwd/secret.txt; done 2>/dev/null"
                ),
                await b.process.exec("ls /workspace"),
            ]
            await holder.kill()
            return attempts, a.workspace_root, await a.fs.read("/workspace/secret.txt")
        finally:
            await a.destroy()
            await b.destroy()

    attempts, workspace, after = asyncio.run(main())
    for result in attempts:
        assert secret not in result.stdout + result.stderr, result
    assert attempts[1].exit_code != 0 and attempts[2].exit_code != 0, attempts[1:3]
    assert attempts[-1].stdout == "", attempts[-1]  # b's own workspace: empty, nothing of a's
    assert after == secret and not os.path.exists(os.path.join(workspace, "planted.txt"))


def test_unshare_mount_and_kernel_surfaces_are_refused_inside(tmp_path):
    numbers = _syscall_numbers(*escapes.KERNEL_SYSCALLS)
    assert "unshare" in numbers and "mount" in numbers, numbers
    code = escapes.kernel_syscall_probe(numbers)
    before = _mounts()

    async def inside(handle: Any) -> list[Any]:
        return [
            await handle.process.exec(_python(code)),
            *[await handle.process.exec(command) for command in escapes.SHELL_UNSHARE_AND_MOUNT],
            # A positive control: ordinary process creation still works under the clone rules.
            await handle.process.exec(_python(escapes.SPAWN_CONTROL)),
        ]

    calls, *shell, control = _run(inside, tmp_path)
    got = escapes.parse_calls(calls.stdout)
    assert calls.exit_code == 0, calls
    for name in numbers:
        expected = ["-1", "38"] if name == "clone3" else ["-1", str(EPERM)]  # clone3: ENOSYS, glibc falls back
        assert got[name] == expected, (name, calls.stdout)
    for result in shell:
        assert result.exit_code != 0 and not any(w in result.stdout for w in ("UNSHARED", "MOUNTED")), result
    assert control.stdout == "0\n", control
    assert _mounts() == before, "a mount inside the sandbox changed the host's mount table"


def test_the_filter_kills_a_foreign_architecture_syscall(tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("the 32-bit syscall gate is an x86_64 test")
    # int 0x80 is the i386 table: a filter checking only x86_64 numbers would let `mount` through there.
    code = (
        "import ctypes, mmap\n"
        "code = bytes([0xb8, 0x15, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax, 21 (i386 mount); int 0x80; ret\n"
        "mem = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "mem.write(code)\n"
        "addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))\n"
        "print('returned', ctypes.CFUNCTYPE(ctypes.c_long)(addr)())\n"
    )

    # The x32 table is the x86_64 one with bit 30 set: the same gap, reached through syscall().
    x32 = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('returned', libc.syscall(0x40000000 | 165, b'none', b'/tmp', b'tmpfs', 0, None))\n"
    )

    async def inside(handle: Any) -> list[Any]:
        return [await handle.process.exec(_python(code)), await handle.process.exec(_python(x32))]

    for result in _run(inside, tmp_path):
        assert "returned" not in result.stdout, result
        assert result.exit_code == 128 + 31, result  # SIGSYS: the filter's bad-architecture action


def test_the_callers_files_are_the_sandbox_users_and_another_uids_are_not(tmp_path):
    if os.geteuid() != 0 or not bw.probe().posture.user_namespace:
        pytest.skip("the uid mapping as root under a user namespace is what CI runs")
    from boxwright.testkit import RecordingLogger

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    os.chown(theirs, 4242, 4242)
    logger = RecordingLogger()

    async def main(workspace: Path) -> Any:
        handle = await bubblewrap_sandbox(workspace, base_dir=tmp_path / "state", logger=logger).create()
        try:
            return await handle.process.exec("stat -c %u . && echo x > f && stat -c %u f")
        finally:
            await handle.destroy()

    own = asyncio.run(main(mine))
    assert own.stdout == f"{bw.SANDBOX_UID}\n{bw.SANDBOX_UID}\n", own  # writable, and the file is the caller's
    assert os.stat(mine / "f").st_uid == 0 and not logger.warnings
    foreign = asyncio.run(main(theirs))
    assert foreign.exit_code != 0 and not (theirs / "f").exists(), foreign
    assert any("belongs to uid 4242" in message for message, _ in logger.warnings), logger.warnings


def test_a_command_outlives_the_host_process_and_destroy_still_ends_it(tmp_path):
    # Why the hardening has no --die-with-parent: a journaled run must outlive its host for a takeover.
    token = f"5{secrets.randbelow(10**8)}"
    host = (
        "import asyncio, sys\n"
        "from boxwright.providers import bubblewrap_sandbox\n"
        "async def main():\n"
        f"    handle = await bubblewrap_sandbox(base_dir={str(tmp_path)!r}).create()\n"
        f"    await handle.process.spawn('sleep {token}')\n"
        "    print(handle.id, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    from boxwright.sandbox import DestroyInput
    from boxwright.testkit import host_pids

    proc = subprocess.Popen([sys.executable, "-c", host], stdout=subprocess.PIPE, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        state = proc.stdout.readline().decode().strip()
        deadline = time.monotonic() + 10
        while not host_pids(["sleep", token]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids(["sleep", token]), "the sandboxed command never started"
        proc.kill()
        proc.wait()
        time.sleep(1.0)
        assert host_pids(["sleep", token]), "the sandboxed command died with the host process"
        asyncio.run(bubblewrap_sandbox(base_dir=tmp_path).destroy(DestroyInput(id=state)))
        deadline = time.monotonic() + 10
        while host_pids(["sleep", token]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not host_pids(["sleep", token]), "destroy by id left the orphaned command running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in host_pids(["sleep", token]):
            os.kill(pid, 9)


def test_no_controlling_terminal_to_push_keystrokes_into(tmp_path):
    # Why the hardening has no --new-session: the spawner's setsid already leaves no terminal for TIOCSTI.
    code = (
        "import os\n"
        "try:\n    os.open('/dev/tty', os.O_RDWR); print('tty')\nexcept OSError as e:\n    print('no tty', e.errno)\n"
    )

    async def inside(handle: Any) -> Any:
        return await handle.process.exec(_python(code))

    result = _run(inside, tmp_path)
    assert result.stdout.splitlines()[0] == "no tty 6", result  # ENXIO: no controlling terminal
