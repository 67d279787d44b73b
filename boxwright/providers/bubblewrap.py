"""Bubblewrap: real isolation on Linux without Docker, through ``bwrap``.

Each command runs in its own ``bwrap`` with its own pid namespace, over a root
built from read-only binds of the host's ``/usr`` and a minimal ``/etc`` (no
shadow, sudoers or ssh keys; ``passwd``/``group`` generated). The only
writable places are the workspace (bound at ``/workspace``) and a per-sandbox
``/tmp`` that outlives single commands (journals live there). The env is built
from nothing: no host variable, so no host secret, reaches the sandbox.

Run as root (CI, containers), ``bwrap`` alone would keep every capability: a
command could remount ``/usr`` read-write. So a command runs with no
capabilities, as uid 1000 of a user namespace of its own (the caller's uid maps
to it, so the workspace the caller owns stays writable), under a seccomp filter
(``_seccomp``) refusing mounts, namespaces, ptrace, keyrings, bpf and modules.
What the kernel here allows is measured by the probe and reported as
``Posture`` (``provider.posture``, ``boxwright doctor``); a missing layer is
named there, never silently skipped.

A sandbox is a state directory ``<base_dir>/<uuid>`` holding ``tmp/``, the
workspace (``workspace/``, unless ``dir`` names one) and ``sandbox.json``; its
id is that directory. Every ``bwrap`` of a sandbox carries the directory in its
argv, so destroy finds and kills them all, also ones another process started; the groups a
handle spawns are also recorded (``processes/``, ``_posix.ProcessRecord``), so they get SIGTERM
and a grace before that sweep's SIGKILL.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from ..errors import (
    ProviderUnavailableError,
    SandboxNotFoundError,
    SandboxPathError,
    UnsupportedCapabilityError,
)
from ..git_exec import ExecGit
from ..sandbox import Capabilities, CreateInput, DestroyInput, ResumeInput, SnapshotRef
from . import _seccomp
from ._hostfs import HostFs, PathMap
from ._posix import (
    HandleEnv,
    HostProcesses,
    LocalPorts,
    Logger,
    ProcessRecord,
    StdlibLogger,
    remove_tree_with_retry,
)

NAME = "bubblewrap"
INSTALL_HELP = "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp/home",
    "LANG": "C.UTF-8",
}
_ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SANDBOX_UID = 1000
SANDBOX_USER = "boxwright"
# The host /etc a userland needs (name service, TLS roots, loader, time zone,
# interpreters' config), copied once per sandbox into <state>/etc, which is bound
# at /etc with one mount (a bind per entry cost ~12 ms on every command). Named
# one at a time: a directory taken whole could hold a secret (``/etc/ssl/private``),
# and under the user namespace a file only host root may read belongs to the
# sandbox user. npmrc and pip.conf can hold registry tokens: not copied.
_ETC = (
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "networks",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust",
    "crypto-policies",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "mime.types",
    "shells",
    "profile",
    "bash.bashrc",
    "inputrc",
    "terminfo",
    "magic",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "perl",
)
# Bound live over their copies (one mount each): the host may change the files while a
# sandbox lives, and the directories are hundreds of public links, slow to copy (~1.5 s here).
_ETC_LIVE = ("hosts", "resolv.conf", "alternatives", "ssl/certs", "pki/tls/certs", "pki/ca-trust", "crypto-policies")


class _Meta(msgspec.Struct):
    workspace: str
    owned_workspace: bool
    network: Literal["allow", "deny"]


class Posture(msgspec.Struct, frozen=True):
    """How a sandboxed command is held, measured inside a real ``bwrap`` by the probe.

    ``weaker`` names, one sentence each, every layer this machine does not give
    and what that leaves open; empty means the full posture holds.
    """

    uid: int  # the uid commands run as inside
    user_namespace: bool  # the caller's uid is mapped to ``uid``; host root is not root inside
    capabilities_dropped: bool  # CapEff inside was 0
    seccomp: bool  # the syscall filter was loaded (Seccomp: 2 inside)
    weaker: tuple[str, ...] = ()


_NO_POSTURE = Posture(uid=-1, user_namespace=False, capabilities_dropped=False, seccomp=False)


class Probe(msgspec.Struct, frozen=True):
    """What ``bwrap`` can do on this machine, measured by running it."""

    available: bool
    reason: str
    network_deny: bool
    killable: bool
    posture: Posture = _NO_POSTURE
    # The bwrap flags (user namespace, capabilities) that were measured to work.
    hardening: tuple[str, ...] = ()


def _etc_live(name: str) -> list[str]:
    real = os.path.realpath(f"/etc/{name}")
    return ["--ro-bind", real, f"/etc/{name}"] if os.path.exists(real) else []


def _root_args(etc: str | None = None) -> list[str]:
    """The read-only root; ``etc`` is the sandbox's /etc (none: the probe's bare runs)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if etc is not None:
        args += ["--ro-bind", etc, "/etc"]
        for name in _ETC_LIVE:
            if os.path.exists(os.path.join(etc, name)):  # the mount point, in a read-only /etc
                args += _etc_live(name)
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def _world_unreadable(directory: str, names: list[str]) -> set[str]:
    """copytree's ignore: what the host keeps from other users stays out of the copy."""
    skip = set()
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            skip.add(name)
            continue
        if not stat.S_ISLNK(mode) and not mode & stat.S_IROTH:
            skip.add(name)
    return skip


def _copy_etc_entry(name: str, target: str) -> None:
    src, dst = f"/etc/{name}", os.path.join(target, name)
    if not os.path.lexists(src):
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    real = os.path.realpath(src)
    if os.path.islink(src) and real.startswith("/usr/"):
        # Resolves inside as outside (localtime -> zoneinfo): keep the link, so its name reads right.
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(real) and name in _ETC_LIVE:
        os.makedirs(dst, exist_ok=True)  # the mount point of its live bind, in a read-only /etc
    elif os.path.isdir(real):
        try:
            shutil.copytree(real, dst, symlinks=True, ignore=_world_unreadable)
        except shutil.Error:
            pass  # a file vanished or could not be read mid-copy: the rest is copied
    elif os.path.isfile(real) and not _world_unreadable(os.path.dirname(real), [os.path.basename(real)]):
        shutil.copyfile(real, dst)
        os.chmod(dst, 0o644)


def _generated_etc(uid: int) -> dict[str, str]:
    """passwd, group and gitconfig for a sandbox whose commands run as ``uid``."""
    user = "root" if uid == 0 else SANDBOX_USER
    passwd = [f"{user}:x:{uid}:{uid}:boxwright sandbox:{BASE_ENV['HOME']}:/bin/sh"]
    group = [f"{user}:x:{uid}:"]
    if uid != 0:
        passwd.insert(0, "root:x:0:0:root:/root:/usr/sbin/nologin")
        group.insert(0, "root:x:0:")
    passwd.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    group.append("nogroup:x:65534:")
    try:
        with open("/etc/gitconfig") as f:
            host_git = f.read()
    except OSError:
        host_git = ""
    # A file another host uid owns shows up inside as nobody's; git would then call the
    # repository dubious and refuse it. Inside the sandbox every repository is the sandbox's.
    gitconfig = f"{host_git.rstrip()}\n[safe]\n\tdirectory = *\n".lstrip()
    return {"passwd": "\n".join(passwd) + "\n", "group": "\n".join(group) + "\n", "gitconfig": gitconfig}


def _ensure_state_files(state: str, found: Probe) -> None:
    """The /etc and the seccomp program of a sandbox (idempotent: a resumed or forked state may lack them)."""
    etc = os.path.join(state, "etc")
    if not os.path.isdir(etc):
        staging = f"{etc}.{uuid.uuid4().hex}"
        os.makedirs(staging)
        for name in _ETC:
            _copy_etc_entry(name, staging)
        for name, text in _generated_etc(found.posture.uid).items():
            with open(os.path.join(staging, name), "w") as f:
                f.write(text)
        try:
            os.rename(staging, etc)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process made it first
    program = _seccomp.build().program
    bpf = os.path.join(state, "seccomp.bpf")
    if found.posture.seccomp and program is not None and not os.path.exists(bpf):
        staging = f"{bpf}.{uuid.uuid4().hex}"
        with open(staging, "wb") as f:
            f.write(program)
        os.replace(staging, bpf)


@functools.cache
def probe(bwrap: str = "bwrap") -> Probe:
    """Run ``bwrap`` once: does it start, can it unshare the network, does a group kill empty it."""
    exe = shutil.which(bwrap)
    if exe is None:
        return Probe(False, f"{bwrap!r} is not on PATH; {INSTALL_HELP}", False, False)
    base = [exe, "--unshare-pid", *_root_args(), "--"]
    try:
        run = subprocess.run([*base, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, f"bwrap did not run: {exc}", False, False)
    if run.returncode != 0:
        why = run.stderr.decode(errors="replace").strip()
        return Probe(False, f"bwrap cannot create namespaces here: {why}", False, False)
    net = subprocess.run([exe, "--unshare-net", *base[1:], "true"], capture_output=True, timeout=20).returncode == 0
    hardening, posture = _measure_posture(exe)
    hardened = [exe, "--unshare-pid", *hardening, *_root_args(), "--"]
    return Probe(True, "", net, _kill_reaches_children(hardened), posture, hardening)


_USERNS = ("--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID))
# No --new-session: the spawner already starts bwrap in a session of its own, with
# no controlling terminal, so TIOCSTI has no terminal to push into; and a sandbox in
# a session of its own leaves the process group a kill signals: a kill right after
# spawn left the command running (19 in 40, measured).
# No --die-with-parent: bwrap's parent is the host process, and a journaled run's
# capture must survive that process's death for another host to take the run over
# (spec/durable-runs.md); with it, a SIGKILLed host took every sandboxed command along.
# Orphans stay confined, and destroy and gc find them by their argv.
_ALWAYS = ("--cap-drop", "ALL")
# Strongest first; the first that runs is the posture. --disable-userns (bwrap 0.8)
# also stops a nested user namespace, which the seccomp filter refuses anyway.
_LADDER = ((*_USERNS, "--disable-userns", *_ALWAYS), (*_USERNS, *_ALWAYS), _ALWAYS, ())
SECCOMP_FD = 9


def _inside_status(exe: str, hardening: Sequence[str], program: bytes | None) -> dict[str, str] | str:
    """/proc/self/status of a command under ``hardening`` (and the filter), or bwrap's complaint."""
    with tempfile.TemporaryFile() as bpf:
        extra: list[str] = []
        fds: tuple[int, ...] = ()
        if program is not None:
            bpf.write(program)
            bpf.seek(0)
            extra, fds = ["--seccomp", str(bpf.fileno())], (bpf.fileno(),)
        argv = [exe, "--unshare-pid", *hardening, *_root_args(), *extra, "--", "cat", "/proc/self/status"]
        try:
            run = subprocess.run(argv, capture_output=True, timeout=20, pass_fds=fds)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    if run.returncode != 0:
        return run.stderr.decode(errors="replace").strip() or f"exit {run.returncode}"
    fields = (line.split(":", 1) for line in run.stdout.decode(errors="replace").splitlines() if ":" in line)
    return {key: value.strip() for key, value in fields}


def _measure_posture(exe: str) -> tuple[tuple[str, ...], Posture]:
    weaker: list[str] = []
    status: dict[str, str] | str = "not tried"
    hardening: tuple[str, ...] = ()
    refusals: list[str] = []
    for hardening in _LADDER:
        status = _inside_status(exe, hardening, None)
        if isinstance(status, dict):
            break
        refusals.append(status)
    if not isinstance(status, dict):
        return (), Posture(-1, False, False, False, (f"bwrap ran no command to measure: {status}",))
    userns = "--unshare-user" in hardening
    uid = int(status.get("Uid", "-1").split()[0])
    caps = int(status.get("CapEff", "1"), 16) == 0
    if not userns:
        weaker.append(
            f"no user namespace (bwrap --unshare-user: {refusals[0] if refusals else '?'}): commands run as host uid "
            f"{uid}" + (", root without capabilities" if uid == 0 else "")
        )
    if not caps:
        weaker.append(f"capabilities are not dropped: commands keep CapEff {status.get('CapEff')}")
    found = _seccomp.build()
    seccomp = False
    if found.program is None:
        weaker.append(f"no seccomp filter: {found.reason}")
    else:
        filtered = _inside_status(exe, hardening, found.program)
        seccomp = isinstance(filtered, dict) and filtered.get("Seccomp") == "2"
        if not seccomp:
            weaker.append(f"bwrap did not load the seccomp filter: {filtered if isinstance(filtered, str) else '?'}")
    weaker.append(_sibling_memory(seccomp))
    return hardening, Posture(uid, userns, caps, seccomp, tuple(w for w in weaker if w))


def _sibling_memory(seccomp: bool) -> str:
    """Yama is the one guard between two processes of one command: same uid, same namespaces."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = "absent"
    if scope not in ("absent", "0"):
        return ""
    refused = "ptrace itself is refused by the filter, but " if seccomp else ""
    return (
        f"Yama ptrace_scope is {scope}: {refused}processes of one command can read and write each other's "
        "memory through /proc/PID/mem (other commands, other sandboxes and the host are out of sight)"
    )


def _kill_reaches_children(base: list[str]) -> bool:
    nap = f"86400.{os.getpid()}{time.monotonic_ns() % 10000}"
    proc = subprocess.Popen(
        [*base, "sh", "-c", f"sleep {nap} & echo $! ; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not _sandbox_pids(f"sleep\x00{nap}"):
                return True
            time.sleep(0.02)
        return False
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        if proc.poll() is None:
            proc.kill()


def describe_posture(posture: Posture) -> str:
    """One line for ``boxwright doctor``: what holds a command, then every weaker layer."""
    held = [
        f"commands run as uid {posture.uid}" + (" of a user namespace" if posture.user_namespace else " of the host"),
        "no capabilities" if posture.capabilities_dropped else "capabilities kept",
        "seccomp filter on" if posture.seccomp else "no seccomp filter",
    ]
    return ", ".join(held) + "".join(f"; weaker: {why}" for why in posture.weaker)


def _capabilities(found: Probe) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=True,
        killable_processes=found.killable,
        snapshots=False,
        network_policy=found.network_deny,
        durable_filesystem=True,
        fork=True,
    )


def _sandbox_pids(marker: str) -> list[int]:
    """Pids whose argv contains ``marker`` (NUL-separated argv text)."""
    needle = marker.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _kill_sandbox_processes(state: str) -> None:
    """SIGKILL every bwrap of a sandbox; the death of a pid namespace's init ends all in it."""
    marker = f"--bind\x00{state}/tmp\x00/tmp"
    for _ in range(50):
        pids = _sandbox_pids(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


class BubblewrapHandle:
    provider = NAME

    def __init__(
        self,
        state: str,
        meta: _Meta,
        *,
        base_dir: str,
        bwrap: str,
        ro_binds: Sequence[str],
        capabilities: Capabilities,
        logger: Logger | None,
        env: Mapping[str, str] | None = None,
        found: Probe | None = None,
    ) -> None:
        self.id = state
        self.workspace_root = meta.workspace
        self.capabilities = capabilities
        self._found = found if found is not None else probe(bwrap)
        self.posture = self._found.posture
        self._state = state
        self._meta = meta
        self._base_dir = base_dir
        self._bwrap = bwrap
        self._ro_binds = tuple(ro_binds)
        self._logger = logger
        self._tmp = os.path.join(state, "tmp")
        self.env = HandleEnv(env)
        self._paths = PathMap([("/workspace", meta.workspace), ("/tmp", self._tmp)], fallback=None)
        self.fs = HostFs(self._paths)
        record = _process_record(state, logger)
        record.prepare()
        self.process = HostProcesses(self._launch, logger, record)
        self.git = ExecGit(self.process)
        self.ports = LocalPorts()
        # Added by bind_read_only for this handle's life (an agent CLI found on the host, a repository
        # to clone): not part of the provider's identity, so they never make a new sandbox.
        self._extra_ro_binds: list[str] = []

    def shows_host_path(self, path: str) -> bool:
        """Whether the host path ``path`` is visible at the same path inside this sandbox (``HostPathBinder``)."""
        real = os.path.realpath(path)
        args = _root_args()
        same = [args[i + 1] for i in range(len(args) - 2) if args[i] == "--ro-bind" and args[i + 1] == args[i + 2]]
        roots = [*same, *self._ro_binds, *self._extra_ro_binds]
        return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)

    def bind_read_only(self, paths: Sequence[str]) -> None:
        """Show host ``paths`` read-only at the same path to this handle's later commands (``HostPathBinder``)."""
        for path in paths:
            real = os.path.realpath(path)
            if not os.path.exists(real):
                # bwrap refuses to start a command over a missing bind source: say which one, here.
                raise FileNotFoundError(f"cannot bind {real!r} into the sandbox: it does not exist on the host")
            if real not in self._extra_ro_binds and real not in self._ro_binds:
                self._extra_ro_binds.append(real)

    def _launch(
        self, command: str, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[list[str], str, dict[str, str]]:
        if not os.path.isdir(self.workspace_root):
            raise SandboxNotFoundError(NAME, self.id, "has no workspace any more (the directory is gone)")
        inside = cwd or "/workspace"
        if not inside.startswith("/"):
            inside = f"/workspace/{inside}"
        if not os.path.isdir(self._paths.host(inside)):
            raise SandboxPathError(inside, "/workspace", "is not a directory inside the sandbox, under")
        _ensure_state_files(self._state, self._found)
        argv = [self._bwrap, "--unshare-pid", *self._found.hardening]
        if self._meta.network == "deny":
            argv.append("--unshare-net")
        argv += _root_args(os.path.join(self._state, "etc"))
        argv += ["--bind", self.workspace_root, "/workspace", "--bind", self._tmp, "/tmp"]
        # After /tmp, so a host path under /tmp can still be shown to the sandbox.
        for path in (*self._ro_binds, *self._extra_ro_binds):
            argv += ["--ro-bind", path, path]
        # bwrap's own root is a tmpfs the sandbox user owns: read-only, nothing lands outside the binds.
        argv += ["--remount-ro", "/", "--chdir", inside]
        if self._found.posture.seccomp:
            argv += ["--seccomp", str(SECCOMP_FD)]
        argv += ["--", "sh", "-c", command]
        if self._found.posture.seccomp:
            # bwrap reads the filter from a descriptor, opened afresh per command (bwrap reads it to
            # its end): a shell opens it and execs bwrap, so the spawner needs no descriptor passing.
            bpf = os.path.join(self._state, "seccomp.bpf")
            argv = ["/bin/sh", "-c", f'exec "$@" {SECCOMP_FD}<"$0"', bpf, *argv]
        # The env goes to bwrap itself, which passes it on: never on argv, where `ps` shows it.
        return argv, self._state, {**BASE_ENV, **self.env.get(), **(env or {})}

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshot", "bubblewrap keeps no snapshots; use fork() for a copy")

    async def fork(self) -> BubblewrapHandle:
        state = os.path.join(self._base_dir, f"fork-{uuid.uuid4().hex}")
        workspace = os.path.join(state, "workspace")
        await asyncio.to_thread(shutil.copytree, self.workspace_root, workspace, symlinks=True)
        await asyncio.to_thread(shutil.copytree, self._tmp, os.path.join(state, "tmp"), symlinks=True)
        meta = _Meta(workspace=workspace, owned_workspace=True, network=self._meta.network)
        _write_meta(state, meta)
        await asyncio.to_thread(_ensure_state_files, state, self._found)
        return BubblewrapHandle(
            state,
            meta,
            base_dir=self._base_dir,
            bwrap=self._bwrap,
            ro_binds=self._ro_binds,
            capabilities=self.capabilities,
            logger=self._logger,
            env=self.env.get(),
            found=self._found,
        )

    async def destroy(self) -> None:
        await self.process.kill_all()
        await asyncio.to_thread(_teardown, self._state, self._meta, self._logger)


def _process_record(state: str, logger: Logger | None) -> ProcessRecord:
    """The groups the sandbox's handles spawned (another host's too): TERMed first, before the argv sweep."""
    return ProcessRecord(os.path.join(state, "processes"), logger)


def _teardown(state: str, meta: _Meta, logger: Logger | None) -> None:
    _kill_sandbox_processes(state)
    if not meta.owned_workspace and os.path.isdir(state):
        # The user's workspace stays; only our state goes.
        remove_tree_with_retry(os.path.join(state, "tmp"), logger)
        remove_tree_with_retry(os.path.join(state, "etc"), logger)
        remove_tree_with_retry(os.path.join(state, "processes"), logger)
        for name in ("sandbox.json", "seccomp.bpf"):
            with _suppress_missing():
                os.unlink(os.path.join(state, name))
        with _suppress_missing():
            os.rmdir(state)
        return
    remove_tree_with_retry(state, logger)


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, FileNotFoundError)


def _write_meta(state: str, meta: _Meta) -> None:
    os.makedirs(os.path.join(state, "tmp", "home"), exist_ok=True)
    with open(os.path.join(state, "sandbox.json"), "wb") as f:
        f.write(msgspec.json.encode(meta))


class BubblewrapProvider:
    name = NAME
    restore_snapshot = None

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        network: Literal["allow", "deny"] = "allow",
        ro_binds: Sequence[str] = (),
        bwrap: str = "bwrap",
        logger: Logger | None = None,
    ) -> None:
        self._dir = os.path.realpath(dir) if dir is not None else None
        self._base_dir = os.path.realpath(base_dir or os.path.join(tempfile.gettempdir(), "boxwright-bwrap"))
        self._network = network
        self._ro_binds = tuple(os.path.realpath(p) for p in ro_binds)
        self._bwrap = bwrap
        self._logger = logger if logger is not None else StdlibLogger("boxwright.providers.bubblewrap")

    @property
    def probe(self) -> Probe:
        return probe(self._bwrap)

    @property
    def posture(self) -> Posture:
        """How commands are held here (uid inside, capabilities, user namespace, seccomp), and what is weaker."""
        return self.probe.posture

    def capabilities(self) -> Capabilities:
        return _capabilities(self.probe)

    def instance_identity(self) -> dict[str, object]:
        """What shapes a sandbox of this provider (its "image"): a change means a new sandbox."""
        return {"network": self._network, "roBinds": list(self._ro_binds)}

    def _handle(self, state: str, meta: _Meta, env: Mapping[str, str] | None) -> BubblewrapHandle:
        return BubblewrapHandle(
            state,
            meta,
            base_dir=self._base_dir,
            bwrap=shutil.which(self._bwrap) or self._bwrap,
            ro_binds=self._ro_binds,
            capabilities=self.capabilities(),
            logger=self._logger,
            env=env,
            found=self.probe,
        )

    async def create(self, input: CreateInput | None = None) -> BubblewrapHandle:
        input = input or CreateInput()
        if input.signal is not None:
            input.signal.throw_if_aborted()
        found = await asyncio.to_thread(probe, self._bwrap)
        if not found.available:
            raise ProviderUnavailableError(NAME, found.reason, INSTALL_HELP)
        network = self._network
        if input.network is not None:
            if input.network.mode == "deny" and input.network.allow_hosts:
                raise UnsupportedCapabilityError(
                    NAME, "network_policy", "bubblewrap can deny all egress, not allow a list of hosts"
                )
            network = input.network.mode
        if network == "deny" and not found.network_deny:
            raise UnsupportedCapabilityError(NAME, "network_policy", "bwrap --unshare-net does not work here")
        if self._dir is not None and os.path.exists(self._dir) and not os.path.isdir(self._dir):
            raise SandboxPathError(self._dir, self._dir, "is a file, not a directory; it cannot be the workspace root")
        state = os.path.join(self._base_dir, uuid.uuid4().hex)
        workspace = self._dir or os.path.join(state, "workspace")
        os.makedirs(workspace, exist_ok=True)
        owner = os.stat(workspace).st_uid
        if found.posture.user_namespace and owner != os.geteuid():
            # Only the caller's uid is mapped: another uid's files are nobody's inside, and no
            # capability overrides their modes any more. Said here, not as a puzzling EACCES later.
            self._logger.warn(
                f"the workspace {workspace} belongs to uid {owner}, not to uid {os.geteuid()} running bwrap: "
                "inside the sandbox it is nobody's, so commands write only where its modes let anyone write; "
                "chown it, or run boxwright as its owner",
                {"workspace": workspace, "owner": owner},
            )
        meta = _Meta(workspace=workspace, owned_workspace=self._dir is None, network=network)
        _write_meta(state, meta)
        # Off the loop: the first command would otherwise build /etc on it.
        await asyncio.to_thread(_ensure_state_files, state, found)
        return self._handle(state, meta, input.env)

    async def resume(self, input: ResumeInput) -> BubblewrapHandle | None:
        try:
            with open(os.path.join(input.id, "sandbox.json"), "rb") as f:
                meta = msgspec.json.decode(f.read(), type=_Meta)
        except FileNotFoundError:
            return None
        if not os.path.isdir(meta.workspace):
            return None
        return self._handle(input.id, meta, None)

    async def destroy(self, input: DestroyInput) -> None:
        try:
            with open(os.path.join(input.id, "sandbox.json"), "rb") as f:
                meta = msgspec.json.decode(f.read(), type=_Meta)
        except FileNotFoundError:
            return
        await _process_record(input.id, self._logger).kill_all()
        await asyncio.to_thread(_teardown, input.id, meta, self._logger)


def bubblewrap_sandbox(
    dir: str | os.PathLike[str] | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    network: Literal["allow", "deny"] = "allow",
    ro_binds: Sequence[str] = (),
    bwrap: str = "bwrap",
    logger: Logger | None = None,
) -> BubblewrapProvider:
    """A provider that isolates each command with ``bwrap``: the workspace is its only writable bind.

    ``ro_binds`` adds host paths visible read-only at the same place (an agent CLI
    installed outside ``/usr``, say); ``network="deny"`` unshares the network.
    """
    return BubblewrapProvider(dir, base_dir=base_dir, network=network, ro_binds=ro_binds, bwrap=bwrap, logger=logger)
