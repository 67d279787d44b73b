"""``..`` and symlink escapes through host-side ``handle.fs`` are refused (issue 9, point 2).

The links are made by a process inside the sandbox, as an agent would make them; the host file
they aim at is one the test owns, checked untouched after every attempt. Links that stay inside
keep working, and ``lstat``/``remove``/``rename`` act on a link itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from boxwright.errors import SandboxPathError
from tests.support.host_sandboxes import HOST_PROVIDERS, host_sandbox

pytestmark = pytest.mark.integration

SECRET = b"HOST-SECRET"


def _host_files(tmp_path: Path) -> tuple[Path, Path]:
    """The host's own files, in a directory of their own beside the sandboxes' (``_snapshot`` reads it)."""
    base = tmp_path / "host"
    base.mkdir()
    secret_dir = base / "host-dir"
    secret_dir.mkdir()
    (secret_dir / "hosts").write_bytes(SECRET)
    (base / "host.txt").write_bytes(SECRET)
    return base / "host.txt", secret_dir


def _snapshot(tmp_path: Path) -> dict[str, bytes]:
    base = tmp_path / "host"
    return {str(p.relative_to(base)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(base.rglob("*"))}


async def _ok(handle: Any, command: str) -> None:
    result = await handle.process.exec(command)
    assert result.exit_code == 0, f"{command!r}: {result.stderr}"


def _escapes(fs: Any) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    """Every operation, through ``..`` and through each escaping link the sandbox made."""

    async def watch(path: str) -> None:
        async with contextlib.aclosing(fs.watch(path, asyncio.Event())) as changes:
            await anext(changes)

    ops: list[tuple[str, Callable[[], Awaitable[object]]]] = []
    for via in ("../../../../../..", "abs-out", "rel-out", "chain", "host-abs", "host-rel"):
        ops += [
            (f"read {via}/hosts", lambda v=via: fs.read(f"{v}/hosts")),
            (f"read_bytes {via}/hosts", lambda v=via: fs.read_bytes(f"/workspace/{v}/hosts")),
            (f"write {via}/new", lambda v=via: fs.write(f"{v}/new", "x")),
            (f"write {via}/hosts", lambda v=via: fs.write(f"{v}/hosts", "x")),
            (f"list {via}", lambda v=via: fs.list(f"/workspace/{v}")),
            (f"mkdir {via}/made", lambda v=via: fs.mkdir(f"{v}/made")),
            (f"remove {via}/hosts", lambda v=via: fs.remove(f"{v}/hosts")),
            (f"rename {via}/hosts out", lambda v=via: fs.rename(f"{v}/hosts", "stolen")),
            (f"rename in {via}/planted", lambda v=via: fs.rename("real.txt", f"{v}/planted")),
            (f"exists {via}/hosts", lambda v=via: fs.exists(f"{v}/hosts")),
            (f"lstat {via}/hosts", lambda v=via: fs.lstat(f"{v}/hosts")),
            (f"watch {via}", lambda v=via: watch(f"/workspace/{v}")),
        ]
    for link in ("host-file-abs", "host-file-rel"):
        ops += [
            (f"read {link}", lambda v=link: fs.read(v)),
            (f"write {link}", lambda v=link: fs.write(v, "x")),
            (f"exists {link}", lambda v=link: fs.exists(v)),
        ]
    return ops


@pytest.mark.parametrize("kind", HOST_PROVIDERS)
def test_dotdot_and_symlink_escapes_are_refused(kind: str, tmp_path: Path) -> None:
    host_file, host_dir = _host_files(tmp_path)
    before = _snapshot(tmp_path)

    async def main() -> list[str]:
        async with host_sandbox(kind, tmp_path / "sandboxes") as handle:
            ws = Path(handle.workspace_root)
            up = os.path.relpath(host_dir, ws)
            await _ok(
                handle,
                "printf inside > real.txt && mkdir real-dir"
                " && ln -s /etc abs-out && ln -s ../../../../../../../../etc rel-out"
                " && ln -s real-dir/../.. chain"
                f" && ln -s {host_dir} host-abs && ln -s {up} host-rel"
                f" && ln -s {host_file} host-file-abs && ln -s {os.path.relpath(host_file, ws)} host-file-rel",
            )
            wrong = []
            for what, op in _escapes(handle.fs):
                try:
                    result = await asyncio.wait_for(op(), 10)
                except SandboxPathError as exc:
                    if "workspace" not in str(exc) and handle.workspace_root not in str(exc):
                        wrong.append(f"{what}: unclear message {exc}")
                except Exception as exc:
                    wrong.append(f"{what}: {exc!r} instead of SandboxPathError")
                else:
                    wrong.append(f"{what}: allowed, returned {result!r}")
                if _snapshot(tmp_path) != before:
                    wrong.append(f"{what}: changed host files")
                    return wrong
            return wrong

    wrong = asyncio.run(main())
    assert wrong == []
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", HOST_PROVIDERS)
def test_links_inside_work_and_link_operations_act_on_the_link(kind: str, tmp_path: Path) -> None:
    host_file, _ = _host_files(tmp_path)
    before = _snapshot(tmp_path)

    async def main() -> None:
        async with host_sandbox(kind, tmp_path / "sandboxes") as handle:
            fs = handle.fs
            ws = Path(handle.workspace_root)
            await _ok(
                handle,
                "mkdir -p real-dir/sub && printf inside > real-dir/sub/f.txt"
                " && ln -s real-dir dlink && ln -s dlink/sub/f.txt flink && ln -s ../../real-dir real-dir/sub/up"
                ' && ln -s "$PWD/real-dir/sub/f.txt" abslink && ln -s /workspace/real-dir wslink'
                f" && ln -s {host_file} host-file && mkfifo pipe && ln -s loop loop",
            )
            assert await fs.read("flink") == "inside"
            assert await fs.read("abslink") == "inside"  # $PWD is the host path on local-process
            assert await fs.read("wslink/sub/f.txt") == "inside"  # a link made as the sandbox sees it
            assert await fs.read("dlink/sub/up/sub/f.txt") == "inside"
            await fs.write("flink", "through a link")
            assert (ws / "real-dir" / "sub" / "f.txt").read_text() == "through a link"
            assert [e.name for e in await fs.list("dlink/sub")] == ["f.txt", "up"]
            await fs.mkdir("dlink/new/deeper")
            assert (ws / "real-dir" / "new" / "deeper").is_dir()
            assert await fs.exists("dlink/sub/f.txt")
            # 60 levels: making parents is not a link hop, so it is not bounded like one.
            deep = "/".join(f"d{i}" for i in range(60))
            await fs.write(f"{deep}/leaf.txt", "deep")
            assert await fs.read(f"{deep}/leaf.txt") == "deep"

            # The link itself, never its target: a host file behind a link is reported as a link, moved
            # and removed as a link, and stays where it is.
            found = await fs.lstat("host-file")
            assert found is not None and found.type == "symlink"
            await fs.rename("host-file", "moved-link")
            assert os.readlink(ws / "moved-link") == str(host_file)
            await fs.remove("moved-link")
            assert not os.path.lexists(ws / "moved-link")
            await fs.remove("dlink")
            assert (ws / "real-dir" / "sub" / "f.txt").exists(), "remove of a link to a dir removed the dir"

            # A fifo is not read from the host (it would block a worker thread for ever), a loop is a loop.
            with pytest.raises(OSError, match="not a regular file"):
                await asyncio.wait_for(fs.read("pipe"), 10)
            with pytest.raises(OSError) as err:
                await fs.read("loop")
            assert err.value.errno == errno.ELOOP
            with pytest.raises(SandboxPathError, match="mount root"):
                await fs.remove("/workspace")
            await fs.remove("real-dir")
            assert not (ws / "real-dir").exists()

    asyncio.run(main())
    assert _snapshot(tmp_path) == before
    assert host_file.read_bytes() == SECRET


async def _watched(handle: Any, path: str, poke: Callable[[], None], expect: str) -> list[str]:
    """What ``fs.watch(path)`` reports while ``poke`` changes files, until ``expect`` shows (or 5 s)."""
    stop = asyncio.Event()
    seen: list[str] = []

    async def collect() -> None:
        async with contextlib.aclosing(handle.fs.watch(path, stop)) as batches:
            async for batch in batches:
                seen.extend(c.path for c in batch)

    task = asyncio.ensure_future(collect())
    await asyncio.sleep(0.5)
    poke()
    for _ in range(100):
        if expect in seen:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    stop.set()
    await task
    return seen


def test_a_native_watch_does_not_report_changes_behind_a_link_out(tmp_path: Path) -> None:
    _, host_dir = _host_files(tmp_path)

    async def main() -> tuple[list[str], list[str]]:
        async with host_sandbox("local-process", tmp_path / "sandboxes") as handle:
            ws = Path(handle.workspace_root)
            os.symlink(host_dir, ws / "out")
            (ws / "sub").mkdir()
            os.symlink("sub", ws / "in")

            def poke() -> None:
                (host_dir / "changed-on-host").write_bytes(b"x")
                (ws / "inside.txt").write_bytes(b"x")
                (ws / "sub" / "below.txt").write_bytes(b"x")

            whole = await _watched(handle, "/workspace", poke, "sub/below.txt")
            # A watch rooted through a link that stays inside still reports what is under it.
            through = await _watched(
                handle, "/workspace/in", lambda: (ws / "sub" / "again.txt").write_bytes(b"x"), "again.txt"
            )
            return whole, through

    whole, through = asyncio.run(main())
    assert "inside.txt" in whole and "sub/below.txt" in whole
    assert not any("changed-on-host" in p for p in whole), whole
    assert "again.txt" in through
