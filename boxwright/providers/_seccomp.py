"""The seccomp filter bubblewrap installs: refuse the syscalls a sandbox escape starts with.

Built with the system's ``libseccomp.so.2`` through ctypes (no pip dependency):
libseccomp writes the architecture check, maps names to numbers for this
architecture and exports classic BPF that ``bwrap --seccomp FD`` loads. A
syscall of a foreign architecture (i386 through ``int 0x80`` on x86_64, or the
x32 numbers) kills the thread, so the filter cannot be sidestepped through a
second syscall table.

Everything not listed is allowed: the sandbox is a normal Linux userland
(git, node, python, sh); this filter closes the kernel surfaces an agent never
needs. ``build()`` names why when no filter can be built, so the caller can
report the weaker posture instead of running without it silently.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import tempfile

import msgspec

# Refused with EPERM: mounts (old and new API), namespace changes, tracing
# another process, the kernel keyring, eBPF, perf, kexec and kernel modules.
REFUSED = (
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
)

# clone() with a namespace flag is unshare() by another name. clone3 passes its
# flags in memory a filter cannot read, so it answers ENOSYS: glibc and musl then
# fall back to clone(), whose flags the filter does see (Docker and Flatpak do the same).
_CLONE_NEW = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
# Architectures where clone's first argument is not its flags.
_CLONE_FLAGS_NOT_FIRST = frozenset({"s390", "s390x"})

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_MASKED_EQ = 7
_NR_ERROR = -1


class Filter(msgspec.Struct, frozen=True):
    """A compiled filter (``program`` set) or why there is none (``reason`` set)."""

    program: bytes | None
    reason: str


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno(code: int) -> int:
    return _ACT_ERRNO | (code & 0xFFFF)


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: _ArgCmp) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr == _NR_ERROR:
        return  # not a syscall this libseccomp knows: nothing to refuse
    array = (_ArgCmp * max(len(cmps), 1))(*cmps)
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
    # A negative number is a syscall this architecture lacks (umount on x86_64):
    # libseccomp may refuse to add it, and there is nothing to refuse.
    if rc != 0 and nr >= 0:
        raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")


def _compile(lib: ctypes.CDLL) -> bytes:
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        for name in REFUSED:
            _add(lib, ctx, _errno(errno.EPERM), name)
        if platform.machine() not in _CLONE_FLAGS_NOT_FIRST:
            for flag in _CLONE_NEW:
                _add(lib, ctx, _errno(errno.EPERM), "clone", _ArgCmp(0, _CMP_MASKED_EQ, flag, flag))
        _add(lib, ctx, _errno(errno.ENOSYS), "clone3")
        # seccomp_export_bpf writes to a descriptor; a private temp file holds it.
        with tempfile.TemporaryFile() as out:
            rc = lib.seccomp_export_bpf(ctx, out.fileno())
            if rc != 0:
                raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(ctx)


@functools.cache
def build() -> Filter:
    """The filter for this machine, compiled once per process."""
    try:
        lib = _load()
    except OSError as exc:
        return Filter(None, f"libseccomp.so.2 is not installed ({exc}); `apt-get install libseccomp2`")
    try:
        program = _compile(lib)
    except (OSError, AttributeError) as exc:
        return Filter(None, f"libseccomp could not build the filter: {exc}")
    if not program or len(program) % 8:
        return Filter(None, f"libseccomp exported {len(program)} bytes, not a BPF program")
    return Filter(program, "")
