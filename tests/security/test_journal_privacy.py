"""Journals are private to their sandbox (issue 9, point 3).

A journal holds an agent's raw output. On local-process it used to land in the host's shared
``/tmp/boxwright-runs`` with mode 0644 and stay there after a cancel. Now each sandbox has a state
directory of its own beside the provider's base dir (every level 0700, files 0600 from their
first byte), which destroy removes, and no other sandbox (nor another user) finds its journals.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import CANCEL_REASON, Lifecycle, define_sandbox
from boxwright.errors import SandboxPathError
from boxwright.events import Event, RunErrorEvent, RunFinishedEvent, TextMessageContentEvent, encode_event
from boxwright.harnesses.command import command_harness
from boxwright.journal import (
    DEFAULT_JOURNAL_DIR,
    encode_run_id,
    journal_dir_of,
    journal_exists_command,
    journal_paths,
    prune_journals,
    start_journaled_agent,
)
from boxwright.providers import local_process_sandbox
from boxwright.providers.local_process import state_dir_for
from boxwright.sandbox import CreateInput, DestroyInput, ResumeInput
from boxwright.stores.memory import memory_run_backend

pytestmark = pytest.mark.integration

NOBODY = 65534
SECRET_LINE = "raw agent output only its own sandbox may read"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _agent(gate: Path) -> str:
    """An agent that prints, then holds (bounded) until the test opens the gate, then prints again."""
    start = '{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}'
    text = encode_event(TextMessageContentEvent(message_id="m", delta=SECRET_LINE)).decode()
    end = '{"type":"TEXT_MESSAGE_END","messageId":"m"}'
    wait = f"i=0; while [ ! -e {gate} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"
    return f"printf '%s\\n' '{start}' '{text}'; {wait}; printf '%s\\n' '{end}'"


def _journal_files(state_root: Path) -> list[Path]:
    return sorted(state_root.glob("*/journals/*"))


async def _until_files(state_root: Path, timeout: float = 20) -> list[Path]:
    deadline = asyncio.get_running_loop().time() + timeout
    while len(files := _journal_files(state_root)) < 4:
        assert asyncio.get_running_loop().time() < deadline, f"no journal appeared under {state_root}"
        await asyncio.sleep(0.05)
    return files


def _assert_private(state_root: Path, files: list[Path]) -> None:
    journals = files[0].parent
    for directory in (state_root, journals.parent, journals):
        assert _mode(directory) == 0o700, (directory, oct(_mode(directory)))
    # The stderr sidecar, the pre-run workspace listing (for a successor's file events), the journal,
    # the agent's stdin (its prompt, read from there so it does not depend on the starting host).
    assert [f.suffix for f in files] == [".err", ".files", ".ndjson", ".stdin"]
    for file in files:
        assert _mode(file) == 0o600, (file, oct(_mode(file)))
    assert SECRET_LINE in files[2].read_text(), "the journal holds the agent's raw output"
    if os.geteuid() == 0:
        # Mode bits are the claim; another uid actually failing to read is the point of them.
        for command in (["cat", str(files[2])], ["ls", str(journals)], ["ls", str(state_root)]):
            denied = subprocess.run(command, user=NOBODY, capture_output=True, text=True, timeout=10)
            assert denied.returncode != 0 and SECRET_LINE not in denied.stdout, command


class _Detach:
    async def cancel_requested(self) -> bool:
        return False

    async def stamp_detached(self, sandbox_key: str) -> None:
        return None


@pytest.mark.parametrize("ending", ["completed", "cancelled"])
def test_a_local_process_run_leaves_no_journal_readable_by_others_and_nothing_after_destroy(
    ending: str, tmp_path: Path
) -> None:
    base = tmp_path / "sb"
    state_root = tmp_path / "sb.state"
    gate = tmp_path / "gate"
    run_id = f"privacy-{ending}-{uuid.uuid4().hex[:8]}"
    # A completed run's sandbox goes at its end; a cancelled one's is destroyed by the cancel.
    sandbox = define_sandbox(
        "privacy",
        local_process_sandbox(base_dir=base),
        lifecycle=Lifecycle(destroy_on_complete=ending == "completed"),
    )
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        stream = run_agent(
            sandbox,
            command_harness(_agent(gate)),
            "go",
            thread_id="t",
            run_id=run_id,
            journal=JournalOptions(),
            durability=_Detach() if ending == "cancelled" else None,
            signal=controller.signal,
        )
        checked = False
        async for event in stream:
            events.append(event)
            if isinstance(event, TextMessageContentEvent) and not checked:
                checked = True
                _assert_private(state_root, await _until_files(state_root))
                assert not os.path.exists(f"{DEFAULT_JOURNAL_DIR}/{encode_run_id(run_id)}.ndjson")
                if ending == "cancelled":
                    controller.abort(CANCEL_REASON)
                else:
                    gate.touch()
        return events

    events = asyncio.run(main())
    assert events and isinstance(events[-1], RunFinishedEvent if ending == "completed" else RunErrorEvent)
    assert list(base.iterdir()) == [], "the sandbox is gone"
    assert list(state_root.iterdir()) == [], "its state directory (and journals) went with it"
    assert not os.path.exists(f"{DEFAULT_JOURNAL_DIR}/{encode_run_id(run_id)}.ndjson")


def test_two_local_process_sandboxes_do_not_see_each_others_journals(tmp_path: Path) -> None:
    async def main() -> None:
        provider = local_process_sandbox(base_dir=tmp_path / "sb")
        a, b = await provider.create(CreateInput()), await provider.create(CreateInput())
        try:
            dir_a, dir_b = journal_dir_of(a), journal_dir_of(b)
            assert dir_a != dir_b and DEFAULT_JOURNAL_DIR not in (dir_a, dir_b)
            for handle, journals in ((a, dir_a), (b, dir_b)):
                # Outside the workspace: a journal never shows in the agent's git status or diff.
                assert not journals.startswith(handle.workspace_root + os.sep)
            run_id = f"mine-{uuid.uuid4().hex[:8]}"
            paths_a = journal_paths(run_id, dir_a)
            await (await start_journaled_agent(a, f'echo \'{{"secret":"{SECRET_LINE}"}}\'', paths_a)).wait()
            assert SECRET_LINE in (await a.process.exec(f"cat {paths_a.journal}")).stdout

            # Sandbox b, asked for the same run id, finds nothing; its sweep lists nothing of a's.
            paths_b = journal_paths(run_id, dir_b)
            assert (await b.process.exec(journal_exists_command(paths_b))).exit_code != 0
            runs, _ = memory_run_backend()
            assert (await prune_journals(b, runs)).listed == 0
            assert (await a.process.exec(journal_exists_command(paths_a))).exit_code == 0

            # Any host resuming sandbox a (a takeover, the reaper) derives the same journal dir.
            again = await local_process_sandbox(base_dir=tmp_path / "sb").resume(ResumeInput(id=a.id))
            assert again is not None and journal_dir_of(again) == dir_a
            assert (await again.process.exec(journal_exists_command(paths_a))).exit_code == 0
        finally:
            await a.destroy()
            await b.destroy()
        assert not os.path.exists(dir_a) and not os.path.exists(dir_b)

    asyncio.run(main())


def test_destroy_removes_the_state_of_a_user_given_workspace_but_keeps_the_workspace(tmp_path: Path) -> None:
    async def main() -> None:
        user_dir = tmp_path / "my-project"
        user_dir.mkdir()
        (user_dir / "keep.txt").write_text("mine")
        provider = local_process_sandbox(user_dir, base_dir=tmp_path / "sb")
        handle = await provider.create(CreateInput())
        paths = journal_paths("user-run", journal_dir_of(handle))
        await (await start_journaled_agent(handle, "echo '{}'", paths)).wait()
        assert os.path.exists(paths.journal)
        await handle.destroy()
        assert (user_dir / "keep.txt").read_text() == "mine", "the user's directory is not ours to remove"
        assert not os.path.exists(os.path.dirname(paths.dir)), "the sandbox's state is"

        # A provider-level destroy (no handle: the reaper's) removes it too.
        handle = await provider.create(CreateInput())
        await (await start_journaled_agent(handle, "echo '{}'", paths)).wait()
        await provider.destroy(DestroyInput(id=handle.id))
        assert not os.path.exists(os.path.dirname(paths.dir))
        assert (user_dir / "keep.txt").read_text() == "mine"

    asyncio.run(main())


def test_a_state_directory_someone_else_prepared_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        base = tmp_path / "sb"
        root = base / "fixed"
        provider = local_process_sandbox(root, base_dir=base)
        state = Path(state_dir_for(str(base), str(root)))
        elsewhere = tmp_path / "attacker-readable"
        elsewhere.mkdir(mode=0o777)
        state.parent.mkdir(parents=True)
        state.symlink_to(elsewhere)
        with pytest.raises(SandboxPathError, match="not a directory of this user"):
            await provider.create(CreateInput())
        state.unlink()
        # A level that exists with a loose mode is tightened, not trusted as it is.
        state.parent.chmod(0o755)
        handle = await provider.create(CreateInput())
        assert _mode(state.parent) == 0o700 and _mode(state) == 0o700
        await handle.destroy()
        assert list(elsewhere.iterdir()) == []

    asyncio.run(main())
