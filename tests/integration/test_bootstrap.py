"""Bootstrap on the real local-process and bubblewrap providers, with real git repositories.

Repositories are made here with ``git init`` and served over ``file://`` and a
``git daemon`` on 127.0.0.1. The handle wrapper below only observes (counts
spawns, records clone arguments and writes) and passes every call to the real
provider; the one exception is the A8 wrapper, which says ``writable_stdin=False``
and refuses ``spawn``, to make bootstrap take the exec-backed shell.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.errors import (
    AbortError,
    BootstrapShellError,
    GitSkillError,
    SecretResolutionError,
    SetupStepError,
    WorkspaceSourceError,
)
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import ProcessOptions
from boxwright.secrets import SecretRef, create_secrets
from boxwright.workspace import (
    bootstrap,
    define_workspace,
    file_skill,
    git_skill,
    git_source,
    local_source,
)
from tests.support.require import missing

COMMITS = 12


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _make_repo(path, files_per_commit):
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "t@example.com")
    _git(path, "config", "user.name", "t")
    for i, files in enumerate(files_per_commit):
        for name, content in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(content)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"c{i}")


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """``app`` (12 commits, branch ``feature``) and ``skills`` (3 commits), both as bare ``*.git`` repos."""
    root = tmp_path_factory.mktemp("repos")
    work = tmp_path_factory.mktemp("work")
    _make_repo(work / "app", [{"file.txt": f"v{i}\n"} for i in range(COMMITS)])
    _git(work / "app", "branch", "feature")
    _make_repo(work / "skills", [{"SKILL.md": f"# skill v{i}\n"} for i in range(3)])
    for name in ("app", "skills"):
        _git(root, "clone", "-q", "--bare", str(work / name), f"{name}.git")
    return root


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def git_daemon(repos):
    """``git://127.0.0.1:<port>`` serving ``repos``; started here and killed by its pid."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            f"--base-path={repos}",
            "--export-all",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(repos),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # `git daemon` forks the real git-daemon: its own group lets teardown stop both.
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"git daemon did not start (exit {proc.poll()})")
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def _bwrap_or_skip():
    found = probe()
    if found.available:
        return
    missing(f"bubblewrap unavailable: {found.reason}")


@pytest.fixture(params=["local-process", "bubblewrap"])
def provider(request, tmp_path, repos):
    if request.param == "bubblewrap":
        _bwrap_or_skip()
        return bubblewrap_sandbox(base_dir=tmp_path / "bw", ro_binds=[str(repos)])
    return local_process_sandbox(base_dir=tmp_path / "lp")


@pytest.fixture(params=["file", "git-daemon"])
def remote(request, repos):
    """Base URL of the served repositories, over either transport."""
    if request.param == "file":
        return f"file://{repos}"
    return request.getfixturevalue("git_daemon")


# -- observing wrapper -----------------------------------------------------------------------------


class _Process:
    def __init__(self, owner):
        self._owner = owner

    async def spawn(self, command, opts=None):
        if not self._owner.allow_spawn:
            raise AssertionError("this handle has no writable stdin; bootstrap must not spawn a shell")
        proc = await self._owner.inner.process.spawn(command, opts)
        self._owner.spawned.append(proc)
        return proc

    async def exec(self, command, opts=None):
        self._owner.execs.append(command)
        return await self._owner.inner.process.exec(command, opts)


class _Git:
    def __init__(self, owner):
        self._owner = owner

    async def clone(self, url, dir, **kw):
        self._owner.clones.append((url, dir, kw))
        return await self._owner.inner.git.clone(url, dir, **kw)

    def __getattr__(self, name):
        return getattr(self._owner.inner.git, name)


class _Fs:
    def __init__(self, owner):
        self._owner = owner

    async def write(self, path, data):
        self._owner.writes.append(path)
        return await self._owner.inner.fs.write(path, data)

    def __getattr__(self, name):
        return getattr(self._owner.inner.fs, name)


class Observed:
    """A real handle whose spawns, clones and writes are recorded on the way through."""

    def __init__(self, inner, *, writable_stdin=None):
        self.inner = inner
        self.allow_spawn = writable_stdin is not False
        caps = inner.capabilities
        self.capabilities = caps if writable_stdin is None else msgspec.structs.replace(caps, writable_stdin=False)
        self.spawned, self.execs, self.clones, self.writes = [], [], [], []
        self.process, self.git, self.fs = _Process(self), _Git(self), _Fs(self)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def _run(provider, workspace, *, prepare=None, check=None, after=None, writable_stdin=None, **kw):
    """Create a sandbox, bootstrap it, hand result and handle to ``check``; ``after`` runs even when
    bootstrap raised, before the sandbox is destroyed."""
    inner = await provider.create()
    handle = Observed(inner, writable_stdin=writable_stdin)
    try:
        if prepare is not None:
            await prepare(handle)
        result = await bootstrap(handle, workspace, **kw)
        if check is not None:
            await check(handle, result)
        return handle, result
    finally:
        try:
            if after is not None:
                await after(handle)
        finally:
            await inner.destroy()


async def _never_ran(handle):
    assert not await handle.fs.exists("/workspace/never-runs")
    for proc in handle.spawned:
        await asyncio.wait_for(proc.wait(), 5)  # the shell was disposed


async def _sh(handle, command, cwd="/workspace"):
    result = await handle.inner.process.exec(command, ProcessOptions(cwd=cwd))
    assert result.exit_code == 0, result
    return result.stdout.strip()


# -- A2, A3: source clone --------------------------------------------------------------------------


def test_clone_depth_default_int_and_full(provider, remote):
    url = f"{remote}/app.git"

    async def main():
        for depth, count in ((None, 1), (10, 10), ("full", COMMITS)):

            async def check(handle, result, depth=depth, count=count):
                assert await _sh(handle, "git rev-list --count HEAD") == str(count)
                assert await handle.fs.read("/workspace/file.txt") == f"v{COMMITS - 1}\n"
                assert result.package_manager is None and result.ran_setup == []

            handle, _ = await _run(provider, define_workspace(source=git_source(url, depth=depth)), check=check)
            [(seen_url, seen_dir, kw)] = handle.clones
            assert (seen_url, seen_dir) == (url, "/workspace")
            # A2: depth reaches the provider only when set.
            assert kw == ({"ref": None, "auth": None} if depth is None else {"ref": None, "auth": None, "depth": depth})

    asyncio.run(main())


def test_clone_at_ref_and_existing_git_dir_skips_the_clone(provider, remote):
    async def main():
        async def on_feature(handle, _):
            assert await _sh(handle, "git rev-parse --abbrev-ref HEAD") == "feature"

        await _run(provider, define_workspace(source=git_source(f"{remote}/app.git", ref="feature")), check=on_feature)

        async def prepare(handle):
            await handle.fs.mkdir("/workspace/.git")

        # A3: the URL is unreachable, so a clone attempt would fail loudly.
        ws = define_workspace(source=git_source(f"{remote}/missing.git"))
        handle, _ = await _run(provider, ws, prepare=prepare)
        assert handle.clones == []

    asyncio.run(main())


def test_bad_ref_and_bad_url_raise_naming_them(provider, remote):
    async def main():
        with pytest.raises(WorkspaceSourceError) as err:
            await _run(provider, define_workspace(source=git_source(f"{remote}/app.git", ref="no-such-branch")))
        assert "no-such-branch" in str(err.value) and err.value.ref == "no-such-branch"
        assert f"{remote}/app.git" in str(err.value)
        with pytest.raises(WorkspaceSourceError) as err:
            await _run(provider, define_workspace(source=git_source(f"{remote}/nope.git")))
        assert f"{remote}/nope.git" in str(err.value) and "failed with exit code" in str(err.value)

    asyncio.run(main())


def test_git_auth_without_workspace_secrets_is_a_clear_error(tmp_path, repos):
    ws = define_workspace(source=git_source(f"file://{repos}/app.git", auth=SecretRef("GH")))
    with pytest.raises(SecretResolutionError, match="no secrets"):
        asyncio.run(_run(local_process_sandbox(base_dir=tmp_path), ws))


# -- local source ----------------------------------------------------------------------------------


def test_local_source_is_copied_in_when_the_provider_left_the_root_empty(provider, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("a.txt")

    async def check(handle, _):
        assert await handle.fs.read("/workspace/a.txt") == "alpha\n"
        assert await handle.fs.read_bytes("/workspace/sub/b.bin") == bytes(range(256))
        assert (await handle.fs.lstat("/workspace/link")).type == "symlink"
        assert await _sh(handle, "cat link; ./run.sh") == "alpha\nran"
        assert (await handle.fs.lstat("/workspace/empty")).type == "dir"

    asyncio.run(_run(provider, define_workspace(source=local_source(src)), check=check))


def test_local_source_already_shown_by_the_provider_is_left_alone(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "mine.txt").write_text("x")
    handle, _ = asyncio.run(_run(local_process_sandbox(src), define_workspace(source=local_source(src))))
    assert handle.writes == [] and sorted(os.listdir(src)) == ["mine.txt"]
    with pytest.raises(WorkspaceSourceError, match="does not exist"):
        asyncio.run(
            _run(
                local_process_sandbox(base_dir=tmp_path / "lp"),
                define_workspace(source=local_source(tmp_path / "gone")),
            )
        )


# -- A5-A8, R10, R18, R19: setup ---------------------------------------------------------------------

BARRIER = (
    'touch "p{i}"; n=0; until [ -e p1 ] && [ -e p2 ] && [ -e p3 ]; do n=$((n+1)); '
    '[ "$n" -gt 250 ] && exit 9; sleep 0.02; done; echo "$FOO $(pwd)" > "out{i}"'
)


def test_parallel_group_runs_concurrently_with_the_forked_cwd_and_env(provider):
    commands = [BARRIER.format(i=i) for i in (1, 2, 3)]

    def setup(s):
        s.serial("mkdir -p sub && cd sub && export FOO=bar")
        s.parallel(commands)
        s.serial("echo after > after.txt")

    async def check(handle, result):
        # A5: each command waited for all three markers, so they ran at once; cwd and env were forked.
        for i in (1, 2, 3):
            foo, cwd = (await handle.fs.read(f"/workspace/sub/out{i}")).split()
            assert foo == "bar" and cwd.endswith("/sub")
        assert await handle.fs.exists("/workspace/sub/after.txt")
        assert result.ran_setup == ["mkdir -p sub && cd sub && export FOO=bar", *commands, "echo after > after.txt"]
        assert len(handle.spawned) == 1

    asyncio.run(_run(provider, define_workspace(setup=setup), check=check))


def test_failing_serial_step_stops_the_plan(provider):
    make_bad = (
        "mkdir -p bin && printf '#!/bin/sh\\necho broken output\\nexit 7\\n' > bin/bad-cmd && chmod +x bin/bad-cmd"
        ' && export PATH="$PWD/bin:$PATH"'
    )

    async def main():
        ws = define_workspace(setup=[make_bad, "bad-cmd", "touch never-runs"])
        seen = []

        async def after(handle):
            seen.append(len(handle.spawned))
            await _never_ran(handle)

        with pytest.raises(SetupStepError) as err:
            await _run(provider, ws, after=after)
        # A6
        assert str(err.value) == "setup step failed: bad-cmd (exit 7)\nbroken output"
        assert (err.value.command, err.value.exit_code) == ("bad-cmd", 7)
        assert seen == [1]

    asyncio.run(main())


def test_failing_parallel_command_reports_the_first_in_list_order(provider):
    ws = define_workspace(
        setup=lambda s: (
            s.parallel(["true", "echo out; echo err >&2; exit 5", "sleep 0.2; exit 6"]),
            s.serial("touch never-runs"),
        )
    )
    with pytest.raises(SetupStepError) as err:
        asyncio.run(_run(provider, ws, after=_never_ran))
    assert err.value.exit_code == 5 and err.value.command == "echo out; echo err >&2; exit 5"
    assert str(err.value).endswith("(exit 5)\nout\n\nerr")


def test_syntax_error_fails_the_step_and_keeps_the_shell(provider):
    ws = define_workspace(setup=["echo 'unterminated", "touch never-runs"])
    with pytest.raises(SetupStepError) as err:
        asyncio.run(_run(provider, ws, after=_never_ran))
    assert err.value.exit_code == 2 and "nterminated" in err.value.output


def test_secrets_reach_the_env_but_never_the_error_text(provider):
    secrets = create_secrets({"TOK": "hunter2-do-not-print"})
    ws = define_workspace(secrets=secrets, setup=['test "$TOK" = hunter2-do-not-print', "echo token=$TOK; (exit 3)"])
    with pytest.raises(SetupStepError) as err:
        asyncio.run(_run(provider, ws))
    assert err.value.exit_code == 3
    assert "hunter2" not in str(err.value) and "token=***" in str(err.value)


@pytest.mark.parametrize("step", ["exec >&-", "exit 4"])
def test_shell_output_closing_before_the_sentinel_raises_at_once(provider, step):
    ws = define_workspace(setup=["echo before", step, "touch never-runs"])
    if step == "exec >&-" and provider.name == "bubblewrap":
        # bwrap's own process holds the pipe open and the shell lives on: only the deadline can end it.
        with pytest.raises(BootstrapShellError, match=r"no answer within 1s"):
            asyncio.run(_run(provider, ws, after=_never_ran, step_timeout=1))
        return
    start = time.monotonic()
    with pytest.raises(BootstrapShellError) as err:
        asyncio.run(_run(provider, ws, after=_never_ran, step_timeout=60))
    assert time.monotonic() - start < 10
    assert err.value.command == step and "before the step finished" in str(err.value)


def test_silent_step_hits_the_deadline_and_the_shell_is_killed(provider):
    marker = f"31.{os.getpid()}"

    async def main():
        holder = {}

        async def prepare(handle):
            holder["handle"] = handle

        start = time.monotonic()
        with pytest.raises(BootstrapShellError, match=r"no answer within 0.5s"):
            await _run(provider, define_workspace(setup=[f"sleep {marker}"]), prepare=prepare, step_timeout=0.5)
        assert time.monotonic() - start < 8
        await asyncio.wait_for(holder["handle"].spawned[0].wait(), 5)
        assert not _processes_with(f"sleep\x00{marker}")

    asyncio.run(main())


def _processes_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_abort_stops_a_running_step(provider):
    async def main():
        controller = AbortController()
        asyncio.get_running_loop().call_later(0.3, controller.abort, "boxwright:cancel-requested")
        start = time.monotonic()
        with pytest.raises(AbortError, match="cancel-requested"):
            await _run(provider, define_workspace(setup=["sleep 20"]), signal=controller.signal)
        assert time.monotonic() - start < 8

    asyncio.run(main())


def test_exec_backed_shell_threads_cwd_and_env(provider):
    def setup(s):
        s.serial("mkdir -p d && cd d && export X=1 Y='a b' && export ML='l1\nl2'")
        s.serial('test "$X" = 1 && test "$Y" = "a b" && pwd > where.txt')
        s.parallel(['printf %s "$Y" > p1.txt', 'printf %s "$ML" > p2.txt'])
        s.serial("cd .. && export X=2")
        s.serial('[ "$X" = 2 ] && [ -d d ]')
        s.serial("echo last words; sh -c 'exit 7'")
        s.serial("touch never-runs")

    async def main():
        inner = await provider.create()
        handle = Observed(inner, writable_stdin=False)
        try:
            with pytest.raises(SetupStepError) as err:
                await bootstrap(handle, define_workspace(setup=setup))
            # A8: the step's own exit code; cwd and exports carried between separate execs.
            assert err.value.exit_code == 7 and err.value.output == "last words"
            assert handle.spawned == []
            assert (await handle.fs.read("/workspace/d/where.txt")).strip().endswith("/d")
            assert await handle.fs.read("/workspace/d/p1.txt") == "a b"
            assert await handle.fs.read("/workspace/d/p2.txt") == "l1\nl2"
            assert not await handle.fs.exists("/workspace/never-runs")
        finally:
            await inner.destroy()

    asyncio.run(main())


def test_exec_backed_shell_reports_an_exit_inside_a_step(provider):
    ws = define_workspace(setup=["cd .", "exit 5"])
    with pytest.raises(SetupStepError) as err:
        asyncio.run(_run(provider, ws, writable_stdin=False))
    assert err.value.exit_code == 5 and err.value.command == "exit 5"


# -- A9: git skills --------------------------------------------------------------------------------


def test_git_skills_clone_shallow_into_their_dirs(provider, remote):
    secrets = create_secrets({"GH": "skill-token"})
    ws = define_workspace(
        secrets=secrets,
        skills=[
            git_skill(f"{remote}/skills.git"),
            git_skill(f"{remote}/skills.git", secret=secrets.GH, into="/workspace/custom/sk"),
        ],
    )

    async def check(handle, _):
        default = "/workspace/.boxwright-skills/skills"
        assert await _sh(handle, "git rev-list --count HEAD", cwd=default) == "1"
        assert await handle.fs.read(f"{default}/SKILL.md") == "# skill v2\n"
        assert await handle.fs.exists("/workspace/custom/sk/SKILL.md")
        if provider.name == "local-process":
            # Root remapped: the virtual path landed under the sandbox's host directory.
            assert os.path.isfile(os.path.join(handle.workspace_root, ".boxwright-skills/skills/SKILL.md"))

    handle, _ = asyncio.run(_run(provider, ws, check=check))
    assert handle.clones == [
        (f"{remote}/skills.git", "/workspace/.boxwright-skills/skills", {"auth": None, "depth": 1}),
        (f"{remote}/skills.git", "/workspace/custom/sk", {"auth": {"token": "skill-token"}, "depth": 1}),
    ]


def test_git_skill_secret_without_workspace_secrets_clones_without_auth(tmp_path, repos):
    ws = define_workspace(skills=[git_skill(f"file://{repos}/skills.git", secret=SecretRef("GH"))])
    handle, _ = asyncio.run(_run(local_process_sandbox(base_dir=tmp_path), ws))
    assert handle.clones[0][2] == {"auth": None, "depth": 1}


def test_unfetchable_git_skill_raises_naming_it(provider, remote):
    ws = define_workspace(skills=[git_skill(f"{remote}/no-such-skills.git")])
    with pytest.raises(GitSkillError) as err:
        asyncio.run(_run(provider, ws))
    assert err.value.repo == f"{remote}/no-such-skills.git" and "no-such-skills" in str(err.value)
    assert err.value.dir == "/workspace/.boxwright-skills/no-such-skills"


# -- A10, A11, R14: AGENTS.md and file skills --------------------------------------------------------


def test_agents_md_is_written_once_linked_and_other_file_skills_land(provider):
    ws = define_workspace(
        instructions="Use pnpm.\n",
        scripts={"test": "pnpm test"},
        skills=[file_skill("AGENTS.md", "ignored"), file_skill(".hints.md", "hint"), file_skill("docs/n.md", "n")],
    )
    expected = "Use pnpm.\n\n## Workspace scripts\n\n- test → pnpm test"

    async def check(handle, _):
        assert await handle.fs.read("/workspace/AGENTS.md") == expected
        for name in ("CLAUDE.md", "GEMINI.md"):
            assert (await handle.fs.lstat(f"/workspace/{name}")).type == "symlink"
            assert await handle.fs.read(f"/workspace/{name}") == expected
        assert await handle.fs.read("/workspace/.hints.md") == "hint"
        assert await handle.fs.read("/workspace/docs/n.md") == "n"

    handle, _ = asyncio.run(_run(provider, ws, check=check))
    assert handle.writes.count("/workspace/AGENTS.md") == 1


def test_failed_link_falls_back_to_a_copy(provider):
    async def prepare(handle):
        await handle.inner.fs.write("/workspace/CLAUDE.md", "the repo's own file")

    async def check(handle, _):
        claude = await handle.fs.lstat("/workspace/CLAUDE.md")
        assert claude.type == "file" and await handle.fs.read("/workspace/CLAUDE.md") == "Be kind."
        assert (await handle.fs.lstat("/workspace/GEMINI.md")).type == "symlink"

    asyncio.run(_run(provider, define_workspace(instructions="Be kind."), prepare=prepare, check=check))


def test_file_skill_named_like_a_link_does_not_overwrite_agents_md(tmp_path):
    ws = define_workspace(instructions="main", skills=[file_skill("CLAUDE.md", "claude only")])

    async def check(handle, _):
        assert await handle.fs.read("/workspace/AGENTS.md") == "main"
        assert await handle.fs.read("/workspace/CLAUDE.md") == "claude only"

    asyncio.run(_run(local_process_sandbox(base_dir=tmp_path), ws, check=check))


def test_no_instructions_no_agents_md(tmp_path):
    async def check(handle, _):
        assert not await handle.fs.exists("/workspace/AGENTS.md")
        assert not await handle.fs.exists("/workspace/CLAUDE.md")

    asyncio.run(_run(local_process_sandbox(base_dir=tmp_path), define_workspace(), check=check))


# -- A12: package manager ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lockfiles", "declared", "expected"),
    [
        (["package-lock.json", "yarn.lock"], "auto", "yarn"),
        (["yarn.lock", "pnpm-lock.yaml", "bun.lockb"], "auto", "pnpm"),
        (["package-lock.json", "bun.lockb"], "auto", "bun"),
        (["package-lock.json"], "auto", "npm"),
        ([], "auto", None),
        (["pnpm-lock.yaml"], "bun", "bun"),
    ],
)
def test_package_manager_lockfile_order_and_explicit_override(tmp_path, lockfiles, declared, expected):
    async def prepare(handle):
        for name in lockfiles:
            await handle.inner.fs.write(f"/workspace/{name}", "")

    ws = define_workspace(package_manager=declared)
    _, result = asyncio.run(_run(local_process_sandbox(base_dir=tmp_path), ws, prepare=prepare))
    assert result.package_manager == expected
