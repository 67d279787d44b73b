"""Coordinator replicas as real processes (``boxwright serve --config tests.support.coordinator:test_config``).

    with coordinators(CoordinatorProcess("a", tmp_path, agent), ...) as (a, ...):
        a.post("/runs", {...})

Every process started over the same store URL (default: a SQLite file) is one coordinator.
``test_config`` reads its knobs from the environment the helper sets: the agent (a shell command
run by the command harness in a local-process sandbox under ``BWT_BASE_DIR``), the lease, the
watchdog; ``BWT_MODEL_URL`` adds the ``claude`` harness (the real CLI against that fake model);
``BWT_RUNNER_IMAGE`` adds the co-located ``docker`` sandbox profile (labels ``BWT_DOCKER_LABELS=k=v,...``)
and its ``claude-box`` harness; ``BWT_DOCKER_BASE`` (an image) a host-driven ``docker-base`` one.
Its tool ``record_call`` appends its arguments to ``BWT_TOOL_LOG``, so a test sees
whether a callback ran anything; the ``bridge-env`` harness hands the agent its bridge URL and
token (``BOXWRIGHT_BRIDGE_URL`` / ``BOXWRIGHT_BRIDGE_TOKEN``) so a shell agent can call it.
A later chaos test or bench starts replicas over ``redis://`` with ``store=``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from boxwright.coordinator import Coordinator, CoordinatorConfig, create_coordinator_app
from boxwright.harnesses.base import HarnessContext, HarnessPlan
from boxwright.harnesses.command import CommandHarness
from boxwright.tool_bridge import serve_asgi
from boxwright.tool_bridge.tools import Tool, ToolContext, define_tool
from tests.support.replicas import ROOT, free_port
from tests.support.sse import Frame, parse_frames

CLIENT_TOKEN = "test-client-token-" + "x" * 16
ADMIN_TOKEN = "test-admin-token-" + "y" * 16


@dataclass(frozen=True)
class BridgeEnvHarness(CommandHarness):
    """The command harness, with the run's bridge URL and token in the agent's env (tests only)."""

    name: str = "command"

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        plan = super().plan(ctx)
        if ctx.bridge is not None:
            plan.env.update({"BOXWRIGHT_BRIDGE_URL": ctx.bridge.url, "BOXWRIGHT_BRIDGE_TOKEN": ctx.bridge.token})
        return plan


def record_call_tool(path: str) -> Tool:
    async def record(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        with open(path, "a") as out:
            out.write(json.dumps({"runId": ctx.run_id, "args": args}) + "\n")
        return {"recorded": True, "echo": args.get("text")}

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return define_tool("record_call", "Record that it was called (a test probe).", schema, record)


# The name of the ``docker-base`` profile's sandbox definition (part of its instance key): an in-process
# replica serving the same profile defines it under this name too.
DOCKER_BASE_SANDBOX = "coordinator-docker-base"


def test_config() -> CoordinatorConfig:
    """The config a test coordinator process serves (knobs from ``BWT_*`` environment variables)."""
    from boxwright.definition import define_sandbox
    from boxwright.providers import local_process_sandbox

    env = os.environ
    agent = env["BWT_AGENT"]
    sandbox = define_sandbox("coordinator-test", local_process_sandbox(base_dir=env["BWT_BASE_DIR"]))
    harnesses: dict[str, Any] = {
        "command": CommandHarness(command=agent),
        "bridge-env": BridgeEnvHarness(command=agent),
    }
    if env.get("BWT_MODEL_URL"):
        # The real claude against a fake model (tests/fixtures/fake_model.py) another process serves.
        from tests.support.agent_harnesses import claude_for

        home = env.get("BWT_CLAUDE_HOME") or os.path.join(env["BWT_BASE_DIR"], "claude-home")
        harnesses["claude"] = claude_for(env["BWT_MODEL_URL"], home)
    sandboxes: dict[str, Any] = {"local": sandbox}
    modes: dict[str, Any] = {}
    if env.get("BWT_RUNNER_IMAGE"):
        # Co-located: the real claude in the runner image drives; the model endpoint comes from $ANTHROPIC_*
        # and the runner token from $BOXWRIGHT_RUNNER_SECRET, which every replica of the test shares.
        from boxwright.definition import Lifecycle
        from boxwright.providers.docker import docker_sandbox
        from tests.support.docker import claude_in_image

        labels = dict(item.split("=", 1) for item in env.get("BWT_DOCKER_LABELS", "").split(",") if item)
        box = docker_sandbox(env["BWT_RUNNER_IMAGE"], labels=labels)
        sandboxes["docker"] = define_sandbox("coordinator-docker", box, lifecycle=Lifecycle(destroy_on_complete=True))
        modes["docker"] = "colocated"
        harnesses["claude-box"] = claude_in_image()
    if env.get("BWT_DOCKER_BASE"):
        # Host-driven Docker (the agent command runs in a plain image, BWT_AGENT as its shell line): a
        # sandbox whose destroy is observable from outside (its container is gone), whoever made it.
        from boxwright.providers.docker import docker_sandbox

        labels = dict(item.split("=", 1) for item in env.get("BWT_DOCKER_LABELS", "").split(",") if item)
        sandboxes["docker-base"] = define_sandbox(
            DOCKER_BASE_SANDBOX, docker_sandbox(env["BWT_DOCKER_BASE"], labels=labels)
        )
    return CoordinatorConfig(
        sandboxes=sandboxes,
        modes=modes,
        harnesses=harnesses,
        tools=[record_call_tool(env["BWT_TOOL_LOG"])],
        lease_ttl_ms=int(env.get("BWT_LEASE_MS", "1500")),
        inactivity_timeout=float(env.get("BWT_INACTIVITY_S", "0")),
        watchdog_interval=float(env.get("BWT_WATCHDOG_S", "30")),
        sweep_interval=float(env.get("BWT_SWEEP_S", "0")),
        drain_timeout=float(env.get("BWT_DRAIN_S", "25")),
    )


test_config.__test__ = False  # type: ignore[attr-defined]  # not a pytest test, whatever its name


class CoordinatorProcess:
    """One ``boxwright serve`` process; ``kill`` is SIGKILL, ``terminate`` SIGTERM (a graceful stop)."""

    def __init__(
        self,
        name: str,
        tmp: Path,
        agent: str,
        *,
        store: str | None = None,
        lease_ms: int = 1500,
        env: dict[str, str] | None = None,
        port: int | None = None,
        startup_s: float = 30.0,
        host: str = "127.0.0.1",
        root: Path = ROOT,
    ) -> None:
        # ``root``: the source tree the process runs from (a bench's baseline checkout; default this one).
        self.name = name
        self.tmp = tmp
        self.port = port or free_port()
        # ``host``: the Docker bridge address when a container must call this replica back (co-located tools).
        self.url = f"http://{host}:{self.port}"
        self.store = store or f"sqlite:///{tmp / 'coordinator.db'}"
        self.tool_log = tmp / "tool-calls.ndjson"
        self.stderr_path = tmp / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "ab")  # closed in close()
        argv = [sys.executable, "-m", "boxwright", "serve", "--config", "tests.support.coordinator:test_config"]
        argv += ["--store", self.store, "--host", host, "--port", str(self.port)]
        full_env = {
            **os.environ,
            "BWT_AGENT": agent,
            "BWT_BASE_DIR": str(tmp / "sandboxes"),
            "BWT_TOOL_LOG": str(self.tool_log),
            "BWT_LEASE_MS": str(lease_ms),
            "BOXWRIGHT_CLIENT_TOKEN": CLIENT_TOKEN,
            "BOXWRIGHT_ADMIN_TOKEN": ADMIN_TOKEN,
            **(env or {}),
        }
        self.proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=self._stderr, env=full_env)
        deadline = time.monotonic() + startup_s
        while True:
            if self.proc.poll() is not None:
                said = self.stderr()  # read before close() closes the file
                self.close()
                raise RuntimeError(f"coordinator {name} exited ({self.proc.returncode}): {said}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                said = self.stderr()
                self.close()
                raise RuntimeError(f"coordinator {name} did not answer /healthz in {startup_s} s: {said}")
            time.sleep(0.05)

    @staticmethod
    def headers(extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {CLIENT_TOKEN}", **(extra or {})}

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers(headers), timeout=30)

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers(headers), timeout=30)

    def tool_calls(self) -> list[dict[str, Any]]:
        if not self.tool_log.exists():
            return []
        return [json.loads(line) for line in self.tool_log.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)  # a stopped process dies too
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._stderr.close()


@contextlib.contextmanager
def coordinators(*made: CoordinatorProcess) -> Iterator[tuple[CoordinatorProcess, ...]]:
    try:
        yield made
    finally:
        for process in made:
            process.close()


def started_together(*makers: Callable[[], CoordinatorProcess]) -> tuple[CoordinatorProcess, ...]:
    """Replicas started side by side (their interpreter startups overlap); if one fails, the others are closed."""
    with concurrent.futures.ThreadPoolExecutor(len(makers)) as pool:
        futures = [pool.submit(make) for make in makers]
    made: list[CoordinatorProcess] = []
    errors: list[BaseException] = []
    for future in futures:
        error = future.exception()
        if error is None:
            made.append(future.result())
        else:
            errors.append(error)
    if errors:
        for process in made:
            process.close()
        raise errors[0]
    return tuple(made)


def run_id_for(tmp: Path, label: str) -> str:
    return f"{label}-{tmp.name[-10:]}-{secrets.token_hex(3)}"


def sse_events(
    base: str,
    run_id: str,
    thread_id: str,
    *,
    last_event_id: str | None = None,
    limit: int | None = None,
    timeout: float = 60,
) -> list[Frame]:
    """``(event, id, data)`` of an SSE tail, until the status event (or ``limit`` data events)."""
    headers = CoordinatorProcess.headers({"Last-Event-ID": last_event_id} if last_event_id else None)
    out: list[Frame] = []
    url = f"{base}/runs/{run_id}/events"
    with httpx.stream(
        "GET", url, params={"threadId": thread_id}, headers=headers, timeout=httpx.Timeout(10, read=timeout)
    ) as response:
        response.raise_for_status()
        for frame in parse_frames(response.iter_lines()):
            out.append(frame)
            if frame.event == "status" or (limit is not None and len(out) >= limit):
                return out
    return out


@contextlib.asynccontextmanager
async def coordinator_server(config: CoordinatorConfig) -> AsyncIterator[tuple[str, Coordinator]]:
    """``config``'s app under uvicorn on 127.0.0.1 in this process, its lifespan on: ``(url, coordinator)``."""
    app = create_coordinator_app(config)
    server = await serve_asgi(app, lifespan="on")
    try:
        yield server.url, app.state.coordinator
    finally:
        await server.close()


def client_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return CoordinatorProcess.headers(extra)


async def wait_record(url: str, run_id: str, thread_id: str, *, status: tuple[str, ...], timeout: float = 60) -> Any:
    """The run's record once its status is one of ``status`` (polled through GET /runs/{id})."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(headers=client_headers(), timeout=10) as http:
        while True:
            response = await http.get(f"{url}/runs/{run_id}", params={"threadId": thread_id})
            if response.status_code == 200 and response.json()["status"] in status:
                return response.json()
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id}: no status in {status} after {timeout} s: {response.text}")
            await asyncio.sleep(0.05)


# A scripted agent for the command harness: its prompt says what to do.
#   "lines N SECONDS"   print N lines, SECONDS apart
#   "bridge SECONDS"    print its bridge URL, call record_call once through it, then sleep SECONDS
#   "quiet SECONDS"     print one line, then nothing for SECONDS
SCRIPTED_AGENT = r"""
import json, os, sys, time, urllib.request
words = sys.stdin.read().split()
verb, args = words[0], [float(w) for w in words[1:]]
if verb == "lines":
    for i in range(int(args[0])):
        print(f"line {i + 1}", flush=True)
        time.sleep(args[1])
elif verb == "bridge":
    url = os.environ.get("BOXWRIGHT_BRIDGE_URL", "none")
    print(f"bridge-url={url}", flush=True)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "record_call", "arguments": {"text": "from the agent"}}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": "Bearer " + os.environ["BOXWRIGHT_BRIDGE_TOKEN"], "Content-Type": "application/json",
        "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        print(f"bridge-status={response.status}", flush=True)
    time.sleep(args[0])
elif verb == "quiet":
    print("started", flush=True)
    time.sleep(args[0])
"""


def scripted_agent(tmp: Path) -> str:
    """The shell command running ``SCRIPTED_AGENT`` (written under ``tmp``) with this interpreter."""
    path = tmp / "scripted_agent.py"
    path.write_text(SCRIPTED_AGENT)
    return f"{sys.executable} {path}"


def trigger(thread_id: str, prompt: str, run_id: str | None = None, **metadata: Any) -> dict[str, Any]:
    """A ``POST /runs`` body with one user message."""
    body: dict[str, Any] = {"threadId": thread_id, "messages": [{"role": "user", "content": prompt}]}
    if run_id is not None:
        body["runId"] = run_id
    if metadata:
        body["metadata"] = metadata
    return body
