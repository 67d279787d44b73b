"""The official Durable Streams conformance suite (npm @durable-streams/server-conformance-tests 0.3.6)
against `boxwright serve --streams` on SQLite and on Redis (`--store redis://...`, a redis-server this
module starts), run as spec durable-streams.md §2.2 says.

The suite has 338 cases, 6 of them subscription cases that this runner always skips; the
reference server passes 326. Issue 13 asks for at least 332.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.redis_server import redis_server
from tests.support.streams import scratch_project, streams_npm, streams_server

REQUIRED_PASSES = 332
SUITE_CASES = 338
LONG_POLL_S = 0.5


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_official_suite_passes_at_least_332_of_338(tmp_path: Path, backend: str) -> None:
    node_modules = streams_npm()
    project = scratch_project(tmp_path, node_modules, "conformance.test.mjs", "vitest.config.mjs")
    report = tmp_path / "conformance.json"
    with contextlib.ExitStack() as stack:
        store = None
        if backend == "redis":
            # everysec: the suite checks the protocol; tests/integration/test_redis_durability.py checks durability.
            store = stack.enter_context(redis_server(fsync="everysec")).url(prefix="conformance:")
        url = stack.enter_context(streams_server(tmp_path / "streams.db", long_poll_timeout=LONG_POLL_S, store=store))
        env = {**os.environ, "CONFORMANCE_TEST_URL": url, "CONFORMANCE_LONGPOLL_MS": str(int(LONG_POLL_S * 1000))}
        done = subprocess.run(
            [str(node_modules / ".bin" / "vitest"), "run", "--reporter=json", f"--outputFile.json={report}"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    assert report.exists(), f"vitest wrote no report (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(report.read_text())
    failed = [
        " > ".join([*case["ancestorTitles"], case["title"]])
        + ": "
        + (case.get("failureMessages") or [""])[0].splitlines()[0][:200]
        for suite in result["testResults"]
        for case in suite["assertionResults"]
        if case["status"] == "failed"
    ]
    print(f"\n{backend}: {result['numPassedTests']} of {SUITE_CASES} passed")
    assert result["numTotalTests"] == SUITE_CASES, f"the pinned suite changed size: {result['numTotalTests']}"
    assert result["numPassedTests"] >= REQUIRED_PASSES, (
        f"{result['numPassedTests']} of {SUITE_CASES} passed (need {REQUIRED_PASSES}); failed:\n" + "\n".join(failed)
    )
