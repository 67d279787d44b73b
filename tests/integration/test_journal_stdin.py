"""A journaled agent's stdin does not depend on the host that started it.

The prompt is kept in a private file next to the journal and the agent reads it from there: a host
SIGKILLed between the spawn and the write to the agent's pipe (the coordinator chaos test's
first-event kill point) left claude with an empty stdin ("Input must be provided"), a failed run.
"""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from boxwright.journal import (
    journal_paths,
    journal_stdin_path,
    read_journal_ndjson,
    start_journaled_agent,
)
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import CreateInput

pytestmark = pytest.mark.integration


class _DeadHostPipes:
    """A handle whose spawned processes' stdin writes go nowhere: the host died before writing."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.process = self
        self.fs = handle.fs

    async def exec(self, command: str, options: Any = None) -> Any:
        return await self._handle.process.exec(command, options)

    async def spawn(self, command: str, options: Any = None) -> Any:
        process = await self._handle.process.spawn(command, options)
        real = process.stdin

        class _Stdin:
            async def write(self, data: Any) -> None:
                return None

            async def end(self) -> None:
                await real.end()

        process.stdin = _Stdin()
        return process


def test_the_agent_reads_its_prompt_though_nothing_was_written_to_its_pipe(tmp_path: Path) -> None:
    prompt = "say hello " + "x" * 70_000 + " ünïcode"  # over two env chunks, and not ASCII

    async def main() -> None:
        provider = local_process_sandbox(base_dir=tmp_path / "sb")
        handle = await provider.create(CreateInput())
        try:
            paths = journal_paths(f"r-{uuid.uuid4().hex[:8]}", str(tmp_path / "journals"))
            # The agent waits for a go file, so its prompt file is looked at while it is there.
            go = tmp_path / "go"
            agent = (
                f"while [ ! -e {go} ]; do sleep 0.05; done; "
                "python3 -c 'import json,sys; print(json.dumps({\"got\": sys.stdin.read()}))'"
            )
            await start_journaled_agent(_DeadHostPipes(handle), agent, paths, stdin=prompt)  # type: ignore[arg-type]
            kept = os.stat(journal_stdin_path(paths))
            assert stat.S_IMODE(kept.st_mode) == 0o600, "the prompt file is private"
            assert stat.S_IMODE(os.stat(paths.dir).st_mode) == 0o700
            go.touch()
            lines = [line async for line in read_journal_ndjson(handle, paths)]
            assert lines == [{"got": prompt}]
            # ...and it went with the journal, once the reader saw the agent's end.
            assert not os.path.exists(journal_stdin_path(paths))
        finally:
            await handle.destroy()

    asyncio.run(asyncio.wait_for(main(), 60))
