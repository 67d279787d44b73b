"""Host-side ``handle.fs`` against a sandboxed process that swaps symlinks under it (issue 9, point 2).

A process inside the sandbox flips ``f`` between a link to a file inside and a link to a host file,
and ``d`` between a link to a directory inside and a link to a host directory, as fast as it can.
Meanwhile the host runs each fs operation a bounded 4,000 times on paths through ``f`` and ``d``.
A check-then-open implementation reads the host file, or writes, creates, removes or moves host
files, tens of times in 4,000; a descriptor walk does so never.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from boxwright.errors import SandboxPathError
from boxwright.sandbox import ProcessOptions
from tests.support.host_sandboxes import HOST_PROVIDERS, host_sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ITERATIONS = 4_000
SECRET = b"HOST-SECRET-" + b"x" * 20  # a length no inside file has, so lstat would show it too
INSIDE = b"inside"

# Flips f and d between "inside" and "outside" targets with atomic renames until /workspace/stop exists.
# Outside is the host path both absolute and relative to the workspace (../../..., which reaches the
# host's file even from bubblewrap, where the absolute path is not visible inside).
SWAPPER = r"""
import os, sys, time
abs_file, abs_dir, rel_file, rel_dir = sys.argv[1:5]
deadline = time.monotonic() + 500
n = 0
while time.monotonic() < deadline:
    for name, inside, outside in (("f", "real_f", (abs_file, rel_file)), ("d", "real_d", (abs_dir, rel_dir))):
        for target in (inside, outside[0], inside, outside[1]):
            tmp = f".swap-{name}"
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(target, tmp)
            os.rename(tmp, name)
    n += 1
    if n % 200 == 0 and os.path.exists("stop"):
        break
print(n, flush=True)
"""


class Host:
    """The host-side files the sandbox must never reach, and the counters of times it did."""

    def __init__(self, base: Path) -> None:
        self.file = base / "secret.txt"
        self.dir = base / "secret-dir"
        self.dir.mkdir()
        self.file.write_bytes(SECRET)
        (self.dir / "victim").write_bytes(SECRET)
        (self.dir / "host-secret-entry").write_bytes(SECRET)

    def breaches(self) -> list[str]:
        """What changed outside since the last call; restores it for the next iteration."""
        found = []
        if self.file.read_bytes() != SECRET:
            found.append("secret.txt overwritten")
            self.file.write_bytes(SECRET)
        for name in ("victim", "host-secret-entry"):
            if not (self.dir / name).exists():
                found.append(f"secret-dir/{name} removed or moved")
                (self.dir / name).write_bytes(SECRET)
        for extra in sorted(set(os.listdir(self.dir)) - {"victim", "host-secret-entry"}):
            found.append(f"secret-dir/{extra} created")
            path = self.dir / extra
            path.rmdir() if path.is_dir() else path.unlink()
        return found


def _leaks(result: Any) -> bool:
    """Did the operation hand back anything of the host's?"""
    if isinstance(result, bytes | str):
        return SECRET in (result.encode() if isinstance(result, str) else result)
    if isinstance(result, list):
        return any(entry.name == "host-secret-entry" for entry in result)
    size = getattr(result, "size", None)
    return size == len(SECRET)


def _operations(fs: Any, ws: Path) -> dict[str, Callable[[int], Awaitable[Any]]]:
    def refill() -> None:
        # real_d is a plain directory nobody swaps: the host may fill it by host path.
        (ws / "real_d" / "victim").write_bytes(INSIDE)

    async def remove(i: int) -> None:
        refill()
        await fs.remove("d/victim")

    async def rename(i: int) -> None:
        refill()
        if i % 2:
            await fs.rename("d/victim", "renamed")
        else:
            await fs.rename("real_f", "d/moved-in")
            os.rename(ws / "real_d" / "moved-in", ws / "real_f") if (ws / "real_d" / "moved-in").exists() else None

    return {
        "read": lambda i: fs.read_bytes("f" if i % 2 else "d/victim"),
        "write": lambda i: fs.write("f" if i % 2 else "d/written.txt", b"written"),
        "list": lambda i: fs.list("d"),
        "mkdir": lambda i: fs.mkdir("d/made"),
        "remove": remove,
        "rename": rename,
        "lstat": lambda i: fs.lstat("d/victim"),
        "exists": lambda i: fs.exists("d/host-secret-entry"),
    }


@pytest.mark.parametrize("kind", HOST_PROVIDERS)
def test_symlink_swaps_inside_never_reach_host_files(kind: str, tmp_path: Path) -> None:
    host = Host(tmp_path)
    fds = len(os.listdir("/proc/self/fd"))
    swaps, report, breaches = asyncio.run(_race(kind, tmp_path, host))
    # Every refused or failed walk closed what it opened (a leak would be one per refusal: thousands).
    assert len(os.listdir("/proc/self/fd")) < fds + 20, "descriptors leaked"
    print(kind, "swapper rounds:", swaps, report)
    assert int(swaps or 0) > 1000, f"the swapper barely ran ({swaps!r}): the race was not exercised"
    assert all(c["ok"] > 0 for c in report.values()), f"an operation never succeeded: {report}"
    assert report["read"]["refused"] > 0, f"reads never met the outside link: the race was not live: {report}"
    escapes = {
        what: (c["leaked"], c["outside"], breaches[what][:2])
        for what, c in report.items()
        if c["leaked"] or c["outside"]
    }
    # (results carrying host data, host files changed, examples) per operation
    assert escapes == {}, f"host files reached in {ITERATIONS} tries per operation: {report}"


async def _race(kind: str, tmp_path: Path, host: Host) -> tuple[str, dict[str, dict[str, int]], dict[str, list[str]]]:
    async with host_sandbox(kind, tmp_path / "sandboxes") as handle:
        ws = Path(handle.workspace_root)
        (ws / "real_f").write_bytes(INSIDE)
        (ws / "real_d").mkdir()
        (ws / "real_d" / "victim").write_bytes(INSIDE)
        os.symlink("real_f", ws / "f")
        os.symlink("real_d", ws / "d")
        swapper = await handle.process.spawn(
            f"exec python3 -c '{SWAPPER}' {host.file} {host.dir} "
            f"{os.path.relpath(host.file, ws)} {os.path.relpath(host.dir, ws)}",
            ProcessOptions(cwd="/workspace"),
        )
        report: dict[str, dict[str, int]] = {}
        breaches: dict[str, list[str]] = {}
        try:
            await asyncio.sleep(0.3)  # let it start swapping
            for what, op in _operations(handle.fs, ws).items():
                counts = {"ok": 0, "refused": 0, "error": 0, "leaked": 0}
                started = time.monotonic()
                for i in range(ITERATIONS):
                    try:
                        result = await op(i)
                    except SandboxPathError:
                        counts["refused"] += 1
                    except OSError:
                        counts["error"] += 1  # the path changed under us: a clean failure is fine
                    else:
                        counts["ok"] += 1
                        counts["leaked"] += _leaks(result)
                    breaches.setdefault(what, []).extend(host.breaches())
                counts["outside"] = len(breaches.get(what, []))
                counts["ms"] = int((time.monotonic() - started) * 1000)
                report[what] = counts
        finally:
            (ws / "stop").write_bytes(b"")
            try:
                await asyncio.wait_for(swapper.wait(), 30)
            finally:
                await swapper.kill()
        swaps = "".join([line async for line in swapper.stdout]).strip()
    return swaps, report, breaches
