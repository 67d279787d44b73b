"""Shared pytest setup: everything under tests/integration and tests/security carries the `integration` marker."""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

_HERE = pathlib.Path(__file__).parent
# tests/security drives real sandboxes (real bwrap, real processes): integration tests too.
_INTEGRATION = (_HERE / "integration", _HERE / "security")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(directory in item.path.parents for directory in _INTEGRATION):
            item.add_marker(pytest.mark.integration)


# One id per session, on every Docker container and image the session creates (subprocesses too):
# the session-end check below sees this session's leftovers only, never a parallel session's.
# Each pytest-xdist worker is a session of its own (its id replaces the controller's it inherited):
# a test that looks for "this session's" containers must not see, or remove, a sibling worker's.
# A worker's id is the controller's and its own name, so the controller can sweep a dead worker's.
_worker = os.environ.get("PYTEST_XDIST_WORKER")
if "BOXWRIGHT_TEST_SESSION" not in os.environ or (_worker and os.environ.get("BOXWRIGHT_TEST_WORKER") != _worker):
    _controller = os.environ.get("BOXWRIGHT_TEST_SESSION")
    if _worker:
        os.environ["BOXWRIGHT_TEST_WORKER"] = _worker
    _fresh = f"{os.getpid()}-{secrets.token_hex(4)}"
    os.environ["BOXWRIGHT_TEST_SESSION"] = f"{_controller}-{_worker}" if _worker and _controller else _fresh
    _others = [
        label
        for label in os.environ.get("BOXWRIGHT_DOCKER_LABELS", "").split(",")
        if label and not label.startswith("boxwright.test-session=")
    ]
    _mine = f"boxwright.test-session={os.environ['BOXWRIGHT_TEST_SESSION']}"
    os.environ["BOXWRIGHT_DOCKER_LABELS"] = ",".join([*_others, _mine])


@pytest.fixture(autouse=True)
def _process_secrets_per_test() -> Iterator[None]:
    """The process-wide secret values a test registered (an in-process coordinator's tokens) end with it.

    A service registers its configured secrets once for its life; a worker that builds hundreds of apps
    would otherwise mask every test's tokens in every later test: a later run's text deltas are then
    held back at a character that happens to begin an earlier test's hex token, and an exact list of
    deltas differs from run to run with the order the files ran in.
    """
    from boxwright import secrets as process_secrets

    before = process_secrets.process_secret_values()
    yield
    process_secrets.restore_process_secret_values(before)


@pytest.fixture(autouse=True, scope="module")
def _fake_clouds_drained() -> Iterator[None]:
    """A test module's end removes the fake clouds' idle warm machines (tests/support/cloud_providers.py)."""
    yield
    fakes = sys.modules.get("tests.support.cloud_providers")
    if fakes is not None:
        fakes.drain_fakes()


def _docker_leftovers(label: str | None = None) -> tuple[list[str], list[str]]:
    """Containers and images of this session (or ``label``) still on the engine; nothing when no engine answers."""
    if shutil.which("docker") is None or not os.path.exists("/var/run/docker.sock"):
        return [], []
    from tests.support.docker import labelled_containers, labelled_images, session_label

    label = label or session_label()
    try:
        return labelled_containers(label), labelled_images(label)
    except (OSError, subprocess.SubprocessError):
        return [], []


_LEAKS_KEY = "boxwright_docker_leaks"
_worker_leaks: list[str] = []  # on the xdist controller: what the workers reported


def _remove_leftovers(label: str | None = None) -> list[str]:
    """Removes this session's (or ``label``'s) containers and images still on the engine; the lines that name them."""
    containers, images = _docker_leftovers(label)
    if not containers and not images:
        return []
    from tests.support.docker import remove_images

    names = (
        subprocess.run(
            ["docker", "inspect", "--format", "{{.Name}} {{.Config.Image}}", *containers],
            capture_output=True,
            text=True,
        ).stdout.split("\n")
        if containers
        else []
    )
    tags = (
        subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}} {{.RepoTags}}", *images], capture_output=True, text=True
        ).stdout.split("\n")
        if images
        else []
    )
    if containers:
        subprocess.run(["docker", "rm", "-f", *containers], capture_output=True, timeout=120)
    remove_images(images)
    return [*[f"  container {line}" for line in names if line], *[f"  image {line}" for line in tags if line]]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """On the xdist controller: a worker's leftovers (its own exit status never reaches the controller's).

    A worker that died (killed, crashed) reported nothing and removed nothing: what carries its
    session's label is removed and reported here (a fake cloud's pool machines, a sandbox).
    """
    output = getattr(node, "workeroutput", None) or {}
    _worker_leaks.extend(output.get(_LEAKS_KEY, []))
    worker = (getattr(node, "workerinput", None) or {}).get("workerid")
    if _LEAKS_KEY not in output and worker:
        label = f"boxwright.test-session={os.environ['BOXWRIGHT_TEST_SESSION']}-{worker}"
        _worker_leaks.extend(f"{line} (worker {worker} died)" for line in _remove_leftovers(label))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test left a container or image behind (then remove them)."""
    fakes = sys.modules.get("tests.support.cloud_providers")
    # The fake clouds end with the session: a sandbox never destroyed, or a machine their cleanup
    # leaves, is a leak like any other.
    leaks = [*(fakes.close_fakes() if fakes is not None else []), *_remove_leftovers()]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        # A worker: the controller decides the run's status from what each worker reports.
        workeroutput[_LEAKS_KEY] = leaks
        return
    leaks = [*_worker_leaks, *leaks]
    if not leaks:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        "boxwright leak check: this session left Docker objects behind (now removed); a test must clean up:",
        *leaks,
    ]
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line("\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
