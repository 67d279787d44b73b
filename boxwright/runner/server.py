"""The runner's ASGI app: runs the harness on the local-process provider inside the container.

Each run's AG-UI events go to an NDJSON file as they come, and every reader (the ``/run``
response itself, or ``GET /runs/{id}/events?offset=N`` after a disconnect) reads that file:
a host that lost the connection re-reads from byte 0 and sees the same bytes. The run is a
task of the server, not of the request, so a dropped connection (or a SIGKILLed host) does not
stop the agent; ``POST /runs/{id}/cancel`` does.

A successor host takes a run over with ``POST /runs/{id}/attach`` (``{toolExecUrl,
toolExecToken}``, under the runner token): the run's tool-exec calls go to it from then on
(``runner.tool_exec``: calls made while no host answered were held for it), and it re-reads the
NDJSON from byte 0. A ``/run`` of a run id the runner already has starts nothing: it does what an
attach does (a successor that found no run to attach to posts the run itself, and its
predecessor's ``/run`` may have landed meanwhile). ``POST /shutdown`` stops the runner once no run
is going (the host that read a run's end sends it, so the container's port is free for the next
run): refused (409) while a run has not written its end, else accepted at once, and the runner
stops when the runs' clean-up is done, starting no new run meanwhile (503). ``/health`` says
``attach: true``; ``GET /runs/{id}`` says whether a run's agent ended (``done``, ``ended``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..abort import AbortController
from ..events import RunErrorEvent, RunFinishedEvent, encode_event
from ..sandbox import WORKSPACE
from .protocol import (
    ContainerRunRequest,
    RunnerRequestError,
    parse_container_run_request,
    parse_runner_attach_request,
)
from .tool_exec import ToolExecTarget, held_tool_exec_client

NDJSON = "application/x-ndjson"
_MAX_BODY = 4 << 20
# Past any file the runner writes; a larger one made ``seek`` raise mid-response (a cut stream, a traceback).
_MAX_OFFSET = 1 << 53


async def _bounded_body(request: Request) -> bytes | None:
    """The body, or None once it is over ``_MAX_BODY``: refused on a declared length, never buffered whole."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > _MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _version() -> str:
    try:
        return version("boxwright")
    except PackageNotFoundError:
        return "0"


@dataclass(eq=False)
class _Run:
    path: str
    target: ToolExecTarget
    controller: AbortController = field(default_factory=AbortController)
    grew: asyncio.Condition = field(default_factory=asyncio.Condition)
    done: bool = False
    task: asyncio.Task[None] | None = None
    ended: str | None = None  # the type of its terminal line (RUN_FINISHED, RUN_ERROR) once written


class RunnerState:
    def __init__(self, token: str, directory: str, on_shutdown: Callable[[], None] | None = None) -> None:
        self.token = token.encode()
        self.directory = directory
        self.runs: dict[str, _Run] = {}
        self._on_shutdown = on_shutdown
        self.stopping = False  # ``/shutdown`` was accepted: no new run, and the runner stops once all are done
        self._stopped = False

    def stop_when_idle(self) -> None:
        """After an accepted ``/shutdown``, and as each run's clean-up ends: stop once every run is done."""
        if not self.stopping or self._stopped or any(not run.done for run in self.runs.values()):
            return
        self._stopped = True
        if self._on_shutdown is not None:
            # Soon, not now: uvicorn finishes the responses in flight (the 202 among them) before it exits.
            asyncio.get_running_loop().call_soon(self._on_shutdown)

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, b"Bearer " + self.token)


# Builds the harness a run asks for: (harness name, model, the env the runner hands the agent) -> a Harness.
ResolveAdapter = Callable[[str, str, Mapping[str, str]], Any]


def _claude_code(harness: str, model: str, env: Mapping[str, str]) -> Any:
    from ..harnesses.claude_code import claude_code

    return claude_code(model, env={"HOME": env.get("HOME", "/tmp")})


async def _execute(
    request: ContainerRunRequest, run: _Run, resolve_adapter: ResolveAdapter, state: RunnerState
) -> None:
    from ..agent import run_agent
    from ..definition import define_sandbox
    from ..providers import local_process_sandbox
    from ..stores.memory import MemoryInstanceStore
    from ..tool_bridge.remote import http_remote_tool_executor, remote_tool_stubs

    env = {n: os.environ[n] for n in request.workspace.secrets}
    for name in ("PATH", "HOME", "LANG"):
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    # The URL and token the host posted are only the first target: a successor re-points them.
    client = held_tool_exec_client(run.target, hold=request.tool_exec_hold_seconds)
    executor = http_remote_tool_executor(request.tool_exec_url, request.tool_exec_token, client=client)
    sandbox = define_sandbox("runner", local_process_sandbox(request.workspace.path, remove_on_destroy=False))
    with open(run.path, "ab") as out:
        try:
            harness = resolve_adapter(request.harness, request.model, env)
            stream = run_agent(
                sandbox,
                harness,
                list(request.messages),
                thread_id=request.thread_id,
                run_id=request.run_id,
                tools=remote_tool_stubs(request.tool_descriptors, executor),
                signal=run.controller.signal,
                store=MemoryInstanceStore(),
                host_env=env,
                # The sandbox's own name for its directory (the workspace path on this host): the
                # same path in the image, where the workspace is /workspace, and right anywhere else.
                cwd=WORKSPACE,
            )
            async with contextlib.aclosing(stream):  # type: ignore[type-var]  # run_agent is an async generator
                async for event in stream:
                    if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
                        run.ended = event.type
                    out.write(encode_event(event) + b"\n")
                    out.flush()
                    async with run.grew:
                        run.grew.notify_all()
        except Exception as exc:  # the stream must end with one terminal line, whatever broke
            error = RunErrorEvent(message=f"runner failed: {type(exc).__name__}: {exc}"[:500], code="runner_failed")
            out.write(encode_event(error) + b"\n")
            run.ended = error.type
        finally:
            await client.aclose()
            run.done = True
            async with run.grew:
                run.grew.notify_all()
            state.stop_when_idle()


async def _tail(run: _Run, offset: int) -> AsyncIterator[bytes]:
    """The run's NDJSON from byte ``offset``, following it until the run ended and all was read."""
    position = offset
    with open(run.path, "rb") as f:
        while True:
            f.seek(position)
            data = f.read()
            if data:
                # Whole lines only: a reader never sees half an event.
                cut = data.rfind(b"\n") + 1
                if cut:
                    position += cut
                    yield data[:cut]
                    continue
            if run.done:
                return
            async with run.grew:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.grew.wait(), 1.0)


def create_runner_app(
    token: str,
    directory: str | None = None,
    *,
    on_shutdown: Callable[[], None] | None = None,
    resolve_adapter: ResolveAdapter = _claude_code,
) -> Starlette:
    """The runner's app under bearer ``token``; ``on_shutdown`` is called by ``POST /shutdown``.

    ``__main__`` reads the token from stdin (``hardening.read_token``), never from the env, and
    stops uvicorn with ``on_shutdown``. ``resolve_adapter(harness, model, env)`` builds each run's
    harness (R23; default: ``claude_code``, the one harness the protocol names that the image runs).
    """
    if not token:
        raise ValueError("the runner needs a non-empty bearer token (the host writes it to the runner's stdin)")
    state = RunnerState(token, directory or tempfile.mkdtemp(prefix="boxwright-runner-"), on_shutdown)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "attach": True, "version": _version()})

    async def start(request: Request) -> Response:
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        body = await _bounded_body(request)
        if body is None:
            return PlainTextResponse("run request body too large", status_code=413)
        try:
            parsed = parse_container_run_request(body)
        except RunnerRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        missing = [n for n in parsed.workspace.secrets if n not in os.environ]
        if missing:
            return PlainTextResponse(
                f"the runner's env has no value for {', '.join(missing)} (the host sets them as it starts the runner)",
                status_code=400,
            )
        run = state.runs.get(parsed.run_id)
        if run is None and state.stopping:
            return PlainTextResponse("the runner is shutting down", status_code=503)
        if run is None:
            from ..journal import encode_run_id

            run = _Run(
                path=os.path.join(state.directory, f"{encode_run_id(parsed.run_id)}.ndjson"),
                target=ToolExecTarget(parsed.tool_exec_url, parsed.tool_exec_token),
            )
            open(run.path, "wb").close()
            state.runs[parsed.run_id] = run
            run.task = asyncio.ensure_future(_execute(parsed, run, resolve_adapter, state))
        else:
            # A second /run of one run starts nothing: it reads the run from byte 0, as an attach does, and
            # its host (a successor that found no run to attach to as its predecessor's /run still landed)
            # is the one driving now, so the run's tool calls go to it.
            run.target.repoint(parsed.tool_exec_url, parsed.tool_exec_token)
        return StreamingResponse(_tail(run, 0), media_type=NDJSON)

    async def events(request: Request) -> Response:
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return PlainTextResponse("unknown run", status_code=404)
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return PlainTextResponse("offset must be an integer", status_code=400)
        if offset > _MAX_OFFSET:
            return PlainTextResponse(f"offset must be at most {_MAX_OFFSET}", status_code=400)
        return StreamingResponse(_tail(run, offset), media_type=NDJSON)

    async def status(request: Request) -> Response:
        # Read-only, for a reaper's probe: whether the agent ended, without reading (or driving) the run.
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return PlainTextResponse("unknown run", status_code=404)
        size = os.path.getsize(run.path)
        return JSONResponse(
            {"runId": request.path_params["run_id"], "done": run.done, "ended": run.ended, "size": size}
        )

    async def cancel(request: Request) -> Response:
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return PlainTextResponse("unknown run", status_code=404)
        from ..definition import CANCEL_REASON

        run.controller.abort(CANCEL_REASON)
        return Response(status_code=202)

    async def attach(request: Request) -> Response:
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        run = state.runs.get(request.path_params["run_id"])
        if run is None:
            return PlainTextResponse("unknown run", status_code=404)
        body = await _bounded_body(request)
        if body is None:
            return PlainTextResponse("attach request body too large", status_code=413)
        try:
            parsed = parse_runner_attach_request(body)
        except RunnerRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        # A run that ended meanwhile is attached too: its successor still reads its end from the NDJSON.
        run.target.repoint(parsed.tool_exec_url, parsed.tool_exec_token)
        size = os.path.getsize(run.path)
        return JSONResponse({"runId": request.path_params["run_id"], "done": run.done, "size": size})

    async def shutdown(request: Request) -> Response:
        if not state.authorized(request):
            return PlainTextResponse("missing or wrong runner token", status_code=401)
        # A run whose terminal line is written is over for its host, which reads that line and asks at
        # once, while the run's own clean-up (its sandbox's teardown) still runs: accepted, and the
        # runner stops when that is done. Refusing it left the runner up until something killed it.
        going = [run_id for run_id, run in state.runs.items() if run.ended is None and not run.done]
        if going:
            return PlainTextResponse(f"runs still going: {', '.join(going)[:200]}", status_code=409)
        state.stopping = True
        state.stop_when_idle()
        return Response(status_code=202)

    async def not_found(request: Request) -> Response:
        return PlainTextResponse("not found", status_code=404)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/run", start, methods=["POST"]),
        Route("/runs/{run_id}", status, methods=["GET"]),
        Route("/runs/{run_id}/events", events, methods=["GET"]),
        Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        Route("/runs/{run_id}/attach", attach, methods=["POST"]),
        Route("/shutdown", shutdown, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.add_exception_handler(404, lambda r, e: not_found(r))
    return app


def terminal(line: bytes) -> bool:
    """Whether an NDJSON line is a run's last event (for readers that stop there)."""
    return b'"type":"RUN_FINISHED"' in line or b'"type":"RUN_ERROR"' in line


__all__ = ["NDJSON", "RunFinishedEvent", "create_runner_app", "terminal"]
