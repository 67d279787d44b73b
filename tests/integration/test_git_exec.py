"""Exec-backed git on the real providers, against a real repository made in the test."""

import asyncio
import subprocess

import pytest

from boxwright.errors import SandboxCommandError
from boxwright.git_exec import ExecGit
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import ExecResult, ProcessOptions
from boxwright.testkit.providers import integration_required


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def origin(tmp_path):
    repo = tmp_path / "origin"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    for i in range(3):
        (repo / "file.txt").write_text(f"v{i}\n")
        _git(repo, "add", "file.txt")
        _git(repo, "commit", "-q", "-m", f"c{i}")
    _git(repo, "branch", "feature")
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    return repo, first


def providers(tmp_path):
    found = [local_process_sandbox(base_dir=tmp_path / "lp")]
    if probe().available:
        found.append(bubblewrap_sandbox(base_dir=tmp_path / "bw", ro_binds=[str(tmp_path / "origin")]))
    elif integration_required():
        pytest.fail(f"bubblewrap required: {probe().reason}")
    return found


def test_clone_shallow_by_default_full_on_request_and_by_sha(tmp_path, origin):
    repo, first = origin

    async def main() -> None:
        for provider in providers(tmp_path):
            handle = await provider.create()
            try:
                url = f"file://{repo}"
                await handle.git.clone(url, "/workspace/shallow")
                count = await handle.process.exec("git rev-list --count HEAD", ProcessOptions(cwd="/workspace/shallow"))
                assert count.stdout.strip() == "1", provider.name
                await handle.git.clone(url, "/workspace/full", depth="full")
                count = await handle.process.exec("git rev-list --count HEAD", ProcessOptions(cwd="full"))
                assert count.stdout.strip() == "3"
                await handle.git.clone(url, "/workspace/nested/dir/feat", ref="feature")
                assert await handle.git.branch("/workspace/nested/dir/feat") == "feature"
                await handle.git.clone(url, "/workspace/at-sha", ref=first)
                assert (await handle.fs.read("/workspace/at-sha/file.txt")) == "v0\n"
                await handle.fs.write("/workspace/shallow/new.txt", "x")
                assert "?? new.txt" in await handle.git.status("/workspace/shallow")
            finally:
                await handle.destroy()

    asyncio.run(main())


def test_git_failures_raise_naming_the_operation(tmp_path, origin):
    repo, _ = origin

    async def main() -> None:
        handle = await local_process_sandbox(base_dir=tmp_path / "lp").create()
        try:
            with pytest.raises(SandboxCommandError) as err:
                await handle.git.clone(f"file://{repo}", "/workspace/x", ref="no-such-branch")
            assert err.value.op == "git clone" and err.value.exit_code != 0
            assert "no-such-branch" in str(err.value)
            with pytest.raises(SandboxCommandError, match="git clone failed"):
                await handle.git.clone(f"file://{tmp_path}/missing", "/workspace/y")
            with pytest.raises(ValueError, match="must not start with '-'"):
                await handle.git.clone("--upload-pack=touch /tmp/pwned", "/workspace/z")
            with pytest.raises(ValueError, match="depth"):
                await handle.git.clone(f"file://{repo}", "/workspace/z", depth=0)
        finally:
            await handle.destroy()

    asyncio.run(main())


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ProcessOptions | None]] = []

    async def exec(self, command: str, opts: ProcessOptions | None = None) -> ExecResult:
        self.calls.append((command, opts))
        return ExecResult("", "", 0)

    async def spawn(self, command: str, opts: ProcessOptions | None = None):  # pragma: no cover - unused
        raise NotImplementedError


def test_token_travels_in_the_child_env_never_in_the_command():
    recorder = _Recorder()
    git = ExecGit(recorder)
    token = "ghp_canary_0123456789"

    async def main() -> None:
        await git.clone("https://example.invalid/o/r.git", "/workspace/r", auth={"token": token})
        await git.push(auth={"token": token, "username": "bot"})

    asyncio.run(main())
    for command, opts in recorder.calls:
        assert token not in command
        assert opts is not None and opts.env is not None
        assert opts.env["GIT_ASKPASS_TOKEN"] == token
        assert opts.env["GIT_TERMINAL_PROMPT"] == "0"
        assert "credential.helper" in command
    assert recorder.calls[1][1].env["GIT_ASKPASS_USER"] == "bot"
