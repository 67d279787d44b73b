"""boxwright's own files in a git workspace stay out of `git status` and of the run's diff.

A real bootstrap (clone, git skill) and a real projection for Claude Code (marker, skill link) on real
providers; then what git itself says, and what the run's diff command reports.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from boxwright.agent import DIFF_COMMAND
from boxwright.definition import EnsureContext, define_sandbox
from boxwright.git_exclude import hide_from_git
from boxwright.projection import PROJECTION_MARKER_PREFIX, project_workspace, projection_for
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import ProcessOptions
from boxwright.workspace import SKILLS_DIR, define_workspace, git_skill, git_source
from tests.support.require import missing

STATUS = "git status --porcelain --untracked-files=all"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    _git(path, "add", ".")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
    return path


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_projection_and_skill_clones_are_invisible_to_git_and_to_the_diff(kind: str, tmp_path: Path) -> None:
    if kind == "bubblewrap" and not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    origin = _repo(tmp_path / "origin", {"README.md": "hello\n"})
    skill = _repo(tmp_path / "greeter", {"greet/SKILL.md": "---\nname: greet\ndescription: greets\n---\nHi.\n"})
    workspace = define_workspace(source=git_source(f"file://{origin}"), skills=[git_skill(str(skill))])
    base = tmp_path / "sandboxes"
    provider = local_process_sandbox(base_dir=base) if kind == "local-process" else bubblewrap_sandbox(base_dir=base)
    sandbox = define_sandbox("exclude", provider, workspace)

    async def main() -> tuple[str, str, str, str]:
        ensured = await sandbox.ensure(EnsureContext(thread_id="t", run_id="r"))
        handle = ensured.handle
        try:
            projection = projection_for(workspace, sandbox.workspace_hash())
            await project_workspace(handle, projection, "claude-code")
            await project_workspace(handle, projection, "claude-code")  # a second run adds nothing twice
            listing = (await handle.process.exec(f"ls -a . .claude/skills {SKILLS_DIR}")).stdout
            clean = (await handle.process.exec(STATUS)).stdout
            diff_clean = (await handle.process.exec(DIFF_COMMAND)).stdout
            await handle.process.exec("echo work > WORK.md", ProcessOptions())
            status = (await handle.process.exec(STATUS)).stdout
            exclude = (await handle.process.exec("cat .git/info/exclude")).stdout
        finally:
            await handle.destroy()
        return listing, clean + diff_clean, status, exclude

    listing, clean, status, exclude = asyncio.run(main())
    # boxwright did write them: the test is about git not seeing them.
    assert PROJECTION_MARKER_PREFIX in listing and "greet" in listing and "greeter" in listing, listing
    assert clean == "", clean
    assert status == "?? WORK.md\n", status
    lines = exclude.splitlines()
    assert lines.count(f"/{PROJECTION_MARKER_PREFIX}*") == 1 and lines.count(f"/{SKILLS_DIR}/") == 1, exclude
    assert "/.claude/skills/greet" in lines, exclude


def test_a_linked_worktree_gets_the_patterns_in_its_own_git_dir(tmp_path: Path) -> None:
    main_repo = _repo(tmp_path / "main", {"README.md": "hello\n"})
    worktree = tmp_path / "feature"
    _git(main_repo, "worktree", "add", "-q", "-b", "feature", str(worktree))
    assert (worktree / ".git").is_file()
    provider = local_process_sandbox(dir=worktree, base_dir=tmp_path / "sandboxes")

    async def main() -> str:
        handle = await provider.create()
        await handle.fs.write(f"/workspace/{PROJECTION_MARKER_PREFIX}abc", "")
        await hide_from_git(handle, "/workspace", [f"/{PROJECTION_MARKER_PREFIX}*"])
        await hide_from_git(handle, "/workspace", [f"/{PROJECTION_MARKER_PREFIX}*"])
        return (await handle.process.exec(STATUS)).stdout

    assert asyncio.run(main()) == ""
    exclude = Path(_git(worktree, "rev-parse", "--path-format=absolute", "--git-path", "info/exclude").strip())
    assert exclude.read_text().splitlines().count(f"/{PROJECTION_MARKER_PREFIX}*") == 1
