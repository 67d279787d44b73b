"""Co-located mode, host side: the runner in the container drives the harness; only tool execution crosses back.

``colocated_drive`` starts ``python -m boxwright.runner`` in the sandbox (its bearer token and
the harness's credentials in that exec's env only), waits for ``/health``, serves this run's
host tools on a tool-exec endpoint the container reaches (``host.docker.internal``), POSTs
the run and yields the runner's AG-UI events as they arrive. ``run_agent(mode="colocated")``
calls it in place of the host-driven drive, so the events land in the same durable log.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from .abort import AbortSignal
from .errors import UnsupportedCapabilityError
from .events import Event, RunErrorEvent, RunFinishedEvent, RunStartedEvent, decode_event
from .harnesses.base import Message
from .runner.protocol import RUNNER_TOKEN_ENV, ContainerRunRequest, RunnerWorkspace
from .sandbox import ProcessOptions, SandboxHandle
from .scrub import EventScrubber
from .tool_bridge.asgi import bind_address_for, host_for_sandbox, serve_asgi
from .tool_bridge.remote import ToolExecRun, tool_descriptors, tool_exec_app, tool_exec_path
from .tool_bridge.tools import Tool

RUNNER_PORT = 8080
HEALTH_PROBES = 20
HEALTH_EVERY = 0.25
_DETAIL = 200
# Env the harness needs from the host: credentials and the model endpoint (never other host env).
_HARNESS_ENV_PREFIXES = ("ANTHROPIC_", "CLAUDE_")


class ColocatedRunError(RuntimeError):
    code = "colocated_runner_failed"


async def _healthy(client: httpx.AsyncClient, base: str) -> None:
    last = "no probe answered"
    for _ in range(HEALTH_PROBES):
        try:
            response = await client.get(f"{base}/health", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:_DETAIL]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"[:_DETAIL]
        await asyncio.sleep(HEALTH_EVERY)
    raise ColocatedRunError(f"in-container runner did not become healthy in time: {last}")


async def colocated_drive(
    handle: SandboxHandle,
    harness: Any,
    *,
    run_id: str,
    thread_id: str,
    messages: Sequence[Message],
    tools: Sequence[Tool],
    host_env: Mapping[str, str],
    scrub: EventScrubber,
    signal: AbortSignal | None,
    cwd: str = "/workspace",
) -> AsyncGenerator[Event, None]:
    address = getattr(handle, "address", None)
    if address is None:
        raise UnsupportedCapabilityError(handle.provider, "colocated", "co-located mode needs the Docker provider")
    host = await address()
    runner_token = secrets.token_urlsafe(32)
    exec_token = secrets.token_urlsafe(32)
    scrub.add([runner_token, exec_token])
    env = {k: v for k, v in host_env.items() if k.startswith(_HARNESS_ENV_PREFIXES)}
    env.update(getattr(harness, "env", None) or {})
    scrub.add([v for k, v in env.items() if "KEY" in k or "TOKEN" in k])
    runner = await handle.process.spawn(
        f"exec python -m boxwright.runner --host {host} --port {RUNNER_PORT}",
        ProcessOptions(env={**env, RUNNER_TOKEN_ENV: runner_token}),
    )
    exec_server = await serve_asgi(
        tool_exec_app({run_id: ToolExecRun(tools, token=exec_token, thread_id=thread_id, signal=signal)}),
        host=bind_address_for(handle.provider),
    )
    base = f"http://{host}:{RUNNER_PORT}"
    headers = {"Authorization": f"Bearer {runner_token}"}
    tool_exec_url = (
        f"http://{host_for_sandbox(handle.provider)}:{exec_server.port}{tool_exec_path(run_id)}"
        f"?threadId={quote(thread_id, safe='')}"
    )
    request = ContainerRunRequest(
        run_id=run_id,
        thread_id=thread_id,
        messages=tuple(messages),
        harness="claude-code",
        model=getattr(harness, "model", None) or "claude-sonnet-4-5",
        workspace=RunnerWorkspace(path=cwd, secrets=tuple(sorted(env))),
        tool_descriptors=tuple(tool_descriptors(tools)),
        tool_exec_url=tool_exec_url,
        tool_exec_token=exec_token,
    )
    remove_listener = None
    cancels: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client:
        try:
            await _healthy(client, base)
            if signal is not None:

                def on_abort(_reason: object) -> None:
                    cancels.add(asyncio.ensure_future(_cancel(client, base, run_id, headers)))

                remove_listener = signal.add_listener(on_abort)
            body = msgspec.json.encode(request)
            async with client.stream("POST", f"{base}/run", content=body, headers=headers) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:_DETAIL]
                    raise ColocatedRunError(f"container runner failed: {response.status_code} {detail}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = decode_event(line)
                    except Exception:
                        yield RunErrorEvent(
                            message=f"runner sent unparseable NDJSON: {line[:_DETAIL]}", code="runner_protocol"
                        )
                        return
                    if isinstance(event, RunStartedEvent):
                        continue  # run_agent already said the run started
                    yield event
                    if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
                        return
            yield RunErrorEvent(message="the runner's stream ended without a terminal event", code="runner_protocol")
        finally:
            if remove_listener is not None:
                remove_listener()
            if cancels:
                await asyncio.wait(cancels, timeout=10.0)  # the runner heard the cancel before it is killed
            await exec_server.close()
            await runner.kill()


async def _cancel(client: httpx.AsyncClient, base: str, run_id: str, headers: Mapping[str, str]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        await client.post(f"{base}/runs/{quote(run_id, safe='')}/cancel", headers=dict(headers), timeout=10.0)
