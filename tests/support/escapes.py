"""The escape attempts of the security suite, one copy for every isolating provider (bubblewrap, Docker).

Each is a shell command or a python script run inside a sandbox; the test that runs it asserts that it
fails and then checks the host. The scripts print ``name rc errno`` lines so one run tries many calls.
"""

from __future__ import annotations

import ctypes
import shlex

EPERM = 1
ENOSYS = 38

# Where an agent gone wrong would write to leave the workspace (and the sandbox).
OUTSIDE_TARGETS = (
    "/",
    "/usr",
    "/usr/bin",
    "/etc",
    "/root",
    "/home",
    "/var",
    "/opt",
    "/proc/sys/kernel",
    "/workspace/..",
)
# Host secrets under /etc a sandbox must not show.
HIDDEN_ETC = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssl/private", "/etc/ssh", "/etc/npmrc")
# Namespaces, mounts and kernel surfaces: each call must be refused inside.
KERNEL_SYSCALLS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_tree",
    "fsopen",
    "clone3",
    "clone",
)
# Shell forms of the same: each must fail (and print no marker).
SHELL_UNSHARE_AND_MOUNT = (
    "unshare -U -r true && echo UNSHARED",
    "unshare -m true && echo UNSHARED",
    "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m && echo MOUNTED",
    "umount /proc && echo UNMOUNTED",
)
MARKERS = ("UNSHARED", "MOUNTED", "UNMOUNTED", "WROTE", "MADE", "SYSCTL")
SYSCTL_WRITE = "echo 1 > /proc/sys/kernel/sysrq && echo SYSCTL"

# The mount(2) call itself, not the mount binary (which may refuse on its own before asking the kernel).
MOUNT_SYSCALL = (
    "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "MS_REMOUNT, MS_BIND = 32, 4096; "
    "rc = libc.mount(b'none', b'/usr', None, MS_REMOUNT | MS_BIND, None); "
    "print('mount', rc, ctypes.get_errno())"
)
# A positive control: ordinary process creation still works under whatever filters clone.
SPAWN_CONTROL = "import subprocess; print(subprocess.run(['true']).returncode)"


def python(code: str, interpreter: str = "/usr/bin/python3") -> str:
    """A shell command running ``code`` with the sandbox's python."""
    return f"{interpreter} -c {shlex.quote(code)}"


def syscall_numbers(*names: str) -> dict[str, int]:
    """This architecture's numbers, from libseccomp (the sandbox runs on the same kernel)."""
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    numbers = {name: lib.seccomp_syscall_resolve_name(name.encode()) for name in names}
    return {name: nr for name, nr in numbers.items() if nr >= 0}


# The container engine's own mounts (container filesystems, network namespaces) come and go with every
# container any session starts: not what an escape would add.
ENGINE_MOUNTS = ("/var/lib/docker/", "/run/docker/", "/run/netns/", "/run/containerd/", "/var/lib/containerd/")


def host_mounts(ignore: tuple[str, ...] = ENGINE_MOUNTS) -> list[str]:
    """The caller's mount table (mount points and options), to compare before and after."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split(" - ")[0].split(" ", 4)[4] for line in f]
    return sorted(p for p in points if not p.startswith(ignore))


def kernel_syscall_probe(numbers: dict[str, int]) -> str:
    """A script calling each syscall with harmless arguments (clone/unshare asking for a user namespace)."""
    clone_newuser = 0x10000000 | 17  # CLONE_NEWUSER | SIGCHLD
    return (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"numbers = {numbers!r}\n"
        "args = {'clone': (" + str(clone_newuser) + ", 0, 0, 0, 0), 'unshare': (0x10000000,)}\n"
        "for name, nr in numbers.items():\n"
        "    ctypes.set_errno(0)\n"
        "    rc = libc.syscall(nr, *args.get(name, (0, 0, 0, 0, 0)))\n"
        "    print(name, rc, ctypes.get_errno())\n"
    )


def host_process_probe(pid: int) -> str:
    """A script that tries to trace, signal and read host process ``pid`` (lines: ptrace, seize, kill, proc)."""
    return (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"pid = {pid}\n"
        "print('ptrace', libc.ptrace(16, pid, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "print('seize', libc.ptrace(0x4206, pid, 0, 0), ctypes.get_errno())\n"  # PTRACE_SEIZE
        "try:\n    os.kill(pid, 9); print('kill ok')\nexcept OSError as e:\n    print('kill', e.errno)\n"
        "print('proc', os.path.exists(f'/proc/{pid}/mem'))\n"
    )


def write_outside(name: str, targets: tuple[str, ...] | list[str]) -> str:
    """A script that tries to create ``name`` in each target directory, printing ``wrote:<dir>`` on success."""
    return "; ".join(f"(echo x > {t.rstrip('/')}/{name}) 2>/dev/null && echo wrote:{t}" for t in targets)


def parse_calls(stdout: str) -> dict[str, list[str]]:
    """``name rc errno`` lines into {name: [rc, errno]}."""
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.strip()}
