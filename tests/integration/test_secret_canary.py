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

import msgspec
import pytest

from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import (
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    decode_event,
    encode_event,
)
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


# The agent streams the key in pieces (as a model does, token by token), in its text and in a tool
# call's arguments, then writes a long stderr whose every cut (the 4 KiB tail kept of it, the 1,000
# characters a RUN_ERROR carries) falls inside a copy of the key, and fails.
_SPLITTING_AGENT = r"""
import json, os, sys
key = os.environ["API_KEY"]
parts = int(sys.argv[1])
step = max(1, len(key) // parts)
pieces = [key[i * step:(i + 1) * step] for i in range(parts - 1)] + [key[(parts - 1) * step:]]
def emit(**event):
    print(json.dumps(event), flush=True)
emit(type="TEXT_MESSAGE_START", messageId="m1", role="assistant")
emit(type="TEXT_MESSAGE_CONTENT", messageId="m1", delta="my key is ")
for piece in pieces:
    emit(type="TEXT_MESSAGE_CONTENT", messageId="m1", delta=piece)
emit(type="TEXT_MESSAGE_CONTENT", messageId="m1", delta=" and that is all")
emit(type="TEXT_MESSAGE_END", messageId="m1")
args = json.dumps({"header": "Bearer " + key})
cut = args.index(key)
arg_pieces = [args[:cut + 2]] + [args[cut + 2 + i * 3: cut + 5 + i * 3] for i in range(parts - 2)]
arg_pieces.append(args[cut + 2 + (parts - 2) * 3:])
emit(type="TOOL_CALL_START", toolCallId="c1", toolCallName="fetch")
for piece in arg_pieces:
    emit(type="TOOL_CALL_ARGS", toolCallId="c1", delta=piece)
emit(type="TOOL_CALL_END", toolCallId="c1")
half = len(key) // 2
# Ends so that the last 1,000 and the last 4,096 characters both begin in the middle of a key.
tail_1000 = key[half:] + "y" * (1000 - (len(key) - half))
tail_4096 = key[half:] + "x" * (4096 - (len(key) - half) - len(key[:half]) - len(tail_1000)) + key[:half]
sys.stderr.write("w" * 3000 + key[:half] + tail_4096 + tail_1000)
sys.exit(3)
"""


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("journaled", [False, True], ids=["piped", "journaled"])
def test_a_canary_streamed_in_pieces_and_cut_in_stderr_reaches_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, parts: int, journaled: bool
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    script = tmp_path / "agent.py"
    script.write_text(_SPLITTING_AGENT)
    sandbox = define_sandbox(
        "canary-split",
        local_process_sandbox(base_dir=tmp_path / "sb"),
        define_workspace(secrets=create_secrets(API_KEY=canary)),
        lifecycle=Lifecycle(destroy_on_complete=True),
    )
    agent = command_harness(f"python3 {script} {parts}", env={"API_KEY": canary})
    run_id = f"r-split-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[list[bytes], str, str]:
        async with open_database(tmp_path / "boxwright.db") as db:
            runs, log = sqlite_run_backend(db)
            stream = run_agent(
                sandbox,
                agent,
                "go",
                thread_id="t",
                run_id=run_id,
                journal=JournalOptions() if journaled else None,
            )
            record = await pipe_to_run_log(stream, runs, log, run_id, "t")
            events = [encode_event(e) for e in await log.snapshot(run_id)]
            return events, record.status, msgspec.json.encode(record).decode()

    with caplog.at_level(logging.DEBUG):
        events, status, record = asyncio.run(main())

    assert status == "failed"
    wire = b"\n".join(events).decode()
    decoded = [decode_event(e) for e in events]
    text = "".join(e.delta for e in decoded if isinstance(e, TextMessageContentEvent))
    args = "".join(e.delta for e in decoded if isinstance(e, ToolCallArgsEvent))
    assert text == "my key is *** and that is all"
    assert msgspec.json.decode(args) == {"header": "Bearer ***"}
    error = next(e for e in decoded if isinstance(e, RunErrorEvent))
    assert "yyyy" in error.message  # the stderr tail is there, masked
    stored = _stored_bytes(tmp_path).decode("latin-1")
    half = len(canary) // 2
    # Neither the key nor either half of it (what a cut, or a split stream, would leave) is anywhere.
    for piece in (canary, canary[:half], canary[half:]):
        assert piece not in wire and piece not in record and piece not in stored
        for rec in caplog.records:
            assert piece not in rec.getMessage() + (rec.exc_text or ""), rec.name
