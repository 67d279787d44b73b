"""deploy/compose.yaml's services up with the project's own images, and one demo run through them.

The engine here has no ``docker compose``, so the test starts what the file declares itself: each
coordinator service as a container of its image (``boxwright-coordinator:latest``, built by
deploy/coordinator/build.sh, cached by its content-hash label) with the file's command and
environment, and the Redis service as a redis-server this module owns (appendonly, the file's
flags). The containers share the host's network namespace so every server binds 127.0.0.1 only;
the file's ``--store redis://redis:6379/0`` becomes that server's address and each replica gets a
free port. A run triggered on replica A is read to its end through replica B (same store), then
every container is removed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.support.docker import CASE_LABEL, TEST_LABEL, engine_problem, labelled_containers
from tests.support.redis_server import redis_server
from tests.support.replicas import ROOT, free_port
from tests.support.require import missing

COMPOSE = ROOT / "deploy" / "compose.yaml"
IMAGE = "boxwright-coordinator:latest"
TOKENS = {
    "BOXWRIGHT_CLIENT_TOKEN": "deploy-test-client-" + secrets.token_hex(12),
    "BOXWRIGHT_ADMIN_TOKEN": "deploy-test-admin-" + secrets.token_hex(12),
    "BOXWRIGHT_RUNNER_SECRET": "deploy-test-runner-" + secrets.token_hex(12),
}


@pytest.fixture(scope="module")
def image() -> str:
    if (problem := engine_problem()) is not None:
        missing(problem)
    # Cached: a no-op when the image's content-hash label matches its inputs.
    built = subprocess.run([str(ROOT / "deploy/coordinator/build.sh")], capture_output=True, text=True, timeout=900)
    if built.returncode == 2:
        missing(built.stderr.strip())
    assert built.returncode == 0, built.stderr
    return IMAGE


def _argv(service: dict[str, Any], store: str, port: int) -> list[str]:
    """The service's command with the test's store and port; ``--host 127.0.0.1`` last (argparse: last wins)."""
    argv = list(service["command"])
    argv[argv.index("--store") + 1] = store
    argv[argv.index("--port") + 1] = str(port)
    return [*argv, "--host", "127.0.0.1"]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    # The file's values are ${VAR:?...} interpolations: each gets the test's value of VAR.
    return {name: TOKENS[name] for name in service["environment"]}


@contextlib.contextmanager
def _containers(case: str) -> Iterator[list[str]]:
    started: list[str] = []
    try:
        yield started
    finally:
        if started:
            subprocess.run(["docker", "rm", "-f", *started], capture_output=True, timeout=60)


def _wait_healthy(url: str, container: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True).stderr[-2000:]
    raise AssertionError(f"{container} did not answer /healthz in {timeout} s: {logs}")


@pytest.mark.timeout(900)
def test_the_compose_services_serve_a_demo_run_across_both_replicas(image: str) -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    replicas = [name for name, service in services.items() if service.get("image") == IMAGE]
    assert replicas == ["coordinator-a", "coordinator-b"], replicas
    assert "--appendonly" in services["redis"]["command"], "the Redis service keeps an AOF"
    assert services["runner"]["image"] == "boxwright-runner:latest"
    case = f"deploy-{secrets.token_hex(4)}"
    with redis_server() as redis, _containers(case) as started:
        store = redis.url(prefix=f"{case}:")
        urls = []
        for name in replicas:
            port = free_port()
            run = subprocess.run(
                ["docker", "run", "-d", "--network", "host", "--label", f"{TEST_LABEL}=1", "--label",
                 f"{CASE_LABEL}={case}", "--name", f"{case}-{name}"]
                + [arg for key, value in _environment(services[name]).items() for arg in ("-e", f"{key}={value}")]
                + [image, *_argv(services[name], store, port)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            started.append(run.stdout.strip())
            urls.append(f"http://127.0.0.1:{port}")
        for url, container in zip(urls, started, strict=True):
            _wait_healthy(url, container)
        headers = {"Authorization": f"Bearer {TOKENS['BOXWRIGHT_CLIENT_TOKEN']}"}
        thread, run_id = f"t-{case}", f"r-{case}"
        body = {"threadId": thread, "runId": run_id, "prompt": "say hello"}
        assert httpx.post(f"{urls[0]}/runs", json=body, headers=headers, timeout=30).status_code == 202
        assert httpx.post(f"{urls[1]}/runs", json=body).status_code == 401, "no token, no run"
        frames: list[tuple[str, str]] = []
        kind = "message"
        with httpx.stream(
            "GET", f"{urls[1]}/runs/{run_id}/events", params={"threadId": thread}, headers=headers,
            timeout=httpx.Timeout(10, read=120),
        ) as response:  # fmt: skip
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    frames.append((kind, line.split(":", 1)[1].strip()))
                    if kind == "status":
                        break
                    kind = "message"
    assert frames and frames[-1][0] == "status", frames[-3:]
    assert json.loads(frames[-1][1])["status"] == "completed", frames[-1]
    events = [json.loads(data) for kind, data in frames if kind == "message"]
    text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "hello from a boxwright coordinator" in text, [e["type"] for e in events]
    assert labelled_containers(f"{CASE_LABEL}={case}") == [], "every container of the case is removed"
