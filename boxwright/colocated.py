"""Co-located mode, host side: the runner in the container drives the harness; only tool execution crosses back.

``colocated_drive`` starts ``python -m boxwright.runner`` in the sandbox (its bearer token on its
stdin, ``runner.launch``; the harness's credentials in that exec's env only), waits for
``/health`` (a Docker container on its own address, any other provider through its port API:
``runner_endpoint``), serves this run's host tools on a tool-exec endpoint the container reaches,
POSTs the run and yields the runner's AG-UI events as they arrive. The endpoint is a
``ToolExecHost``'s grant when one is given (the coordinator's ``/tool-exec`` on its public
callback origin), else a listener of this drive's own (``host.docker.internal``). ``run_agent(mode="colocated")``
calls it in place of the host-driven drive, so the events land in the same durable log.

A durable run outlives its host: the runner's run is a task of the runner, not of the host's
connection, and a tool call made while no host answers is held for a successor
(``runner.tool_exec``). With ``attach=True`` (a takeover) the successor re-points the run's
tool-exec URL and run token to its own endpoint (``POST /runs/{id}/attach``) and re-reads the
runner's NDJSON from byte 0; the takeover's ``align_to_stored_log`` drops what the durable log
already holds (the same bytes, so the same fingerprints) and forwards the rest. A takeover finds
nothing to attach to when its predecessor died before the runner had the run (right after the
trigger, before the container or the runner existed; or between its first recorded event and its
``/run``): no runner answers in the box, or the runner does not know the run. Then, and only if
the log holds nothing the runner produced (the host's own RUN_STARTED and ``run.accepted`` at
most), the successor starts the run itself through ``/run`` from the run's stored input
(``fresh``), as a host-driven successor does when there is no journal; the runner's ``/run`` is
idempotent per run id, so a predecessor's request that still landed starts no second agent. A run
the runner did produce recorded events for but no longer has (its container was replaced) fails:
its agent's work is gone.
A drive that stops without the run's end (a detach, a lost claim) leaves the runner running; the
host that reads the end shuts the runner down (``POST /shutdown``: accepted at once, and the runner
stops when the run's clean-up is done). A host killed between that and the terminal record leaves a
successor no runner, and a log that already ends: the stored end stands, and the record says it.

The runner token is derived, never stored: ``runner_token(secret, sandbox id)`` is an HMAC-SHA256
of the sandbox (container) id under a secret every host entitled to the run shares
(``runner_secret=`` or ``$BOXWRIGHT_RUNNER_SECRET``). Why not read it back from the box: the token
is handed to the runner on its stdin, never in any env or config (which ``docker inspect``, every
committed snapshot and the agent's ``/proc`` would show), and the runner is non-dumpable, so
nothing outside its memory holds it. The HMAC needs nothing from the sandbox but its id, which the
run record's sandbox key already leads to; it works for any provider with an address; and it differs
per container, so a box that learns its own token learns no other's. A run that is not durable
needs no successor and gets a random token when no secret is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import httpx
import msgspec

from .abort import AbortController, AbortSignal
from .definition import CANCEL_REASON
from .errors import UnsupportedCapabilityError
from .events import CustomEvent, Event, RunErrorEvent, RunFinishedEvent, RunStartedEvent, decode_event
from .harnesses.base import Message
from .journal import Finished, Producing, RunExitProbe, Unknown
from .runner.launch import spawn_runner
from .runner.protocol import ContainerRunRequest, RunnerWorkspace
from .runner.tool_exec import DEFAULT_HOLD
from .runs import RUN_ACCEPTED_EVENT
from .sandbox import SandboxHandle, SpawnHandle
from .scrub import EventScrubber
from .secrets import mint_token
from .tool_bridge.asgi import bind_address_for, host_for_sandbox
from .tool_bridge.remote import ToolExecRun, serve_tool_exec, tool_descriptors, tool_exec_path
from .tool_bridge.tools import Tool

if TYPE_CHECKING:
    from .reaper import HandleFor, HasFinished
    from .runs import RunRecord

RUNNER_PORT = 8080
# The runner image's venv (deploy/runner/Dockerfile): its boxwright-python symlink does not find the venv.
RUNNER_PYTHON = "/opt/boxwright/bin/python"
# How long the runner may take to answer /health: it imports boxwright in the box first, which on a loaded
# machine (or behind a vendor's proxy, each probe a round trip through it) took 7 s where 20 probes gave 5-13 s.
HEALTH_WAIT = 60.0
HEALTH_EVERY = 0.25
_DETAIL = 200
RUNNER_SECRET_ENV = "BOXWRIGHT_RUNNER_SECRET"
# In the box, not /workspace: the run's file events and diff must not see it.
RUNNER_LOG = "/tmp/boxwright-runner.log"
# Env the harness needs from the host: credentials and the model endpoint (never other host env).
_HARNESS_ENV_PREFIXES = ("ANTHROPIC_", "CLAUDE_")

log = logging.getLogger("boxwright.agent")


class ColocatedRunError(RuntimeError):
    code = "colocated_runner_failed"


class ToolExecGrantLike(Protocol):
    """One run's tool-exec endpoint: the URL the runner posts to and its bearer token; ``close()`` ends it."""

    @property
    def url(self) -> str: ...

    @property
    def token(self) -> str: ...

    def close(self) -> None: ...


class ToolExecHost(Protocol):
    """Serves co-located runs' host tools on an endpoint of its own (the coordinator's ``ToolExecRegistry``).

    ``register`` serves ``tools`` for ``run_id`` under ``token`` (minted when ``None``) until the grant
    is closed; ``provider`` is the sandbox's, so the URL is one that sandbox can reach.
    """

    def register(
        self,
        run_id: str,
        tools: Sequence[Tool],
        *,
        thread_id: str,
        signal: AbortSignal | None = None,
        token: str | None = None,
        provider: str | None = None,
    ) -> ToolExecGrantLike: ...


class RunnerEndpoint(msgspec.Struct, frozen=True):
    """Where the host reaches the runner in the box: its base URL, the provider's headers, the address it binds."""

    base: str
    headers: dict[str, str]
    bind: str
    secrets: tuple[str, ...] = ()


async def runner_endpoint(handle: SandboxHandle) -> RunnerEndpoint:
    """The runner's endpoint: a Docker container's own address, else the provider's port API (its preview URL).

    A Docker container is reached on its bridge address directly (no proxy in between). Any other
    provider publishes the runner's port the way it publishes every port (E2B's ``get_host``,
    Daytona's signed preview URL, Railway's domain), with that provider's auth headers; the runner
    then binds every interface of its box, since the vendor's proxy dials it from outside the box.
    """
    address = getattr(handle, "address", None)
    if address is not None:
        host = await address()
        return RunnerEndpoint(base=f"http://{host}:{RUNNER_PORT}", headers={}, bind=host)
    if not handle.capabilities.ports:
        raise UnsupportedCapabilityError(
            handle.provider, "colocated", "co-located mode reaches the runner through the provider's ports"
        )
    found = await handle.ports.connect(RUNNER_PORT)
    headers = dict(found.headers or {})
    values = tuple(v for v in (found.token, *headers.values()) if v)
    return RunnerEndpoint(base=found.url.rstrip("/"), headers=headers, bind="0.0.0.0", secrets=values)


async def _healthy(client: httpx.AsyncClient, base: str, handle: SandboxHandle, headers: Mapping[str, str]) -> None:
    last = "no probe answered"
    deadline = asyncio.get_running_loop().time() + HEALTH_WAIT
    while asyncio.get_running_loop().time() < deadline:
        try:
            response = await client.get(f"{base}/health", headers=dict(headers), timeout=2.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:_DETAIL]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"[:_DETAIL]
        await asyncio.sleep(HEALTH_EVERY)
    said = ""
    with contextlib.suppress(Exception):
        said = (await handle.process.exec(f"tail -c 300 {RUNNER_LOG}")).stdout.strip()
    raise ColocatedRunError(
        f"in-container runner did not become healthy in time: {last}" + (f"; its log ends: {said}" if said else "")
    )


class _NothingToAttach(msgspec.Struct, frozen=True):
    """Why a takeover found no run to attach to: ``detail`` for the error; ``runner_up``: a runner answered."""

    detail: str
    runner_up: bool


async def _reattach(
    client: httpx.AsyncClient,
    base: str,
    vendor: Mapping[str, str],
    run_path: str,
    headers: Mapping[str, str],
    tool_exec: Mapping[str, str],
) -> _NothingToAttach | None:
    """Re-point the runner's run to this host (``None``); what there was instead when it has no such run.

    A runner that answers without ``attach`` (R32), or refuses the attach otherwise, fails the
    takeover at once: the run may be going on in it, so nothing may start it a second time.
    """
    try:
        response = await client.get(f"{base}/health", headers=dict(vendor), timeout=10.0)
    except httpx.HTTPError as exc:
        return _NothingToAttach(f"{type(exc).__name__}: {exc} (no runner answers in the box)", runner_up=False)
    try:
        health = response.json() if response.status_code == 200 else None
    except ValueError:
        health = None
    if not isinstance(health, dict) or health.get("attach") is not True:
        raise ColocatedRunError("driver lost; runner cannot re-attach (its /health does not report attach)")
    moved = await client.post(f"{run_path}/attach", json=dict(tool_exec), headers=dict(headers))
    if moved.status_code == 404 and moved.text == "unknown run":
        return _NothingToAttach("the runner does not know the run", runner_up=True)
    if moved.status_code != 200:
        raise ColocatedRunError(f"driver lost; runner cannot re-attach: {moved.status_code} {moved.text[:_DETAIL]}")
    return None


def _hosts_own(event: Event) -> bool:
    """Whether the host wrote ``event`` itself before any runner line (the run's start, its announcement)."""
    if isinstance(event, RunStartedEvent):
        return True
    return isinstance(event, CustomEvent) and event.name == RUN_ACCEPTED_EVENT


async def _may_start_afresh(
    run_id: str,
    lost: _NothingToAttach,
    fresh: Sequence[Message] | None,
    logged: Callable[[], Awaitable[Sequence[Event]]] | None,
) -> Sequence[Message]:
    """The input to start ``run_id`` from when nothing the runner produced was recorded; else the takeover's error.

    The host itself records only RUN_STARTED and ``run.accepted`` before the runner's first line
    (``run_agent``, ``pipe_to_run_log``; the runner's own RUN_STARTED is dropped by the drive): a
    log with nothing else means the agent's work reached nobody, so starting it again repeats
    nothing a client saw. Anything more came from a runner that no longer has the run (its
    container was replaced, say): that work is lost, and starting over would tell the client a
    second, different story.
    """
    cannot = f"driver lost; runner cannot re-attach: {lost.detail}"[:_DETAIL]
    if fresh is None or logged is None:
        raise ColocatedRunError(cannot)
    produced = [event for event in await logged() if not _hosts_own(event)]
    if produced and isinstance(produced[-1], (RunFinishedEvent, RunErrorEvent)):
        # The predecessor read the run's end, stored it and shut the runner down, then died before the
        # record said so: nothing is lost, and the stored end stands (``pipe_to_run_log`` keeps it).
        raise ColocatedRunError(f"{cannot}; the run's end ({produced[-1].type}) is recorded already")
    if produced:
        kinds = ", ".join(sorted({getattr(event, "name", None) or event.type for event in produced}))
        raise ColocatedRunError(
            f"{cannot}; {len(produced)} event(s) of the runner's are recorded ({kinds[:_DETAIL]}) and it no longer "
            "has the run (its container was replaced?): the run cannot be resumed"
        )
    log.warning("run %s: %s, and nothing it produced is recorded: starting it now", run_id, lost.detail[:_DETAIL])
    return fresh


def _bad_line(line: str) -> str:
    """Why a runner's NDJSON line is no event: not JSON at all, or JSON that is not a chunk (no ``type``)."""
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return f"runner sent unparseable NDJSON: {line[:_DETAIL]}"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return f"runner sent a non-chunk line: {line[:_DETAIL]}"
    return f"runner sent an event this host cannot read: {line[:_DETAIL]}"


def runner_token(secret: str, sandbox_id: str) -> str:
    """The runner's bearer token for the sandbox ``sandbox_id``: any host with the shared secret derives it."""
    return hmac.new(secret.encode(), f"boxwright runner token v1\0{sandbox_id}".encode(), hashlib.sha256).hexdigest()


def _tokens_for(handle: SandboxHandle, run_id: str, runner_secret: str | None, durable: bool) -> tuple[str, str]:
    """(the runner's token, the run's tool-exec token)."""
    secret = runner_secret if runner_secret is not None else os.environ.get(RUNNER_SECRET_ENV)
    if secret:
        # The tool-exec token is derived too, though it needs no recovery (a successor sends its own with
        # attach): every host of the run then scrubs the same values, and a scrubber holds back a delta's
        # tail by the secrets' prefixes, so different ones would re-chunk the replayed text differently
        # from what the predecessor stored, and the takeover's alignment would call that a divergence.
        exec_token = hmac.new(
            secret.encode(), f"boxwright tool-exec token v1\0{handle.id}\0{run_id}".encode(), hashlib.sha256
        ).hexdigest()
        return runner_token(secret, handle.id), exec_token
    if durable:
        raise ColocatedRunError(
            "a durable co-located run needs a runner secret that every host which may take it over shares: "
            f"pass runner_secret= (SandboxService(runner_secret=...)) or set ${RUNNER_SECRET_ENV}"
        )
    return mint_token(), mint_token()


async def _next_line(lines: AsyncIterator[str], stop: AbortSignal) -> str | None:
    """The next NDJSON line, or ``None`` at the end of the stream or once ``stop`` aborted (the read is cancelled)."""
    if stop.aborted:
        return None
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:
            remove = stop.add_listener(lambda _reason: scope.reschedule(loop.time()))
            try:
                return await anext(lines)
            finally:
                remove()
    except StopAsyncIteration:
        return None
    except TimeoutError:
        if stop.aborted:
            return None
        raise


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
    durable: bool = False,
    attach: bool = False,
    runner_secret: str | None = None,
    owns: Callable[[], bool] = lambda: True,
    hold: float = DEFAULT_HOLD,
    tool_exec: ToolExecHost | None = None,
    fresh: Sequence[Message] | None = None,
    logged: Callable[[], Awaitable[Sequence[Event]]] | None = None,
) -> AsyncGenerator[Event, None]:
    """The run's events from the runner; ``attach=True`` takes over a run another host started (module doc).

    ``durable``: the run outlives this drive (a detach or a lost claim leaves the runner going, and
    only an explicit cancel stops it); ``owns()`` says whether this drive still owns the sandbox
    (a superseded one shuts nothing down); ``hold``: seconds a tool call no host answers is held;
    ``tool_exec``: where this run's host tools are served (default: a listener of this drive's own).
    ``fresh`` / ``logged`` (a takeover's): the run's stored input and its stored events; with both,
    a run the runner never had is started from ``fresh`` instead of failing (module doc).
    """
    endpoint = await runner_endpoint(handle)
    token, exec_token = _tokens_for(handle, run_id, runner_secret, durable)
    scrub.add([token, exec_token, *endpoint.secrets])
    env = {k: v for k, v in host_env.items() if k.startswith(_HARNESS_ENV_PREFIXES)}
    env.update(getattr(harness, "env", None) or {})
    scrub.add([v for k, v in env.items() if "KEY" in k or "TOKEN" in k])
    base = endpoint.base
    vendor = endpoint.headers
    headers = {**vendor, "Authorization": f"Bearer {token}"}
    run_path = f"{base}/runs/{quote(run_id, safe='')}"
    if tool_exec is not None:
        # The host's own endpoint (a coordinator's /tool-exec on its public origin): on a takeover the
        # runner is re-pointed to the successor's grant, so a tool call lands on whoever drives now.
        grant = tool_exec.register(
            run_id, tools, thread_id=thread_id, signal=signal, token=exec_token, provider=handle.provider
        )
        tool_exec_url, close_endpoint = grant.url, _closer(grant)
    else:
        exec_server = await serve_tool_exec(
            {run_id: ToolExecRun(tools, token=exec_token, thread_id=thread_id, signal=signal)},
            host=bind_address_for(handle.provider),
        )
        tool_exec_url = (
            f"http://{host_for_sandbox(handle.provider)}:{exec_server.port}{tool_exec_path(run_id)}"
            f"?threadId={quote(thread_id, safe='')}"
        )
        close_endpoint = exec_server.close
    runner: SpawnHandle | None = None
    finished = False
    # Aborted when this drive stops reading but the run goes on (a durable run's detach or lost claim).
    stop = AbortController()
    remove_listener = None
    cancels: set[asyncio.Task[None]] = set()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client:
            try:
                lost: _NothingToAttach | None = None
                if attach:
                    target = {"toolExecUrl": tool_exec_url, "toolExecToken": exec_token}
                    lost = await _reattach(client, base, vendor, run_path, headers, target)
                    if lost is not None:
                        messages = await _may_start_afresh(run_id, lost, fresh, logged)
                if attach and lost is None:
                    # From byte 0: the takeover's alignment drops what the durable log already holds.
                    stream = client.stream("GET", f"{run_path}/events?offset=0", headers=headers)
                else:
                    if lost is None or not lost.runner_up:
                        # Its token on its stdin (or a file it unlinks), never in its env: the agent, same
                        # user, reads that from /proc. Its output goes to a file in the box, not back over
                        # this exec: the runner must not depend on (or block on) a host that may die mid-run.
                        # The runner image's venv by its path: a vendor's exec PATH may not lead there
                        # (``python`` is then not boxwright's, or none at all). A takeover's runner may meet
                        # one its predecessor started that was still booting: one of the two binds the
                        # port, the other exits, and both hold the same derived token.
                        runner = await spawn_runner(
                            handle,
                            token,
                            host=endpoint.bind,
                            port=RUNNER_PORT,
                            env=env,
                            log=RUNNER_LOG,
                            python=RUNNER_PYTHON,
                        )
                    await _healthy(client, base, handle, vendor)
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
                        tool_exec_hold_seconds=hold,
                    )
                    stream = client.stream("POST", f"{base}/run", content=msgspec.json.encode(request), headers=headers)
                if signal is not None:

                    def on_abort(reason: object) -> None:
                        if durable and reason != CANCEL_REASON:
                            stop.abort(reason)  # the run goes on in the box; a later driver reports its end
                        else:
                            cancels.add(asyncio.ensure_future(_cancel(client, run_path, headers)))

                    remove_listener = signal.add_listener(on_abort)
                async with stream as response:
                    if response.status_code != 200:
                        detail = (await response.aread()).decode(errors="replace")[:_DETAIL]
                        raise ColocatedRunError(f"container runner failed: {response.status_code} {detail}")
                    lines = response.aiter_lines()
                    while (line := await _next_line(lines, stop.signal)) is not None:
                        if not line.strip():
                            continue
                        try:
                            event = decode_event(line)
                        except Exception:
                            yield RunErrorEvent(message=_bad_line(line), code="runner_protocol")
                            return
                        if isinstance(event, RunStartedEvent):
                            continue  # run_agent already said the run started
                        if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
                            finished = True  # before the yield: the consumer may close us there
                            yield event
                            return
                        yield event
                if stop.signal.aborted:
                    return
                yield RunErrorEvent(
                    message="the runner's stream ended without a terminal event", code="runner_protocol"
                )
            finally:
                if remove_listener is not None:
                    remove_listener()
                if cancels:
                    await asyncio.wait(cancels, timeout=10.0)  # the runner heard the cancel before it is killed
                if finished and owns():
                    # The run's end was read: the runner has nothing left to do, and the port is for the next run.
                    with contextlib.suppress(httpx.HTTPError):
                        await client.post(f"{base}/shutdown", headers=headers, timeout=10.0)
    finally:
        await close_endpoint()
        if runner is not None and (finished or not durable):
            await runner.kill()


async def probe_colocated_run_exit(
    handle: SandboxHandle, run_id: str, *, runner_secret: str | None = None, timeout: float = 10.0
) -> RunExitProbe:
    """Whether a co-located run's agent ended, asked of the runner in its box (``GET /runs/{id}``); read-only.

    The co-located ``has_finished`` of ``reap_detached_runs`` (``has_finished_via_runner``): ``Finished(0)``
    after RUN_FINISHED, ``Finished(1)`` after RUN_ERROR, ``Producing()`` while it goes on; a runner that
    does not answer or does not know the run is ``Unknown`` (never ``Finished``: that destroys the sandbox).
    """
    secret = runner_secret if runner_secret is not None else os.environ.get(RUNNER_SECRET_ENV)
    if not secret:
        return Unknown(f"no runner secret to derive the runner's token from (${RUNNER_SECRET_ENV})")
    try:
        endpoint = await runner_endpoint(handle)
        headers = {**endpoint.headers, "Authorization": f"Bearer {runner_token(secret, handle.id)}"}
        async with httpx.AsyncClient(timeout=timeout) as client:
            response = await client.get(f"{endpoint.base}/runs/{quote(run_id, safe='')}", headers=headers)
        if response.status_code != 200:
            return Unknown(f"the runner answered {response.status_code} {response.text[:_DETAIL]}")
        status = response.json()
    except Exception as exc:
        return Unknown(f"no runner answers: {type(exc).__name__}: {exc}"[:_DETAIL])
    if not isinstance(status, dict) or status.get("done") is not True:
        return Producing()
    return Finished(0 if status.get("ended") == "RUN_FINISHED" else 1)


def has_finished_via_runner(handle_for: HandleFor, *, runner_secret: str | None = None) -> HasFinished:
    """A ``has_finished`` for ``reap_detached_runs`` over co-located runs: ``probe_colocated_run_exit``."""

    async def has_finished(record: RunRecord) -> RunExitProbe:
        try:
            handle = await handle_for(record)
        except Exception as exc:
            return Unknown(f"{type(exc).__name__}: {exc}"[:_DETAIL])
        if handle is None:
            return Unknown(f"no sandbox handle for run {record.run_id!r} (sandbox key {record.sandbox_key!r})")
        return await probe_colocated_run_exit(handle, record.run_id, runner_secret=runner_secret)

    return has_finished


def _closer(grant: ToolExecGrantLike) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        grant.close()

    return close


async def _cancel(client: httpx.AsyncClient, run_path: str, headers: Mapping[str, str]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        await client.post(f"{run_path}/cancel", headers=dict(headers), timeout=10.0)
