"""A sandbox file system backed by host directories, confined to them without races.

Virtual paths are mapped through mounts (``/workspace`` -> the workspace root,
and whatever else a provider binds). A path is checked lexically first, before
``..`` is folded (``/workspace/../../etc/hosts`` is refused, not read as
``/etc/hosts``). Then every operation walks it one component at a time from a
descriptor of the mount root, each step ``openat(O_NOFOLLOW)`` on the
directory the previous step opened, and works on the descriptor it ends on.

Why not ``realpath`` and then ``open``: a process inside the sandbox can swap a
checked file or directory for a symlink to a host path between the two calls
(measured: tens of host reads and writes outside in 4,000 tries). Here a
symlink is never followed by the kernel: the walk reads it (``readlinkat``)
and resolves its target itself, lexically against the directories it has
really opened, refusing a target that leaves every mount, so a link inside
that points inside keeps working and one swapped in at any instant is refused.
``lstat``, ``remove`` and ``rename`` act on a link itself, never its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import stat as st
from collections.abc import AsyncIterator, Sequence
from typing import Literal, NamedTuple

from ..errors import SandboxPathError
from ..sandbox import WORKSPACE, FileChange, FsEntry, FsStat

_MISSING = (errno.ENOENT, errno.ENOTDIR)
# The kernel's own limit on links in one lookup; also bounds retries when a path keeps changing.
MAX_HOPS = 40

_SAFE = os.O_CLOEXEC | os.O_NOFOLLOW
# Walking needs only search permission on a directory, as a kernel lookup would: O_PATH.
_STEP = os.O_PATH | os.O_DIRECTORY | _SAFE
_ROOT = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC  # the mount root is the host's, not the sandbox's
_LIST = os.O_RDONLY | os.O_DIRECTORY | _SAFE
# O_NONBLOCK: a fifo swapped in must not hang a host thread; only regular files are read or written.
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _SAFE
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY | _SAFE


class Located(NamedTuple):
    """A sandbox path after the lexical check: the mount's host root and the components under it."""

    path: str  # as the caller wrote it, for messages
    root: str
    parts: tuple[str, ...]  # never empty strings, ``.`` or ``..``


class PathMap:
    """Maps sandbox paths to host paths inside a fixed set of mounts.

    ``mounts`` pairs a virtual prefix with a host directory; a relative path is
    under ``/workspace``. An absolute path under no mount goes to ``fallback``
    (a host dir it is joined under, as local-process does with ``/a`` ->
    ``root/a``) or, with ``fallback=None``, is refused.
    """

    def __init__(self, mounts: Sequence[tuple[str, str]], fallback: str | None) -> None:
        # Longest prefix first, so /workspace/tmp beats /workspace.
        self._mounts = sorted(((v.rstrip("/") or "/", h) for v, h in mounts), key=lambda m: -len(m[0]))
        self._fallback = fallback

    def locate(self, path: str) -> Located:
        """The mount and components of ``path``; refuses NUL bytes, ``..`` out of the mount, unmapped paths."""
        if "\x00" in path:
            raise SandboxPathError(path, self._describe(), "contains a NUL byte; it is outside")
        virtual = path if path.startswith("/") else f"{WORKSPACE}/{path}"
        for prefix, root in self._mounts:
            if virtual == prefix or virtual.startswith(prefix + "/"):
                return _lexical(path, root, virtual[len(prefix) :])
        if self._fallback is None:
            raise SandboxPathError(path, self._describe(), "is outside every directory the sandbox exposes:")
        return _lexical(path, self._fallback, virtual)

    def host(self, path: str, *, follow: bool = True) -> str:
        """The host path of ``path``, checked with ``realpath``.

        Only for handing a directory to a process (a cwd), which resolves it again itself: host-side
        file access goes through ``HostFs``, whose descriptor walk has no check-then-use window.
        """
        at = self.locate(path)
        joined = posixpath.join(at.root, *at.parts)
        real_root = os.path.realpath(at.root)
        checked = joined if follow or not at.parts else posixpath.dirname(joined)
        if not _within(os.path.realpath(checked), real_root):
            raise SandboxPathError(path, at.root, "leads through a symlink out of")
        return joined

    def through_link(self, at: Located, index: int, target: str) -> Located:
        """``at`` with the symlink at ``parts[index]`` replaced by its ``target``, or a refusal.

        A relative target is folded against the directories before the link (which the walk
        really opened, so this is what the kernel would do). An absolute one may name a mount
        by its host directory (a link made on the host, or by local-process) or be under
        ``/workspace`` (a link made inside bubblewrap); anything else leaves the sandbox. Other
        sandbox mounts (bubblewrap's /tmp) are not reached by absolute links: ``/tmp/...`` is as
        likely a host path written on the host as the sandbox's own, and refusing is the safe reading.
        """
        rest = at.parts[index + 1 :]
        if not target:
            raise FileNotFoundError(errno.ENOENT, "a symlink on the way has an empty target", at.path)
        if not target.startswith("/"):
            return Located(at.path, at.root, _fold(at, at.root, (*at.parts[:index], *target.split("/"), *rest)))
        absolute = posixpath.normpath(target)
        bases = [(root, root) for _, root in self._mounts] + [m for m in self._mounts if m[0] == WORKSPACE]
        for base, root in bases:
            if _within(absolute, base):
                under = absolute[len(base.rstrip("/")) :].split("/")
                return Located(at.path, root, _fold(at, root, (*under, *rest)))
        raise SandboxPathError(at.path, at.root, "leads through a symlink out of")

    def _describe(self) -> str:
        return ", ".join(v for v, _ in self._mounts)


def _lexical(original: str, root: str, rest: str) -> Located:
    joined = posixpath.normpath(posixpath.join(root, rest.lstrip("/"))) if rest.strip("/") else root
    if not _within(joined, root):
        raise SandboxPathError(original, root)
    under = joined[len(root.rstrip("/")) :]
    return Located(original, root, tuple(p for p in under.split("/") if p))


def _fold(at: Located, root: str, parts: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for part in parts:
        if part == "..":
            if not out:
                raise SandboxPathError(at.path, root, "leads through a symlink out of")
            out.pop()
        elif part and part != ".":
            out.append(part)
    return tuple(out)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class _Walk:
    """One operation's walk of one path; every descriptor it returns is the caller's to close."""

    def __init__(self, paths: PathMap, at: Located) -> None:
        self._paths = paths
        self.at = at
        self._path = at.path
        self._hops = 0

    def parent(self, *, create: bool = False) -> tuple[int, str]:
        """An O_PATH descriptor of the directory holding the last component, and that component's
        name; for a mount root itself the name is ``""`` and the descriptor is the root's.
        ``create`` makes missing directories on the way (``mkdir -p``)."""
        while True:
            found = self._descend(create)
            if found is not None:
                return found
            # A link was met and the walk aimed through it, or the path changed: again from a root.

    def _descend(self, create: bool) -> tuple[int, str] | None:
        parts = self.at.parts
        fd = os.open(self.at.root, _ROOT)
        try:
            for index, name in enumerate(parts[:-1]):
                made = False
                while True:
                    try:
                        child = os.open(name, _STEP, dir_fd=fd)
                        break
                    except OSError as exc:
                        if exc.errno == errno.ENOENT and create:
                            if made:
                                self._spend()  # made it and it is gone again: someone inside is racing us
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(name, 0o777, dir_fd=fd)
                            made = True
                            continue
                        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise self._error(exc) from None
                        self._refused(fd, index, exc)
                        os.close(fd)
                        return None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1] if parts else ""

    def _refused(self, parent: int, index: int, exc: OSError) -> None:
        """An O_NOFOLLOW open of ``parts[index]`` failed with ELOOP or ENOTDIR: it is a symlink
        (aim the walk through it) or was one an instant ago (look again), else raise."""
        try:
            target = os.readlink(self.at.parts[index], dir_fd=parent)
        except OSError as again:
            if again.errno not in (errno.EINVAL, errno.ENOENT):
                raise self._error(again) from None
            if exc.errno != errno.ELOOP:
                raise self._error(exc) from None
            self._spend()
            return
        self._spend()
        self.at = self._paths.through_link(self.at, index, target)

    def _spend(self) -> None:
        self._hops += 1
        if self._hops > MAX_HOPS:
            raise OSError(errno.ELOOP, "too many symbolic links, or the path kept changing", self._path)

    def _error(self, exc: OSError) -> OSError:
        # The caller's path, not the host's: messages name what the user asked for.
        return OSError(exc.errno, exc.strerror, self._path)

    def open(self, flags: int, *, create: bool = False) -> int:
        """Opens the path itself (``flags`` carry O_NOFOLLOW), following links that stay inside."""
        while True:
            parent, name = self.parent(create=create)
            try:
                return os.open(name or ".", flags, 0o666, dir_fd=parent)
            except OSError as exc:
                if not name or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise self._error(exc) from None
                self._refused(parent, len(self.at.parts) - 1, exc)
            finally:
                os.close(parent)

    def lstat(self) -> os.stat_result:
        parent, name = self.parent()
        try:
            return os.stat(name or ".", dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            os.close(parent)

    def stat(self) -> os.stat_result:
        """Like ``os.stat``: the last link followed too, while it stays inside."""
        while True:
            found = self.lstat()
            if not st.S_ISLNK(found.st_mode):
                return found
            parent, _ = self.parent()
            try:
                self._refused(parent, len(self.at.parts) - 1, OSError(errno.ELOOP, "a symlink"))
            finally:
                os.close(parent)


def _stat_of(s: os.stat_result) -> FsStat:
    if st.S_ISREG(s.st_mode):
        return FsStat("file", s.st_mode, s.st_size)
    if st.S_ISDIR(s.st_mode):
        return FsStat("dir", s.st_mode)
    if st.S_ISLNK(s.st_mode):
        return FsStat("symlink", s.st_mode)
    return FsStat("other", s.st_mode)


_CHANGE_TYPES: dict[int, Literal["create", "change", "delete"]] = {1: "create", 2: "change", 3: "delete"}
IGNORED_DIRS = frozenset({".git", "node_modules"})


class HostFs:
    """``SandboxFs`` over host directories; blocking calls run in a worker thread.

    ``watch`` is native (inotify through ``watchfiles``): the sandbox's files are host files.
    """

    def __init__(self, paths: PathMap) -> None:
        self._paths = paths

    def _walk(self, path: str) -> _Walk:
        return _Walk(self._paths, self._paths.locate(path))

    async def watch(self, path: str, stop: asyncio.Event) -> AsyncIterator[list[FileChange]]:
        from watchfiles import awatch

        walk = self._walk(path)
        fd = walk.open(_LIST)
        watched = walk.at  # after the links on the way: where the events' paths are resolved from
        try:
            # The watch starts from the directory the walk opened, not from a path looked up again.
            root = f"/proc/self/fd/{fd}"

            def keep(_change: object, changed: str) -> bool:
                rel = os.path.relpath(changed, root)
                return not any(part in IGNORED_DIRS for part in rel.split(os.sep))

            async for batch in awatch(root, stop_event=stop, watch_filter=keep, debounce=100, step=20, recursive=True):
                changes: list[FileChange] = []
                for change, changed in sorted(batch, key=lambda c: c[1]):
                    rel = _event_path(self._paths, watched, os.path.relpath(changed, root))
                    if int(change) in _CHANGE_TYPES and rel is not None:
                        found = FileChange(_CHANGE_TYPES[int(change)], rel)
                        if found not in changes:  # one file seen under two names (a link to its dir)
                            changes.append(found)
                if changes:
                    yield changes
        finally:
            os.close(fd)

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8")

    async def read_bytes(self, path: str) -> bytes:
        walk = self._walk(path)
        return await asyncio.to_thread(_read, walk)

    async def write(self, path: str, data: str | bytes) -> None:
        walk = self._walk(path)
        await asyncio.to_thread(_write, walk, data.encode() if isinstance(data, str) else data)

    async def list(self, path: str) -> list[FsEntry]:
        fd = self._walk(path).open(_LIST)
        base = path.rstrip("/") or "/"
        try:
            with os.scandir(fd) as entries:
                found = [
                    FsEntry(
                        e.name,
                        f"{base}/{e.name}" if base != "/" else f"/{e.name}",
                        "dir" if e.is_dir(follow_symlinks=False) else "file",
                    )
                    for e in entries
                ]
        finally:
            os.close(fd)
        return sorted(found, key=lambda e: e.name)

    async def mkdir(self, path: str) -> None:
        walk = self._walk(path)
        parent, name = walk.parent(create=True)
        try:
            if name:
                os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass
        finally:
            os.close(parent)
        with contextlib.suppress(FileNotFoundError):  # removed already by someone inside: fine
            if not st.S_ISDIR(walk.stat().st_mode):
                raise FileExistsError(errno.EEXIST, "exists and is not a directory", path)

    async def remove(self, path: str) -> None:
        walk = self._walk(path)
        await asyncio.to_thread(_remove, walk)

    async def rename(self, src: str, dst: str) -> None:
        source = self._walk(src)
        src_dir, src_name = source.parent()
        try:
            dst_dir, dst_name = self._walk(dst).parent(create=True)
            try:
                if not src_name or not dst_name:
                    raise SandboxPathError(src if not src_name else dst, source.at.root, "is a mount root, under")
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, src, None, dst) from None
            finally:
                os.close(dst_dir)
        finally:
            os.close(src_dir)

    async def exists(self, path: str) -> bool:
        try:
            self._walk(path).stat()
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise
        return True

    async def lstat(self, path: str) -> FsStat | None:
        try:
            return _stat_of(self._walk(path).lstat())
        except OSError as exc:
            if exc.errno in _MISSING:
                return None
            raise


def _event_path(paths: PathMap, watched: Located, rel: str) -> str | None:
    """Where a watch event happened, relative to the watched directory, or None to drop it.

    inotify's recursive watch follows symlinks into directories, and names an event by the last
    path it watched the directory under: a link inside is resolved to the real path, a link out
    (what changes behind it is not the sandbox's) and directories are dropped.
    """
    if rel == "." or rel == ".." or rel.startswith("../"):
        return None
    walk = _Walk(paths, Located(rel, watched.root, (*watched.parts, *rel.split("/"))))
    try:
        parent, name = walk.parent()
    except SandboxPathError:
        return None
    except OSError as exc:
        return rel if exc.errno == errno.ENOENT else None  # its directory is gone too: a delete
    try:
        if st.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            return None
    except OSError:
        pass  # gone already: a delete
    finally:
        os.close(parent)
    at, depth = walk.at, len(watched.parts)
    if at.root != watched.root or at.parts[:depth] != watched.parts:
        return None  # through a link inside the sandbox, but out of the watched directory
    return "/".join(at.parts[depth:])


def _read(walk: _Walk) -> bytes:
    fd = walk.open(_READ)
    with open(fd, "rb", closefd=True) as f:
        _regular(os.fstat(fd), walk)
        return f.read()


def _write(walk: _Walk, data: bytes) -> None:
    fd = walk.open(_WRITE, create=True)
    with open(fd, "wb", closefd=True) as f:
        _regular(os.fstat(fd), walk)
        f.write(data)


def _regular(found: os.stat_result, walk: _Walk) -> None:
    if st.S_ISDIR(found.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), walk.at.path)
    if not st.S_ISREG(found.st_mode):
        # A fifo, socket or device: its "contents" are a channel to whoever holds the other end.
        raise OSError(errno.EINVAL, "not a regular file; only regular files are read and written", walk.at.path)


def _remove(walk: _Walk) -> None:
    parent, name = walk.parent()
    try:
        if not name:
            raise SandboxPathError(walk.at.path, walk.at.root, "is a mount root; it cannot be removed from")
        _remove_at(parent, name)
    finally:
        os.close(parent)


def _remove_at(parent: int, name: str) -> None:
    """``rm -rf name`` in ``parent``, by descriptors: never through a symlink, never opening a fifo."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except FileNotFoundError:
        return
    except IsADirectoryError:
        pass
    try:
        fd = os.open(name, _LIST, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        # Swapped for a file or a link since the unlink: unlink that (the link itself).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        for child in names:
            _remove_at(fd, child)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent)
