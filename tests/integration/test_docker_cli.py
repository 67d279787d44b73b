"""The CLI on Docker: `boxwright run --provider docker --image IMAGE` runs in a container as the non-root user,
`boxwright doctor` says whether the engine and the runner image are there, and a live run's container is not
reaped (its lease has not expired and no run store says it ended)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docker import (
    BASE_IMAGE,
    RUNNER_IMAGE,
    image_problem,
    labelled_containers,
    labelled_images,
    remove_images,
    session_label,
)
from tests.support.require import missing

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _managed() -> set[str]:
    # This session's (the CLI inherits its label): a parallel session's containers are not this test's.
    return set(labelled_containers(session_label()))


def _boxwright(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "boxwright", *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env
    )


def test_run_provider_docker_runs_in_a_container_and_reap_keeps_a_live_one(tmp_path: Path) -> None:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)
    before, images_before = _managed(), set(labelled_images(session_label()))
    try:
        run = _boxwright(
            "run", "hi", "--provider", "docker", "--image", BASE_IMAGE, "--harness", "command:echo in-box; id -u",
            "--json", "--db", str(tmp_path / "db.sqlite"), cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        events = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
        text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "in-box\n1000\n" and events[-1]["type"] == "RUN_FINISHED", events
        created = _managed() - before
        assert len(created) == 1, "the run's container (kept for the thread) carries boxwright's labels"
        reap = _boxwright("reap", "--json", cwd=tmp_path)
        assert reap.returncode == 0, reap.stderr
        reaped = json.loads(reap.stdout)
        assert not created & {r["id"] for r in reaped["containers"]}, "a live run's container would be reaped"
        snapshots = set(labelled_images(session_label())) - images_before
        assert len(snapshots) == 1, "the run's after-setup snapshot carries boxwright's labels"
        assert not snapshots & {r["id"] for r in reaped["images"]}, "a live thread's snapshot would be reaped"
    finally:
        left = _managed() - before
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)
        # The run's after-setup snapshot: kept for the thread by design, so this test removes it.
        remove_images(sorted(set(labelled_images(session_label())) - images_before))


def test_doctor_reports_the_engine_and_the_runner_image(tmp_path: Path) -> None:
    if (problem := image_problem(RUNNER_IMAGE)) is not None:
        missing(problem)
    doctor = _boxwright("doctor", "--json", cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["docker"]["ok"] and "engine" in checks["docker"]["detail"], checks["docker"]
    assert checks["docker-runner"]["ok"] and RUNNER_IMAGE in checks["docker-runner"]["detail"]
    no_engine = subprocess.run(
        [sys.executable, "-m", "boxwright", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DOCKER_HOST": "unix:///nonexistent.sock"},
    )
    down = {c["name"]: c for c in json.loads(no_engine.stdout)}["docker"]
    assert not down["ok"] and "dockerd" in down["detail"], down
