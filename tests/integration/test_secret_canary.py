"""A canary secret through a whole durable run: it must appear in no log line, error, event or stored byte.

The secret is real inside the sandbox (the agent needs it); everything that leaves the sandbox for the
app's stores, logs and clients carries `***` instead.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import uuid
from pathlib import Path

import pytest

from boxwright.agent import run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import RunErrorEvent, RunFinishedEvent, TextMessageContentEvent, encode_event
from boxwright.harnesses.command import command_harness
from boxwright.providers import local_process_sandbox
from boxwright.runs import pipe_to_run_log
from boxwright.secrets import bearer, create_secrets
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.workspace import define_workspace, git_source, mcp_skill


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@e"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "app.py").write_text("print('hi')\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


def _stored_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.glob("boxwright.db*"))


@pytest.mark.parametrize("failing_setup", [False, True], ids=["run", "failing-setup"])
def test_a_canary_secret_reaches_no_log_error_event_or_store(
    tmp_path: Path, origin: Path, caplog: pytest.LogCaptureFixture, failing_setup: bool
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    secrets = create_secrets(API_KEY=canary, GIT_TOKEN=canary)
    setup = ['test "$API_KEY" = "' + canary + '"', 'echo "setup saw $API_KEY"']
    if failing_setup:
        setup.append('echo "about to fail with $API_KEY"; sh -c "exit 4"')
    workspace = define_workspace(
        source=git_source(f"file://{origin}", auth=secrets.GIT_TOKEN),
        setup=setup,
        secrets=secrets,
        skills=[
            mcp_skill(
                "issues", {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": bearer(secrets.API_KEY)}}
            )
        ],
    )
    sandbox = define_sandbox(
        "canary",
        local_process_sandbox(base_dir=tmp_path / "sb"),
        workspace,
        lifecycle=Lifecycle(destroy_on_complete=True),
    )
    # The agent has the secret and prints it, on stdout and on stderr, then fails so stderr is reported.
    agent = command_harness('echo "my key is $API_KEY"; echo "stderr $API_KEY" >&2; exit 3')

    async def main() -> tuple[list[bytes], str]:
        async with open_database(tmp_path / "boxwright.db") as db:
            runs, log = sqlite_run_backend(db)
            stream = run_agent(
                sandbox,
                agent,
                f"use the key (not {canary[:6]})",
                thread_id="t",
                run_id="r-canary",
                store=SqliteInstanceStore(db),
                locks=SqliteLockStore(db),
            )
            record = await pipe_to_run_log(stream, runs, log, "r-canary", "t")
            events = [encode_event(e) for e in await log.snapshot("r-canary")]
            return events, record.status

    with caplog.at_level(logging.DEBUG):
        events, status = asyncio.run(main())

    wire = b"\n".join(events)
    assert canary.encode() not in wire
    if failing_setup:
        assert status == "failed"
        assert b"setup step failed" in wire and b"***" in wire
    else:
        assert status == "failed"  # the agent exits 3
        assert b"my key is ***" in wire and b"stderr ***" in wire
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        assert canary not in text, f"{record.name}: {text}"
    assert canary.encode() not in _stored_bytes(tmp_path)
    assert any(isinstance(e, bytes) for e in events)


def test_events_of_a_clean_run_keep_their_text(tmp_path: Path) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    sandbox = define_sandbox(
        "canary", local_process_sandbox(base_dir=tmp_path / "sb"), define_workspace(secrets=create_secrets(K=canary))
    )

    async def main() -> list[object]:
        stream = run_agent(sandbox, command_harness("echo plain words"), "go", thread_id="t")
        return [e async for e in stream]

    events = asyncio.run(main())
    assert isinstance(events[-1], RunFinishedEvent) and not any(isinstance(e, RunErrorEvent) for e in events)
    assert "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent)) == "plain words\n"
