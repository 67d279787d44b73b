"""Workspace file events: native (inotify) on host-directory providers, a find poll elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.watcher import FileEvent, WorkspaceWatcher
from tests.support.require import missing


def _provider(kind: str, tmp_path: Path) -> object:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path)
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    return bubblewrap_sandbox(base_dir=tmp_path)


@pytest.mark.parametrize("native", [True, False], ids=["native", "poll"])
@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_create_change_delete_are_reported_and_ignored_dirs_are_not(kind: str, native: bool, tmp_path: Path) -> None:
    async def main() -> tuple[str, list[FileEvent]]:
        handle = await _provider(kind, tmp_path).create()  # type: ignore[attr-defined]
        try:
            await handle.fs.write("/workspace/keep.txt", "1")
            await handle.fs.write("/workspace/gone.txt", "1")
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append, interval=0.1, native=native).start()
            steps = [
                "mkdir -p src .git node_modules/x && echo new > src/new.py",
                "echo more >> keep.txt",
                "rm gone.txt",
                "echo ignored > .git/HEAD && echo ignored > node_modules/x/i.js",
            ]
            for step in steps:
                await handle.process.exec(step)
                await asyncio.sleep(0.3)
            await watcher.stop()
            return watcher.mode, seen
        finally:
            await handle.destroy()

    mode, seen = asyncio.run(main())
    assert mode == ("native" if native else "poll")
    kinds = {(e.type, e.path) for e in seen}
    assert ("create", "src/new.py") in kinds
    assert ("change", "keep.txt") in kinds
    assert ("delete", "gone.txt") in kinds
    assert not any(e.path.startswith((".git", "node_modules")) for e in seen)


def test_a_write_right_before_stop_is_not_lost(tmp_path: Path) -> None:
    async def main() -> list[FileEvent]:
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append).start()
            await handle.process.exec("echo late > late.txt")
            await watcher.stop()
            return seen
        finally:
            await handle.destroy()

    seen = asyncio.run(main())
    assert [(e.type, e.path) for e in seen].count(("create", "late.txt")) == 1


def test_a_native_modify_that_changes_nothing_is_not_a_second_event(tmp_path: Path) -> None:
    """One write can reach the native watch as a create and, a debounce window later, a modify; the
    watcher reports a change only if the file differs (mtime, size) from when it last reported it.
    A metadata-only touch that keeps the mtime stands in for that second batch here."""

    async def main() -> list[tuple[str, str]]:
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append).start()
            assert watcher.mode == "native"
            for step in ("echo one > a.txt", "touch -r a.txt a.txt", "echo two >> a.txt"):
                await handle.process.exec(step)
                await asyncio.sleep(0.4)  # past the native watch's debounce: each step its own batch
            await watcher.stop()
            return [(e.type, e.path) for e in seen]
        finally:
            await handle.destroy()

    assert asyncio.run(main()) == [("create", "a.txt"), ("change", "a.txt")]


def test_a_held_watcher_reports_what_the_log_lacks_then_what_it_held(tmp_path: Path) -> None:
    """A successor's watcher: ``release`` reports the gap between the first driver's pre-run listing
    and now that the log's file events do not cover, then the live events it held meanwhile."""

    async def main() -> tuple[list[FileEvent], list[tuple[str, str]]]:
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            await handle.process.exec("echo 1 > old.txt && echo 1 > kept.txt")
            first = await WorkspaceWatcher(handle, lambda _e: None).start()
            baseline = first.baseline  # what the first driver stores beside the journal
            await first.stop()
            # While no driver lived: one file the log has (its create was logged), one it lacks.
            await handle.process.exec("echo 1 > logged.txt && echo 1 > new.txt && rm old.txt")
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append, hold=True).start()
            watcher.resume_from(baseline, {"logged.txt": "create"})
            await handle.process.exec("echo 1 > live.txt")
            await asyncio.sleep(0.4)
            before = list(seen)
            watcher.release()
            await watcher.stop()
            return before, [(e.type, e.path) for e in seen]
        finally:
            await handle.destroy()

    before, seen = asyncio.run(main())
    assert before == [], "a held watcher reports nothing before its release"
    assert seen == [("create", "new.txt"), ("delete", "old.txt"), ("create", "live.txt")]
