"""Docker for tests: whether an engine answers, the images deploy/runner/build.sh makes, and suite configs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from boxwright.harnesses.claude_code import claude_code
from boxwright.testkit import ProviderSuiteConfig, RecordingLogger
from tests.support.require import missing

BASE_IMAGE = os.environ.get("BOXWRIGHT_BASE_IMAGE", "boxwright-base:bookworm")
RUNNER_IMAGE = os.environ.get("BOXWRIGHT_RUNNER_IMAGE", "boxwright-runner:latest")
BUILD_HELP = "run deploy/runner/build.sh (needs dockerd, debootstrap and the agent CLIs in /opt/boxwright-agents)"
# Every container a test creates carries this label, so the leak check sees only the tests' own.
TEST_LABEL = "boxwright.test"
# tests/conftest.py gives every container and image of one pytest session this label (through the
# provider's BOXWRIGHT_DOCKER_LABELS, which subprocesses inherit), so the session-end leak check sees
# its own session's leftovers and never those of another session running beside it.
SESSION_LABEL = "boxwright.test-session"
# A test's own label value (``CASE_LABEL=<case>``) beside TEST_LABEL: it finds, waits for and removes only its
# own containers, never those of a test running beside it in the same session.
CASE_LABEL = "boxwright.test.case"
# The runner secret the hosts of a co-located test share: each derives the same per-container runner token from
# it, so a successor host can attach to the runner its dead predecessor started.
RUNNER_SECRET = "test-runner-secret-" + secrets.token_hex(8)


@functools.cache
def engine_problem() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        return "the `docker` Python package is not installed (pip install 'boxwright[docker]')"
    try:
        client = docker.APIClient(version="auto", timeout=10)
        client.ping()
    except Exception as exc:
        return f"no Docker engine answers ({exc}); start dockerd"
    return None


@functools.cache
def image_problem(image: str) -> str | None:
    """None when ``image`` is on the engine, else why not."""
    problem = engine_problem()
    if problem is not None:
        return problem
    run = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30)
    if run.returncode != 0:
        return f"image {image!r} is not built; {BUILD_HELP}"
    return None


def require_image(image: str) -> str:
    """``image``, once the engine has it; else the test is skipped (failed where integration is required)."""
    if (problem := image_problem(image)) is not None:
        missing(problem)
    return image


@pytest.fixture(scope="module")
def base_image() -> str:
    """The base image, once the engine has it (a module's ``usefixtures``, or a test takes its name from it)."""
    return require_image(BASE_IMAGE)


@pytest.fixture(scope="module")
def runner_image() -> str:
    """The runner image, once the engine has it (a module's ``usefixtures``, or a test takes its name from it)."""
    return require_image(RUNNER_IMAGE)


def model_env_in_container(model_url: str) -> dict[str, str]:
    """The env that points a ``claude`` in a container at the fake model ``model_url`` (served on the Docker
    bridge, see ``bridge_address``): the container reaches the host's bridge address as host.docker.internal."""
    port = model_url.rsplit(":", 1)[1]
    return {"ANTHROPIC_BASE_URL": f"http://host.docker.internal:{port}", "ANTHROPIC_API_KEY": "sk-test"}


def claude_in_image() -> Any:
    """The real ``claude`` harness the tests run in the runner image: HOME is the image's agent user's home (where
    claude keeps its state), and no retries, so a failed model request fails the run at once, not after a backoff."""
    return claude_code("claude-sonnet-4-5", env={"HOME": "/home/agent", "CLAUDE_CODE_MAX_RETRIES": "0"})


def colocated_replica_env(model_url: str, case: str) -> dict[str, str]:
    """The env of a ``boxwright serve`` replica (tests/support/coordinator.py) whose ``docker`` profile runs the
    runner image, its containers labelled with ``case``; every replica given it shares the runner secret."""
    return {
        "BWT_RUNNER_IMAGE": RUNNER_IMAGE,
        "BWT_DOCKER_LABELS": f"{TEST_LABEL}=1,{CASE_LABEL}={case}",
        "BOXWRIGHT_RUNNER_SECRET": RUNNER_SECRET,
        **model_env_in_container(model_url),
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }


def docker_config(image: str = BASE_IMAGE, **extra: Any) -> ProviderSuiteConfig:
    from boxwright.providers.docker import docker_sandbox

    logger = RecordingLogger()
    provider = docker_sandbox(image, publish_ports=[8080], labels={TEST_LABEL: "1"}, logger=logger)

    async def create() -> tuple[Any, Any]:
        handle = await provider.create()

        async def dispose() -> None:
            await handle.destroy()
            # A snapshot outlives its sandbox by design (restore after destroy): the suite's (C16) go here.
            await asyncio.to_thread(remove_images, snapshots_of(handle.id))

        return handle, dispose

    return ProviderSuiteConfig(
        name="docker",
        create_handle=create,
        provider=provider,
        logger=logger,
        unsupported=image_problem(image),
        port=8080,
        **extra,
    )


def labelled_containers(label: str | None = None) -> list[str]:
    """Ids of containers (running or not) that carry ``label`` (by default: this session's)."""
    label = label or session_label()
    run = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={label}"], capture_output=True, text=True, timeout=30
    )
    return run.stdout.split()


def session_label() -> str:
    """``key=value`` of this session's label (``BOXWRIGHT_TEST_SESSION``, set by tests/conftest.py)."""
    return f"{SESSION_LABEL}={os.environ.get('BOXWRIGHT_TEST_SESSION', 'none')}"


def session_labels() -> dict[str, str]:
    """The labels a container made outside the Docker provider (a fake cloud's machine) carries: the
    test label and this session's, so the session-end leak check sees it as the provider's own."""
    return {TEST_LABEL: "1", SESSION_LABEL: os.environ.get("BOXWRIGHT_TEST_SESSION", "none")}


def labelled_images(label: str) -> list[str]:
    """Ids of images (tagged or dangling) that carry ``label``."""
    run = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return sorted(set(run.stdout.split()))


def snapshots_of(container: str) -> list[str]:
    """The snapshot images committed from ``container`` (their tags start with its short id)."""
    run = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "boxwright-snapshot"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [ref for ref in run.stdout.split() if ref.split(":", 1)[1].startswith(f"{container[:12]}-")]


def _session_snapshot_tags() -> list[str]:
    run = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"label={session_label()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [ref for ref in run.stdout.split() if ref.startswith("boxwright-snapshot:")]


def _image_id(ref: str) -> str:
    run = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True)
    return run.stdout.strip()


def remove_images(ids: list[str]) -> None:
    """Remove images by id, their tags and all (a leak check's cleanup; forced: its containers are gone)."""
    if ids:
        subprocess.run(["docker", "rmi", "-f", *ids], capture_output=True, timeout=120)


def bridge_address() -> str:
    """The host's address on the Docker bridge (docker0): a test server a container dials binds here, never 0.0.0.0."""
    from boxwright.tool_bridge.asgi import bind_address_for

    return bind_address_for("docker")


def repo_setup() -> list[str]:
    """Workspace setup commands making a one-commit git repository with README.md = "hello"."""
    return [
        "git init -q -b main",
        "git config user.email t@example.com && git config user.name t",
        "printf 'hello\\n' > README.md && git add . && git commit -q -m init",
    ]


@pytest.fixture(scope="module")
def no_leaked_containers() -> Iterator[None]:
    """After a module's tests, no container of this session is left (use it with ``usefixtures``).

    The after-setup snapshots ``ensure()`` keeps for a thread by design (restore after a destroy) are the
    module's to remove once its sandboxes are gone: removed here. Any other image a test leaves behind
    is a leak the session-end check in tests/conftest.py reports.
    """
    engine = engine_problem() is None
    before = set(labelled_images(session_label())) if engine else set()
    yield
    if engine:
        kept = [
            ref for ref in _session_snapshot_tags() if ref.endswith("-after-setup") and _image_id(ref) not in before
        ]
        remove_images(kept)
        deadline = time.monotonic() + 10
        while (left := labelled_containers()) and time.monotonic() < deadline:
            time.sleep(0.2)  # a destroy under way in a thread that just returned
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)
        assert left == [], f"containers left behind by the tests: {left}"


class EngineProxy:
    """A unix-socket relay to the real engine that can be cut, as a daemon that stops answering mid-run."""

    def __init__(self, directory: str, engine: str = "/var/run/docker.sock") -> None:
        import socket
        import threading

        self.path = os.path.join(directory, "docker-proxy.sock")
        self._engine = engine
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._engine)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # Half-close only, as the engine's hijacked exec does: a client ending stdin keeps its output.
            with contextlib.suppress(OSError):
                dst.shutdown(1)

    def cut(self) -> None:
        """Stop answering: no new connection, every open one (hijacked exec streams too) closed."""
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(2)
                    sock.close()
