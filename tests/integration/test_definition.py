"""define_sandbox, the instance key and ensure(), on the real local-process provider (A28-A32, A42-A47)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.definition import (
    CANCEL_REASON,
    EnsureContext,
    Lifecycle,
    SandboxHooks,
    Tenant,
    define_sandbox,
    with_sandbox,
)
from boxwright.errors import SandboxCommandError, SetupStepError, UnsupportedCapabilityError
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.secrets import create_secrets
from boxwright.stores.memory import MemoryInstanceStore, MemoryLockStore
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database
from boxwright.workspace import define_workspace, git_skill, git_source
from tests.support.providers import ResumingLocalProvider, SnapshottingProvider, SpyProvider
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    _git(origin, "config", "user.email", "t@example.com")
    _git(origin, "config", "user.name", "t")
    (origin / "README.md").write_text("hello\n")
    _git(origin, "add", ".")
    _git(origin, "commit", "-q", "-m", "init")
    return origin


def _ctx(thread: str = "t1", run: str = "r1", **kw: object) -> EnsureContext:
    # A store of its own per call unless given: the process-wide default would carry records between tests.
    kw.setdefault("store", MemoryInstanceStore())
    return EnsureContext(thread_id=thread, run_id=run, **kw)  # type: ignore[arg-type]


def _dirs(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


# -- A28: the key -------------------------------------------------------------------------------


def test_a28_key_is_stable_and_changes_with_what_identifies_the_sandbox(tmp_path: Path) -> None:
    provider = local_process_sandbox(base_dir=tmp_path)
    ws = define_workspace(source=git_source("https://example.invalid/r.git", ref="main"), setup=["make"])
    base = define_sandbox("agent", provider, ws)
    key = base.instance_key(_ctx())
    assert key == define_sandbox("agent", provider, ws).instance_key(_ctx())
    assert len(key) == 16 and int(key, 16) >= 0

    def key_of(definition: object = base, **ctx: object) -> str:
        return definition.instance_key(_ctx(**ctx))  # type: ignore[attr-defined]

    changed = {
        "thread": key_of(thread="t2"),
        "id": key_of(define_sandbox("other", provider, ws)),
        "provider": key_of(define_sandbox("agent", bubblewrap_sandbox(base_dir=tmp_path), ws)),
        "provider config (image)": key_of(define_sandbox("agent", bubblewrap_sandbox(network="deny"), ws)),
        "tenant": key_of(tenant=Tenant(user_id="u1")),
        "ref": key_of(
            define_sandbox(
                "agent",
                provider,
                msgspec.structs.replace(ws, source=git_source("https://example.invalid/r.git", ref="dev")),
            )
        ),
        "setup": key_of(define_sandbox("agent", provider, msgspec.structs.replace(ws, setup=["make", "test"]))),
        "scripts": key_of(define_sandbox("agent", provider, msgspec.structs.replace(ws, scripts={"t": "make t"}))),
        "callback body": key_of(
            define_sandbox(
                "agent",
                provider,
                msgspec.structs.replace(ws, setup=lambda b: (b.serial("make"), b.parallel(["lint", "test"]))),
            )
        ),
    }
    for what, other in changed.items():
        assert other != key, f"changing the {what} must give a new key"
    assert len(set(changed.values())) == len(changed)
    # Only a secret's value changes: same key. reuse="none" keys on the run too.
    with_secret = define_workspace(source=ws.source, setup=["make"], secrets=create_secrets(TOKEN="one"))
    rotated = define_workspace(source=ws.source, setup=["make"], secrets=create_secrets(TOKEN="two"))
    assert define_sandbox("agent", provider, with_secret).instance_key(_ctx()) == define_sandbox(
        "agent", provider, rotated
    ).instance_key(_ctx())
    per_run = define_sandbox("agent", provider, ws, lifecycle=Lifecycle(reuse="none"))
    assert per_run.instance_key(_ctx(run="r1")) != per_run.instance_key(_ctx(run="r2"))


# -- A29-A32: ensure ------------------------------------------------------------------------------


def _real_provider(kind: str, base: Path, binds: list[str]) -> object:
    if kind == "local-process":
        return local_process_sandbox(base_dir=base)
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    return bubblewrap_sandbox(base_dir=base, ro_binds=binds)


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
def test_a29_first_ensure_creates_and_bootstraps_second_resumes(kind: str, tmp_path: Path, repo: Path) -> None:
    spy = SpyProvider(_real_provider(kind, tmp_path / "sb", [str(repo)]))
    ws = define_workspace(source=git_source(f"file://{repo}"), setup=["echo ran >> setup.log"])
    definition = define_sandbox("agent", spy, ws)
    store, locks = MemoryInstanceStore(), MemoryLockStore()

    async def main() -> None:
        first = await definition.ensure(_ctx(run="r1", store=store, locks=locks))
        assert first.outcome == "created"
        create_input = spy.calls[0][1]
        assert create_input.id == first.key == definition.instance_key(_ctx())
        assert (await first.handle.fs.read("/workspace/README.md")) == "hello\n"
        record = await store.get(first.key)
        assert record is not None and record.latest_run_id == "r1" and record.provider_sandbox_id == first.handle.id
        second = await definition.ensure(_ctx(run="r2", store=store, locks=locks))
        if kind == "local-process":
            # No resume by id (decision 5): created again in the same directory, its clone kept,
            # bootstrapped again.
            assert second.outcome == "created" and second.handle.id == first.handle.id
            assert (await second.handle.fs.read("/workspace/setup.log")) == "ran\nran\n"
            assert (spy.count("create"), spy.count("resume")) == (2, 0)
        else:
            assert second.outcome == "resumed" and second.handle.id == first.handle.id
            assert (await second.handle.fs.read("/workspace/setup.log")) == "ran\n"  # setup ran once
            assert (spy.count("create"), spy.count("resume")) == (1, 1)
        record2 = await store.get(first.key)
        assert record2 is not None and record2.latest_run_id == "r2" and record2.updated_at >= record.updated_at
        await definition.destroy(_ctx(store=store))
        assert await store.get(first.key) is None

    asyncio.run(main())


def test_a30_gone_sandbox_restores_from_snapshot_else_recreates_under_the_same_key(tmp_path: Path) -> None:
    secrets = create_secrets(API_TOKEN="tok-a30-restore-canary")
    ws = define_workspace(setup=["echo built > artifact.txt"], secrets=secrets)

    async def main() -> None:
        # With snapshots: after-setup snapshot, then a restore when the sandbox is gone.
        spy = SpyProvider(SnapshottingProvider(str(tmp_path / "snap")))
        definition = define_sandbox("agent", spy, ws)
        store = MemoryInstanceStore()
        first = await definition.ensure(_ctx(run="r1", store=store))
        record = await store.get(first.key)
        assert record is not None and record.latest_snapshot_id is not None
        assert os.path.isfile(os.path.join(record.latest_snapshot_id, "artifact.txt"))
        await first.handle.destroy()  # the live sandbox is gone, the snapshot stays
        second = await definition.ensure(_ctx(run="r2", store=store))
        assert second.outcome == "native-restored" and second.key == first.key
        assert (await second.handle.fs.read("artifact.txt")) == "built\n"
        assert (await second.handle.process.exec('printf %s "$API_TOKEN"')).stdout == "tok-a30-restore-canary"
        after = await store.get(first.key)
        assert after is not None and after.provider_sandbox_id == second.handle.id != first.handle.id
        assert spy.count("restore") == 1 and spy.count("create") == 1

        # Without snapshots: re-create (and bootstrap again) under the same key.
        plain = SpyProvider(ResumingLocalProvider(base_dir=tmp_path / "plain"))
        definition = define_sandbox("agent", plain, ws)
        one = await definition.ensure(_ctx(run="r1", store=store))
        await one.handle.destroy()
        two = await definition.ensure(_ctx(run="r2", store=store))
        assert two.outcome == "created" and two.key == one.key and plain.count("resume") == 1
        assert (await two.handle.fs.read("artifact.txt")) == "built\n"
        assert plain.count("create") == 2

    asyncio.run(main())


def test_a31_reuse_none_creates_each_run_and_concurrent_ensures_create_once(tmp_path: Path) -> None:
    async def main() -> None:
        spy = SpyProvider(local_process_sandbox(base_dir=tmp_path / "none"))
        per_run = define_sandbox("agent", spy, lifecycle=Lifecycle(reuse="none"))
        store = MemoryInstanceStore()
        a = await per_run.ensure(_ctx(run="r1", store=store))
        b = await per_run.ensure(_ctx(run="r2", store=store))
        assert a.handle.id != b.handle.id and spy.count("create") == 2 and spy.count("resume") == 0

        spy2 = SpyProvider(ResumingLocalProvider(base_dir=tmp_path / "same"))
        shared = define_sandbox("agent", spy2, define_workspace(setup=["sleep 0.2"]))
        results = await asyncio.gather(*(shared.ensure(_ctx(run=f"r{i}", store=store)) for i in range(4)))
        assert len({r.handle.id for r in results}) == 1
        assert spy2.count("create") == 1 and spy2.count("resume") == 3

    asyncio.run(main())


def test_a32_stale_record_recreates_and_secrets_are_reapplied_only_when_present(tmp_path: Path) -> None:
    async def main() -> None:
        spy = SpyProvider(local_process_sandbox(base_dir=tmp_path / "stale"))
        definition = define_sandbox("agent", spy, lifecycle=Lifecycle(snapshot_max_age="1h"))
        store = MemoryInstanceStore()
        first = await definition.ensure(_ctx(store=store))
        record = await store.get(first.key)
        assert record is not None
        await store.upsert(msgspec.structs.replace(record, updated_at=record.updated_at - 3_600_001))
        second = await definition.ensure(_ctx(run="r2", store=store))
        assert second.outcome == "created" and spy.count("resume") == 0 and spy.count("create") == 2

        secrets = create_secrets(SVC_TOKEN="tok-a32-first")
        with_secrets = define_sandbox(
            "agent", ResumingLocalProvider(base_dir=tmp_path / "sec"), define_workspace(secrets=secrets)
        )
        created = await with_secrets.ensure(_ctx(store=store))
        created.handle.env.set({"SVC_TOKEN": "clobbered"})
        resumed = await with_secrets.ensure(_ctx(run="r2", store=store))
        assert resumed.outcome == "resumed"
        assert (await resumed.handle.process.exec('printf %s "$SVC_TOKEN"')).stdout == "tok-a32-first"
        without = define_sandbox("agent", ResumingLocalProvider(base_dir=tmp_path / "nosec"))
        plain = await without.ensure(_ctx(store=store))
        again = await without.ensure(_ctx(run="r2", store=store))
        assert again.outcome == "resumed" and again.handle.env.get() == plain.handle.env.get() == {}

    asyncio.run(main())


def test_snapshot_max_age_that_does_not_parse_is_ignored_with_a_warning(tmp_path: Path, caplog) -> None:
    definition = define_sandbox(
        "a", ResumingLocalProvider(base_dir=tmp_path), lifecycle=Lifecycle(snapshot_max_age="soon")
    )

    async def main() -> None:
        store = MemoryInstanceStore()
        await definition.ensure(_ctx(store=store))
        assert (await definition.ensure(_ctx(run="r2", store=store))).outcome == "resumed"

    with caplog.at_level(logging.WARNING, logger="boxwright.definition"):
        asyncio.run(main())
    assert "snapshot_max_age 'soon'" in caplog.text


# -- two processes, one SQLite file: one sandbox ----------------------------------------------------

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from boxwright.definition import EnsureContext, define_sandbox
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database
    from boxwright.workspace import define_workspace
    from tests.support.providers import ResumingLocalProvider

    async def main():
        async with open_database({db!r}) as db:
            sandbox = define_sandbox("agent", ResumingLocalProvider(base_dir={base!r}),
                                     define_workspace(setup=["sleep 0.5", "echo once >> made.txt"]))
            ctx = EnsureContext(thread_id="t-shared", run_id=sys.argv[1],
                                store=SqliteInstanceStore(db), locks=SqliteLockStore(db))
            result = await sandbox.ensure(ctx)
            print(result.outcome, result.handle.id, flush=True)

    asyncio.run(main())
    """
)


def test_two_processes_ensuring_one_thread_over_one_sqlite_file_create_exactly_one_sandbox(tmp_path: Path) -> None:
    base = tmp_path / "sandboxes"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT), db=str(tmp_path / "b.db"), base=str(base)))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), f"run-{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lines = sorted(out.strip() for out, _ in outs)
    outcomes = sorted(line.split()[0] for line in lines)
    assert outcomes == ["created", "resumed"], lines
    assert len({line.split()[1] for line in lines}) == 1
    assert len(_dirs(base)) == 1
    assert (base / _dirs(base)[0] / "made.txt").read_text() == "once\n"


# -- bad input: clear errors, nothing half-created left -------------------------------------------


@pytest.mark.parametrize("kind", ["local-process", "bubblewrap"])
@pytest.mark.parametrize(
    "case",
    ["bad-url", "missing-ref", "failing-setup", "unfetchable-skill"],
)
def test_bad_input_is_a_clear_error_and_leaves_no_sandbox(kind: str, tmp_path: Path, repo: Path, case: str) -> None:
    workspaces = {
        "bad-url": (define_workspace(source=git_source(f"file://{tmp_path}/no-such-repo")), "git clone"),
        "missing-ref": (define_workspace(source=git_source(f"file://{repo}", ref="no-such-ref")), "no-such-ref"),
        "failing-setup": (define_workspace(setup=["echo ok", "sh -c 'exit 9'", "touch never"]), "exit 9"),
        "unfetchable-skill": (
            define_workspace(skills=[git_skill(f"file://{tmp_path}/missing-skill.git")]),
            "missing-skill",
        ),
    }
    ws, expected = workspaces[case]
    base = tmp_path / "sb"
    spy = SpyProvider(_real_provider(kind, base, [str(repo), str(tmp_path)]))
    definition = define_sandbox("agent", spy, ws)
    store = MemoryInstanceStore()

    async def main() -> BaseException:
        with pytest.raises(Exception) as err:
            await definition.ensure(_ctx(store=store))
        return err.value

    error = asyncio.run(main())
    assert expected in str(error)
    if case == "failing-setup":
        assert isinstance(error, SetupStepError) and error.exit_code == 9
    if case in ("bad-url", "missing-ref"):
        assert isinstance(error, (SandboxCommandError, Exception))
    assert spy.count("create") == 1
    assert _dirs(base) == [], "the half-created sandbox must be destroyed"
    assert asyncio.run(store.get(definition.instance_key(_ctx()))) is None


def test_unknown_package_manager_is_refused_before_any_sandbox_exists() -> None:
    with pytest.raises(ValueError, match="package_manager"):
        define_workspace(package_manager="pip3000")  # type: ignore[arg-type]


# -- A42-A47: one run's lifecycle -------------------------------------------------------------------


class Durability:
    def __init__(self, *, cancelled: bool = False, fail_stamp: bool = False) -> None:
        self.cancelled = cancelled
        self.fail_stamp = fail_stamp
        self.stamped: list[str] = []

    async def cancel_requested(self) -> bool:
        return self.cancelled

    async def stamp_detached(self, sandbox_key: str) -> None:
        if self.fail_stamp:
            raise RuntimeError("store down")
        self.stamped.append(sandbox_key)


def test_a42_destroy_after_a_cancelled_run_uses_a_live_scope_and_a_raising_destroy_keeps_the_record(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        spy = SpyProvider(local_process_sandbox(base_dir=tmp_path / "a42"))
        definition = define_sandbox("agent", spy)
        store = MemoryInstanceStore()
        controller = AbortController()
        ctx = _ctx(store=store, signal=controller.signal)
        entered = asyncio.Event()

        async def run() -> None:
            async with with_sandbox(definition, ctx):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.ensure_future(run())
        await entered.wait()
        controller.abort("user pressed stop")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        destroys = [c for name, c in spy.calls if name == "destroy"]
        assert len(destroys) == 1 and destroys[0].signal is None  # not the aborted caller signal
        assert await store.get(definition.instance_key(ctx)) is None
        assert _dirs(tmp_path / "a42") == []

        failing = SpyProvider(local_process_sandbox(base_dir=tmp_path / "a42b"), fail_destroy=True)
        definition = define_sandbox("agent", failing)
        ensured = await definition.ensure(_ctx(store=store))
        with pytest.raises(RuntimeError, match="on purpose"):
            await definition.destroy(_ctx(store=store))
        assert await store.get(ensured.key) is not None

    asyncio.run(main())


def test_a43_bootstrap_failure_destroys_the_new_sandbox_and_reraises(tmp_path: Path) -> None:
    async def main() -> None:
        spy = SpyProvider(local_process_sandbox(base_dir=tmp_path / "a43"))
        definition = define_sandbox("agent", spy, define_workspace(setup=["sleep 30 &", "sh -c 'exit 3'"]))
        with pytest.raises(SetupStepError, match="exit 3"):
            async with with_sandbox(definition, _ctx()):
                raise AssertionError("never reached")
        assert _dirs(tmp_path / "a43") == []

    asyncio.run(main())


def test_a44_non_durable_abort_destroys_even_without_destroy_on_complete(tmp_path: Path) -> None:
    async def main() -> None:
        hooks_seen: list[str] = []
        definition = define_sandbox(
            "agent",
            local_process_sandbox(base_dir=tmp_path / "a44"),
            lifecycle=Lifecycle(destroy_on_complete=False),
            hooks=SandboxHooks(on_destroy=lambda: hooks_seen.append("destroyed")),
        )
        controller = AbortController()
        async with with_sandbox(definition, _ctx(signal=controller.signal)) as run:
            proc = await run.handle.process.spawn("sleep 300")
            controller.abort(CANCEL_REASON)
        assert run.ending == "aborted" and hooks_seen == ["destroyed"]
        assert _dirs(tmp_path / "a44") == []
        assert await proc.wait() != 0

    asyncio.run(main())


def test_a45_durable_disconnect_detaches_cancel_or_failed_stamp_destroys(tmp_path: Path) -> None:
    async def one(name: str, durability: Durability, reason: str = "client went away") -> tuple[str, list[str]]:
        base = tmp_path / name
        definition = define_sandbox("agent", local_process_sandbox(base_dir=base))
        controller = AbortController()
        async with with_sandbox(definition, _ctx(signal=controller.signal), durability=durability) as run:
            controller.abort(reason)
        return str(run.ending), _dirs(base)

    async def main() -> None:
        kept = Durability()
        ending, dirs = await one("detach", kept)
        assert ending == "detached" and len(dirs) == 1 and len(kept.stamped) == 1
        ending, dirs = await one("cancel-recorded", Durability(cancelled=True))
        assert ending == "aborted" and dirs == []
        ending, dirs = await one("cancel-in-process", Durability(), reason=CANCEL_REASON)
        assert ending == "aborted" and dirs == []
        ending, dirs = await one("stamp-fails", Durability(fail_stamp=True))
        assert ending == "aborted" and dirs == []
        # A disconnect (no abort) stamps and never destroys.
        base = tmp_path / "disconnect"
        definition = define_sandbox("agent", local_process_sandbox(base_dir=base))
        durability = Durability()
        async with with_sandbox(definition, _ctx(), durability=durability) as run:
            assert await run.disconnect(durability) is True
            assert len(_dirs(base)) == 1
        assert len(_dirs(base)) == 1 and run.ending == "completed"

    asyncio.run(main())


def test_a46_destroy_on_complete_after_success_and_after_a_failed_native_snapshot(tmp_path: Path) -> None:
    async def main() -> None:
        ok = define_sandbox(
            "agent", local_process_sandbox(base_dir=tmp_path / "ok"), lifecycle=Lifecycle(destroy_on_complete=True)
        )
        async with with_sandbox(ok, _ctx()) as run:
            assert len(_dirs(tmp_path / "ok")) == 1
        assert run.ending == "completed" and _dirs(tmp_path / "ok") == []

        provider = SnapshottingProvider(str(tmp_path / "snapfail"))
        after_run = define_sandbox(
            "agent", provider, lifecycle=Lifecycle(snapshot="after-run", destroy_on_complete=True)
        )
        with pytest.raises(UnsupportedCapabilityError, match="failing on purpose"):
            async with with_sandbox(after_run, _ctx()) as run:
                provider.fail_snapshot = True
                run.handle.fail_snapshot = True  # type: ignore[attr-defined]
        assert [d for d in _dirs(tmp_path / "snapfail") if d != "snapshots"] == []

    asyncio.run(main())


def test_a47_durability_over_an_in_memory_or_absent_lock_warns(tmp_path: Path, caplog) -> None:
    async def main() -> None:
        definition = define_sandbox(
            "agent", local_process_sandbox(base_dir=tmp_path / "a47"), lifecycle=Lifecycle(destroy_on_complete=True)
        )
        async with with_sandbox(definition, _ctx(run="no-durability")):
            pass
        async with with_sandbox(definition, _ctx(run="memory-lock", locks=MemoryLockStore()), durability=Durability()):
            pass
        async with with_sandbox(definition, _ctx(run="absent-lock"), durability=Durability()):
            pass
        async with open_database(tmp_path / "a47.db") as db:
            ctx = _ctx(run="sqlite-lock", store=SqliteInstanceStore(db), locks=SqliteLockStore(db))
            async with with_sandbox(definition, ctx, durability=Durability()):
                pass

    with caplog.at_level(logging.WARNING, logger="boxwright.stores"):
        asyncio.run(main())
    warned = caplog.text
    assert "memory-lock" in warned and "absent-lock" in warned
    assert "no-durability" not in warned and "sqlite-lock" not in warned


def test_ensure_records_survive_a_new_process_through_sqlite(tmp_path: Path) -> None:
    async def once(run_id: str) -> str:
        async with open_database(tmp_path / "i.db") as db:
            definition = define_sandbox("agent", ResumingLocalProvider(base_dir=tmp_path / "sb"))
            result = await definition.ensure(_ctx(run=run_id, store=SqliteInstanceStore(db), locks=SqliteLockStore(db)))
            return result.outcome

    assert asyncio.run(once("r1")) == "created"
    assert asyncio.run(once("r2")) == "resumed"


def test_local_process_has_no_resume_by_id_each_run_creates_and_bootstraps_again_under_the_same_identity(
    tmp_path: Path,
) -> None:
    # Seed 000 / decision 5: no resume by id; the same identity names the same directory, so the
    # thread's files stay while setup runs again.
    async def main() -> None:
        spy = SpyProvider(local_process_sandbox(base_dir=tmp_path / "lp"))
        definition = define_sandbox("agent", spy, define_workspace(setup=["echo ran >> setup.log"]))
        store = MemoryInstanceStore()
        first = await definition.ensure(_ctx(run="r1", store=store))
        await first.handle.fs.write("/workspace/work.txt", "the first run's work")
        second = await definition.ensure(_ctx(run="r2", store=store))
        assert first.outcome == second.outcome == "created"
        assert spy.count("resume") == 0 and spy.count("create") == 2
        assert second.handle.id == first.handle.id and second.key == first.key
        assert (await second.handle.fs.read("/workspace/setup.log")) == "ran\nran\n", "bootstrapped again"
        assert (await second.handle.fs.read("/workspace/work.txt")) == "the first run's work"
        record = await store.get(second.key)
        assert record is not None and record.provider_sandbox_id == second.handle.id
        assert _dirs(tmp_path / "lp") == [os.path.basename(second.handle.id)]
        await second.handle.destroy()

    asyncio.run(main())
