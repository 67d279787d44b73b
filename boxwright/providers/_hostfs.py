"""A sandbox file system backed by host directories, confined to them.

Virtual paths are mapped through mounts (``/workspace`` -> the workspace root,
and whatever else a provider binds). Every path is checked twice: lexically,
before ``..`` is folded (``/workspace/../../etc/hosts`` is refused, not read as
``/etc/hosts``), and after symlinks are resolved (a link out of the root is
refused). ``lstat``, ``remove`` and ``rename`` act on a link itself, so only
its parent must resolve inside.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import shutil
import stat as st
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from ..errors import SandboxPathError
from ..sandbox import WORKSPACE, FileChange, FsEntry, FsStat

_MISSING = (errno.ENOENT, errno.ENOTDIR)


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

    def host(self, path: str, *, follow: bool = True) -> str:
        if "\x00" in path:
            raise SandboxPathError(path, self._describe(), "contains a NUL byte; it is outside")
        virtual = path if path.startswith("/") else f"{WORKSPACE}/{path}"
        for prefix, root in self._mounts:
            if virtual == prefix or virtual.startswith(prefix + "/"):
                return self._confine(path, root, virtual[len(prefix) :].lstrip("/"), follow)
        if self._fallback is None:
            raise SandboxPathError(path, self._describe(), "is outside every directory the sandbox exposes:")
        return self._confine(path, self._fallback, virtual.lstrip("/"), follow)

    def _describe(self) -> str:
        return ", ".join(v for v, _ in self._mounts)

    def _confine(self, original: str, root: str, rest: str, follow: bool) -> str:
        joined = posixpath.normpath(posixpath.join(root, rest)) if rest else root
        if not _within(joined, root):
            raise SandboxPathError(original, root)
        real_root = os.path.realpath(root)
        checked = joined if follow else posixpath.dirname(joined) if joined != root else root
        if not _within(os.path.realpath(checked), real_root):
            raise SandboxPathError(original, root, "leads through a symlink out of")
        return joined


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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

    async def watch(self, path: str, stop: asyncio.Event) -> AsyncIterator[list[FileChange]]:
        from watchfiles import awatch

        root = self._paths.host(path)

        def keep(_change: object, changed: str) -> bool:
            rel = os.path.relpath(changed, root)
            return not any(part in IGNORED_DIRS for part in rel.split(os.sep))

        async for batch in awatch(root, stop_event=stop, watch_filter=keep, debounce=100, step=20, recursive=True):
            changes = [
                FileChange(_CHANGE_TYPES[int(change)], os.path.relpath(changed, root))
                for change, changed in sorted(batch, key=lambda c: c[1])
                if int(change) in _CHANGE_TYPES and not os.path.isdir(changed)
            ]
            if changes:
                yield changes

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8")

    async def read_bytes(self, path: str) -> bytes:
        host = self._paths.host(path)
        return await asyncio.to_thread(_read, host)

    async def write(self, path: str, data: str | bytes) -> None:
        host = self._paths.host(path)
        await asyncio.to_thread(_write, host, data.encode() if isinstance(data, str) else data)

    async def list(self, path: str) -> list[FsEntry]:
        host = self._paths.host(path)
        base = path.rstrip("/") or "/"
        with os.scandir(host) as entries:
            found = [
                FsEntry(
                    e.name,
                    f"{base}/{e.name}" if base != "/" else f"/{e.name}",
                    "dir" if e.is_dir(follow_symlinks=False) else "file",
                )
                for e in entries
            ]
        return sorted(found, key=lambda e: e.name)

    async def mkdir(self, path: str) -> None:
        os.makedirs(self._paths.host(path), exist_ok=True)

    async def remove(self, path: str) -> None:
        host = self._paths.host(path, follow=False)
        await asyncio.to_thread(_remove, host)

    async def rename(self, src: str, dst: str) -> None:
        host_src = self._paths.host(src, follow=False)
        host_dst = self._paths.host(dst, follow=False)
        os.makedirs(os.path.dirname(host_dst), exist_ok=True)
        os.rename(host_src, host_dst)

    async def exists(self, path: str) -> bool:
        host = self._paths.host(path)
        try:
            os.stat(host)
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise
        return True

    async def lstat(self, path: str) -> FsStat | None:
        host = self._paths.host(path, follow=False)
        try:
            return _stat_of(os.lstat(host))
        except OSError as exc:
            if exc.errno in _MISSING:
                return None
            raise


def _read(host: str) -> bytes:
    with open(host, "rb") as f:
        return f.read()


def _write(host: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(host), exist_ok=True)
    with open(host, "wb") as f:
        f.write(data)


def _remove(host: str) -> None:
    try:
        if os.path.isdir(host) and not os.path.islink(host):
            shutil.rmtree(host)
        else:
            os.unlink(host)
    except FileNotFoundError:
        pass
