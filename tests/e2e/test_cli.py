"""The `boxwright` command, run as a user runs it (a real subprocess, real sandboxes, real stores)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from boxwright.cli import NOT_SUPPORTED_YET
from boxwright.events import CustomEvent, RunErrorEvent, RunFinishedEvent, TextMessageContentEvent, decode_ndjson
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.require import agent_cli

ROOT = Path(__file__).resolve().parents[2]
BOXWRIGHT = [sys.executable, "-m", "boxwright.cli"]


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([*BOXWRIGHT, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)


def test_demo_runs_the_main_job_on_the_embedded_default(tmp_path: Path) -> None:
    done = _run(["demo", "Remember the milk.", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    events = decode_ndjson(done.stdout)
    assert events[0].type == "RUN_STARTED" and isinstance(events[-1], RunFinishedEvent)
    diff = next(e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed").value["diff"]
    assert "+- Remember the milk." in diff
    assert (tmp_path / ".boxwright" / "boxwright.db").is_file(), "the embedded SQLite store was used"
    # Rendered for a person, the same run shows the work and the diff.
    shown = _run(["demo", "Water the plants."], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Water the plants." in shown.stdout and "finished" in shown.stdout and "NOTES.md" in shown.stdout


def test_run_exits_non_zero_on_run_error(tmp_path: Path) -> None:
    done = _run(["run", "hi", "--harness", "command:echo boom >&2; exit 3", "--json"], tmp_path)
    assert done.returncode == 1
    error = decode_ndjson(done.stdout)[-1]
    assert isinstance(error, RunErrorEvent) and "code 3" in error.message and "boom" in error.message
    bad = _run(["run", "hi", "--harness", "nope"], tmp_path)
    assert bad.returncode != 0 and "--harness takes" in bad.stderr


def test_run_bridges_tools_from_the_command_line_to_the_real_claude(tmp_path: Path) -> None:
    claude = agent_cli("claude")
    marker = tmp_path / "tool-calls.txt"
    home = tmp_path / "home"
    home.mkdir()
    with FakeModelServer({"todos": [ToolCall("mcp__boxwright__get_todos", {}), Text("Two todos.")]}) as model:
        done = _run(
            ["run", "[[script:todos]] list my todos", "--tools", "tests.e2e.cli_tools:TOOLS", "--json"],
            tmp_path,
            PATH=f"{os.path.dirname(claude)}:{os.environ['PATH']}",
            HOME=str(home),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
            CLAUDE_CODE_MAX_RETRIES="0",
            BOXWRIGHT_TEST_TOOL_MARKER=str(marker),
        )
        sent = str(model.model_requests()[-1].body["messages"])
    assert done.returncode == 0, done.stderr + done.stdout
    assert marker.read_text() == "called open\n"
    assert "ship boxwright" in sent
    assert isinstance(decode_ndjson(done.stdout)[-1], RunFinishedEvent)


def test_python_dash_m_boxwright_is_the_boxwright_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "boxwright", "doctor", "--json"], cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    names = {check["name"] for check in msgspec.json.decode(done.stdout)}
    assert {"local-process", "bubblewrap", "claude-code"} <= names
    usage = subprocess.run([sys.executable, "-m", "boxwright"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: boxwright" in usage.stderr


def test_every_run_without_thread_gets_a_fresh_thread_and_workspace(tmp_path: Path) -> None:
    first = _run(["run", "hi", "--harness", "command:touch left-by-the-first-run; echo made it", "--json"], tmp_path)
    second = _run(["run", "hi", "--harness", "command:ls -a", "--json"], tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    threads = [decode_ndjson(done.stdout)[0].thread_id for done in (first, second)]  # type: ignore[attr-defined]
    assert threads[0] != threads[1] and all(t.startswith("cli-") for t in threads)
    assert f"new thread {threads[0]}" in first.stderr, "the fresh thread id is printed, to continue it later"
    listed = "".join(e.delta for e in decode_ndjson(second.stdout) if isinstance(e, TextMessageContentEvent))
    assert "left-by-the-first-run" not in listed, "the second run saw the first run's workspace"
    # Named, the thread continues in its workspace.
    again = _run(["run", "hi", "--harness", "command:ls", "--thread", threads[0], "--json"], tmp_path)
    assert "left-by-the-first-run" in "".join(
        e.delta for e in decode_ndjson(again.stdout) if isinstance(e, TextMessageContentEvent)
    )


def _doctor(tmp_path: Path, **env: str) -> dict[str, dict[str, object]]:
    base = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")}
    base.pop("CLAUDE_CODE_OAUTH_TOKEN", None)
    base.pop("CLAUDE_CONFIG_DIR", None)
    full = {**base, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [*BOXWRIGHT, "doctor", "--json"], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return {f"{c['kind']}:{c['name']}": c for c in msgspec.json.decode(done.stdout)}


def test_doctor_says_what_is_not_supported_yet_and_whether_claude_can_log_in(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    checks = _doctor(tmp_path, HOME=str(home))
    for kind, name in NOT_SUPPORTED_YET:
        check = checks[f"{kind}:{name}"]
        assert check["ok"] is False and "not supported yet" in str(check["detail"]), check
    railway = str(checks["provider:railway"]["detail"])
    assert checks["provider:railway"]["ok"] is False, railway
    assert "RAILWAY_API_TOKEN or RAILWAY_TOKEN and RAILWAY_ENVIRONMENT_ID" in railway, railway
    token = "rw-do-not-print-me-0123456789"
    ready = _doctor(tmp_path, HOME=str(home), RAILWAY_TOKEN=token, RAILWAY_ENVIRONMENT_ID="env-1")
    assert ready["provider:railway"]["ok"] is True and "$RAILWAY_TOKEN" in str(ready["provider:railway"]["detail"])
    assert token not in str(ready)
    assert checks["provider:e2b"]["ok"] is False and "E2B_API_KEY" in str(checks["provider:e2b"]["detail"])
    assert checks["agent-auth:claude-code"]["ok"] is False
    assert "ANTHROPIC_API_KEY" in str(checks["agent-auth:claude-code"]["detail"])
    # A key: named, never shown.
    key = "sk-ant-do-not-print-me-0123456789"
    keyed = _doctor(tmp_path, HOME=str(home), ANTHROPIC_API_KEY=key)
    assert keyed["agent-auth:claude-code"]["ok"] is True
    assert "$ANTHROPIC_API_KEY" in str(keyed["agent-auth:claude-code"]["detail"])
    assert key not in str(keyed)
    # The CLI's own login.
    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "secret-token"}}')
    login = _doctor(tmp_path, HOME=str(home))
    detail = str(login["agent-auth:claude-code"]["detail"])
    assert login["agent-auth:claude-code"]["ok"] is True and ".credentials.json" in detail
    assert "secret-token" not in str(login)
    text = subprocess.run(
        [*BOXWRIGHT, "doctor"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "no  railway" in text and "ok  railway" not in text


def test_doctor_reports_codex_and_opencode_binary_version_and_auth(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = f"/opt/boxwright-agents/node_modules/.bin:{os.environ.get('PATH', '/usr/bin:/bin')}"
    checks = _doctor(tmp_path, HOME=str(home), PATH=path, XDG_DATA_HOME=str(home / "data"), CODEX_HOME=str(home / "cx"))
    for name, version in (("codex", "codex-cli "), ("opencode", ".")):
        cli = checks[f"agent-cli:{name}"]
        if not cli["ok"] and "not found" in str(cli["detail"]):
            continue  # not installed here: the line says how to install it
        assert cli["ok"] is True and version in str(cli["detail"]).split("(", 1)[1], cli
        assert checks[f"agent-auth:{name}"]["ok"] is False
    key = "sk-do-not-print-me-0123456789"
    keyed = _doctor(tmp_path, HOME=str(home), CODEX_API_KEY=key, OPENAI_API_KEY=key)
    assert "$CODEX_API_KEY" in str(keyed["agent-auth:codex"]["detail"]) and keyed["agent-auth:codex"]["ok"] is True
    assert "$OPENAI_API_KEY" in str(keyed["agent-auth:opencode"]["detail"]) and key not in str(keyed)
    (home / "cx").mkdir()
    (home / "cx" / "auth.json").write_text('{"tokens": {"access_token": "secret-token"}}')
    login = _doctor(tmp_path, HOME=str(home), CODEX_HOME=str(home / "cx"))
    assert login["agent-auth:codex"]["ok"] is True and "auth.json" in str(login["agent-auth:codex"]["detail"])
    assert "secret-token" not in str(login)


def _age(path: Path, seconds: float) -> None:
    """Backdate a folder and its direct children, as if nothing had touched them for ``seconds``."""
    old = time.time() - seconds
    for p in [path, *path.iterdir()] if path.is_dir() else [path]:
        os.utime(p, (old, old), follow_symlinks=False)


async def _records(db_path: Path, owned: Path, runs: dict[str, str]) -> None:
    from boxwright.runs import RunPatch
    from boxwright.stores.base import InstanceRecord
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteRunStore, open_database

    async with open_database(db_path) as db:
        await SqliteInstanceStore(db).upsert(
            InstanceRecord(
                key="k1", provider="local-process", provider_sandbox_id=str(owned), thread_id="t1", updated_at=1
            )
        )
        store = SqliteRunStore(db)
        for run_id, status in runs.items():
            await store.create_or_resume(run_id, "t1")
            if status != "running":
                await store.update(run_id, RunPatch(status=status))  # type: ignore[arg-type]


def test_gc_removes_what_no_record_owns_and_says_what(tmp_path: Path) -> None:
    from boxwright.journal import journal_paths
    from boxwright.providers import bubblewrap_sandbox

    local, bwrap, journals, db = tmp_path / "local", tmp_path / "bwrap", tmp_path / "journals", tmp_path / "gc.db"
    for d in (local, bwrap, journals):
        d.mkdir()
    owned, orphan, fresh, busy = (local / n for n in ("owned", "orphan", "fresh", "busy"))
    for d in (owned, orphan, fresh, busy):
        d.mkdir()
        (d / "work.txt").write_text("x")
    asyncio.run(_records(db, owned, {"run-done": "completed", "run-live": "running"}))
    bwrap_orphan: Path | None = None
    if shutil.which("bwrap"):
        handle = asyncio.run(bubblewrap_sandbox(base_dir=str(bwrap)).create())
        bwrap_orphan = Path(handle.id)
    for name in ("run-done", "run-live", "run-gone", "run-new"):
        paths = journal_paths(name, str(journals))
        Path(paths.journal).write_text("{}\n")
        Path(paths.stderr).write_text("")
    (journals / "not a run.ndjson").write_text("")
    for p in [owned, orphan, busy, *([bwrap_orphan] if bwrap_orphan else [])]:
        _age(p, 7200)
    for p in journals.iterdir():
        if "run-new" not in p.name:
            _age(p, 7200)
    sleeper = subprocess.Popen(["sleep", "60"], cwd=busy)
    try:
        args = ["gc", "--db", str(db), "--sandbox-dir", str(local), "--sandbox-dir", str(bwrap)]
        args += ["--journal-dir", str(journals), "-v"]
        dry = _run([*args, "--dry-run"], tmp_path)
        assert dry.returncode == 0, dry.stderr
        assert f"would remove sandbox {orphan} (no sandbox record owns it)" in dry.stdout, dry.stdout
        assert orphan.is_dir(), "--dry-run removes nothing"
        done = _run(args, tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"removed sandbox {orphan} (no sandbox record owns it)" in out, out
    assert not orphan.exists() and owned.is_dir() and fresh.is_dir() and busy.is_dir()
    assert f"kept sandbox {busy} (in use by process {sleeper.pid})" in out, out
    if bwrap_orphan is not None:
        assert not bwrap_orphan.exists() and f"removed sandbox {bwrap_orphan}" in out, out
    left = sorted(p.name for p in journals.iterdir())
    assert left == sorted(
        [journal_paths(r, str(journals)).journal.rsplit("/", 1)[1] for r in ("run-live", "run-new")]
        + [journal_paths(r, str(journals)).stderr.rsplit("/", 1)[1] for r in ("run-live", "run-new")]
        + ["not a run.ndjson"]
    ), left
    assert "(run run-done ended completed)" in out and "(no run record owns it)" in out, out
    # Against a store that does not exist, gc refuses: nothing there owns anything.
    refused = _run(["gc", "--db", str(tmp_path / "nope.db"), "--sandbox-dir", str(local)], tmp_path)
    assert refused.returncode == 2 and "no boxwright database" in refused.stderr
    assert owned.is_dir()


def test_a_run_that_fails_before_the_agent_starts_says_why_once(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: the clone fails at once
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/nope.git"
    done = _run(["run", "hi", "--harness", "command:echo hi", "--repo", url], tmp_path)
    assert done.returncode == 1
    both = done.stdout + done.stderr
    assert both.count("could not land workspace source") == 1, both
    assert "(WorkspaceSourceError)" in done.stdout


def test_gc_sweeps_local_process_state_and_the_journals_kept_there(tmp_path: Path) -> None:
    from boxwright.journal import journal_paths
    from boxwright.providers import local_process_sandbox

    local, db = tmp_path / "local", tmp_path / "gc.db"
    provider = local_process_sandbox(base_dir=str(local))

    async def three() -> list[Any]:
        return [await provider.create() for _ in range(3)]

    owned, orphan, vanished = asyncio.run(three())
    if getattr(owned, "journal_dir", None) is None:
        pytest.skip("this local-process provider keeps no private state directory")
    state_of = {h.id: Path(h.journal_dir).parent for h in (owned, orphan, vanished)}
    asyncio.run(_records(db, Path(owned.id), {"run-done": "completed", "run-live": "running"}))
    os.makedirs(owned.journal_dir, exist_ok=True)
    for run_id in ("run-done", "run-live"):
        Path(journal_paths(run_id, owned.journal_dir).journal).write_text("{}\n")
    shutil.rmtree(vanished.id)  # its folder went; its private state stayed behind
    for path in [Path(owned.id), Path(orphan.id), *state_of.values(), Path(owned.journal_dir)]:
        _age(path, 7200)
    done = _run(["gc", "--db", str(db), "--sandbox-dir", str(local), "--journal-dir", str(tmp_path / "none")], tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert not Path(orphan.id).exists() and not state_of[orphan.id].exists(), out
    assert not state_of[vanished.id].exists(), out
    assert f"removed sandbox {state_of[vanished.id]} (the state of a sandbox that is gone)" in out, out
    assert Path(owned.id).is_dir() and state_of[owned.id].is_dir()
    left = sorted(p.name for p in Path(owned.journal_dir).iterdir())
    assert left == [Path(journal_paths("run-live", owned.journal_dir).journal).name], left
    assert "(run run-done ended completed)" in out, out
