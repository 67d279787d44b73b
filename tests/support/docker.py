"""Docker for tests: whether an engine answers, the images deploy/runner/build.sh makes, and suite configs."""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Any

from boxwright.testkit import ProviderSuiteConfig, RecordingLogger

BASE_IMAGE = os.environ.get("BOXWRIGHT_BASE_IMAGE", "boxwright-base:bookworm")
RUNNER_IMAGE = os.environ.get("BOXWRIGHT_RUNNER_IMAGE", "boxwright-runner:latest")
BUILD_HELP = "run deploy/runner/build.sh (needs dockerd, debootstrap and the agent CLIs in /opt/boxwright-agents)"
# Every container a test creates carries this label, so the leak check sees only the tests' own.
TEST_LABEL = "boxwright.test"


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


def docker_config(image: str = BASE_IMAGE, **extra: Any) -> ProviderSuiteConfig:
    from boxwright.providers.docker import docker_sandbox

    logger = RecordingLogger()
    provider = docker_sandbox(image, publish_ports=[8080], labels={TEST_LABEL: "1"}, logger=logger)

    async def create() -> tuple[Any, Any]:
        handle = await provider.create()
        return handle, handle.destroy

    return ProviderSuiteConfig(
        name="docker",
        create_handle=create,
        provider=provider,
        logger=logger,
        unsupported=image_problem(image),
        port=8080,
        **extra,
    )


def labelled_containers(label: str = TEST_LABEL) -> list[str]:
    """Ids of containers (running or not) that carry ``label``."""
    run = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, timeout=30
    )
    return run.stdout.split()
