"""Every harness's recorded runs, ended every way at every point, pass the official AG-UI verifier (issue 18).

Each recorded CLI output (tests/fixtures/{claude,codex,opencode,acp}: every harness but Grok, which has
no recording) is translated by its harness and
driven through ``pipe_to_run_log``, the log's one writer, and what the log then holds goes to
``@ag-ui/client``'s own ``verifyEvents`` (and ``@ag-ui/core``'s event schema) in node: the whole run;
the run cut after each of its events by a raise (failed), by a cancel, or by its driver dying with
a successor replaying it from zero (the takeover, aligned to the stored log); and, for each offset,
what ``POST /agui`` serves a client that joins there (``reopening`` of the stored prefix, then the
rest). A run that the verifier refuses names its case.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.events import Event, RunStartedEvent
from boxwright.harnesses.acp import acp
from boxwright.harnesses.claude_code import claude_code
from boxwright.harnesses.codex import codex
from boxwright.harnesses.gemini_cli import gemini_cli
from boxwright.harnesses.opencode import opencode
from boxwright.middleware.agui import reopening
from boxwright.runs import RUN_CANCEL_REASON, RunPatch, pipe_to_run_log
from boxwright.stores.memory import memory_run_backend
from boxwright.takeover import align_to_stored_log, is_out_of_band
from tests.fixtures import FIXTURES
from tests.support.harness_replay import recording, replay
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]
# Harness, its recordings, which of them. The ACP recordings hold the agent's side of the JSON-RPC
# session only (no prompt response), so their runs end in the translator's RUN_ERROR: one more ending.
HARNESSES: dict[str, tuple[Callable[[], Any], Path, str]] = {
    "claude": (claude_code, FIXTURES / "claude", "*"),
    "codex": (codex, FIXTURES / "codex", "*"),
    "opencode": (opencode, FIXTURES / "opencode", "*"),
    "claude-agent-acp": (lambda: acp(["x"], name="claude-agent-acp"), FIXTURES / "acp", "claude-agent-acp-*"),
    "codex-acp": (lambda: acp(["x"], name="codex-acp"), FIXTURES / "acp", "codex-acp-*"),
    "gemini": (gemini_cli, FIXTURES / "acp", "gemini-*"),
}


def _node_project(tmp: Path) -> Path:
    root = Path(os.environ.get("BOXWRIGHT_AGUI_NPM", "/opt/boxwright-agui"))
    if shutil.which("node") is None:
        missing("`node` is not installed (Debian: apt-get install nodejs npm)")
    if not (root / "node_modules" / "@ag-ui" / "client").is_dir():
        missing(f"the AG-UI clients are not installed in {root} (cp tests/agui/package.json there; npm install)")
    project = tmp / "verify"
    project.mkdir()
    shutil.copy(ROOT / "tests" / "agui" / "clients.mjs", project / "clients.mjs")
    (project / "node_modules").symlink_to(root / "node_modules", target_is_directory=True)
    return project


async def _stream(events: list[Event], then: Callable[[], Any] | None = None) -> AsyncIterator[Event]:
    for event in events:
        yield event
    if then is not None:
        await then()


async def _logged(events: list[Event], cut: int | None, ending: str) -> list[Event]:
    """What the log holds after a run that yielded ``events[:cut]`` and then ended as ``ending`` says."""
    runs, log = memory_run_backend()
    head = events if cut is None else events[:cut]
    if ending == "whole":
        await pipe_to_run_log(_stream(head), runs, log, "r7", "t1")
    elif ending == "raised":

        async def die() -> None:
            raise ConnectionError("the agent died")

        await pipe_to_run_log(_stream(head, die), runs, log, "r7", "t1")
    elif ending == "cancelled":
        stop = AbortController()

        async def cancel() -> None:
            stop.abort(RUN_CANCEL_REASON)
            await asyncio.Event().wait()

        await pipe_to_run_log(_stream(head, cancel), runs, log, "r7", "t1", stop.signal)
    else:  # taken over: the driver dies (detached, log left open), a successor replays everything from zero
        await runs.create_or_resume("r7", "t1")
        await runs.update("r7", RunPatch(driver_epoch=1))
        gone = AbortController()

        async def host_dies() -> None:
            gone.abort("the host died")
            await asyncio.Event().wait()

        await pipe_to_run_log(_stream(head, host_dies), runs, log, "r7", "t1", gone.signal, 1, detached=lambda: True)
        await runs.update("r7", RunPatch(driver_epoch=2))

        async def stored() -> list[Event]:
            return await log.snapshot("r7")

        aligned = align_to_stored_log(_stream(events), stored, out_of_band=is_out_of_band)
        await pipe_to_run_log(aligned, runs, log, "r7", "t1", epoch=2)
    return await log.snapshot("r7")


def _in_band(events: list[Event]) -> list[bytes]:
    return [msgspec.json.encode(msgspec.structs.replace(e, timestamp=None)) for e in events if not is_out_of_band(e)]


def _cases() -> dict[str, list[Event]]:
    async def build() -> dict[str, list[Event]]:
        cases: dict[str, list[Event]] = {}
        for harness_name, (make, folder, pattern) in HARNESSES.items():
            for path in sorted(folder.glob(f"{pattern}.ndjson")):
                # As run_agent drives a translator: its own RUN_STARTED first, the translator's dropped.
                translated = replay(make(), recording(folder, path.stem))
                events = [
                    RunStartedEvent(thread_id="t1", run_id="r7"),
                    *(e for e in translated if e.type != "RUN_STARTED"),
                ]
                name = f"{harness_name}/{path.stem}"
                whole = await _logged(events, None, "whole")
                cases[f"{name} whole"] = whole
                for cut in range(1, len(events)):
                    for ending in ("raised", "cancelled", "taken over"):
                        cases[f"{name} {ending} after {cut}"] = await _logged(events, cut, ending)
                    # The successor's replay, aligned, completes the run exactly as one driver would have.
                    assert _in_band(cases[f"{name} taken over after {cut}"]) == _in_band(whole), (name, cut)
                for at in range(1, len(whole)):
                    cases[f"{name} joined at {at}"] = [*reopening(whole[:at]), *whole[at:]]
        return cases

    return asyncio.run(build())


def test_every_harness_every_ending_and_every_join_pass_the_ag_ui_verifier(tmp_path: Path) -> None:
    project = _node_project(tmp_path)
    cases = _cases()
    assert len(cases) > 500, len(cases)
    for name in ("claude/bash", "codex/bash", "opencode/bash", "gemini/gemini-bash"):
        assert cases[f"{name} whole"][0].type == "RUN_STARTED", name
    file = tmp_path / "cases.json"
    file.write_bytes(msgspec.json.encode(cases))
    done = subprocess.run(
        ["node", str(project / "clients.mjs"), "verify", json.dumps({"file": str(file)})],
        cwd=project,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    verdicts: dict[str, str | None] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert verdicts.keys() == cases.keys()
    refused = {name: error for name, error in verdicts.items() if error is not None}
    assert not refused, json.dumps(dict(list(refused.items())[:20]), indent=1)


@pytest.mark.parametrize("ending", ["raised", "cancelled", "taken over"])
def test_an_early_end_still_gives_one_terminal_event_last(ending: str) -> None:
    folder = FIXTURES / "claude"
    events = replay(claude_code(), recording(folder, "bash"))
    assert events[0].type == "RUN_STARTED"
    logged = asyncio.run(_logged(events, len(events) // 2, ending))
    types = [e.type for e in logged]
    assert types[0] == "RUN_STARTED" and types[1] == "CUSTOM", types
    assert types[-1] in ("RUN_ERROR", "RUN_FINISHED") and sum(t in ("RUN_ERROR", "RUN_FINISHED") for t in types) == 1
