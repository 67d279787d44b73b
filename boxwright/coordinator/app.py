"""``create_coordinator_app(config)``: the service core's standalone face, as a Starlette app.

The routes are the service core's (``sandbox_routes``: trigger, record, SSE / long-poll /
WebSocket tails, the run's Durable Streams stream, cancel, attach, thread routes), each behind
the client ``authorize`` hook, plus what only a standalone coordinator has: the sandbox
callbacks on its own origin (``/_bridge``, ``/tool-exec``), ``/healthz`` and ``/admin/sweep``.
One ``SandboxService`` owns every run task and the one takeover path; the lifespan enters it
and the scheduler (watchdog, sweep). On shutdown new triggers are refused, the runs going
here get ``drain_timeout`` to end, and the rest stay ``running`` with their leases released,
for another replica to adopt on the next attach, tail or sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from boxwright.middleware.delivery import json_response
from boxwright.middleware.service import (
    STATE_KEY,
    RunChoice,
    RunRequestRefused,
    RunSpec,
    SandboxService,
    StartRunRequest,
    sandbox_routes,
)
from boxwright.secrets import register_secret_values
from boxwright.stores.base import warn_if_not_durable
from boxwright.takeover import DEFAULT_FENCE_QUIET_MS
from boxwright.viewer.app import profiles_config, viewer_routes

from .auth import Authorize, allow_anyone, bearer_authorizer, guard_routes
from .callbacks import BRIDGE_PREFIX, MountedToolBridge, ToolExecRegistry
from .config import CoordinatorConfig, StoreSet, open_store_set
from .hosts import resolve_bridge_origin
from .scheduler import Scheduler

log = logging.getLogger("boxwright.middleware")


class CoordinatorConfigError(ValueError):
    """A coordinator config that cannot serve safely or at all; the message says what to set."""


@dataclass(eq=False)
class Coordinator:
    """What one coordinator app holds (``app.state.coordinator``): its stores, service, callbacks, scheduler."""

    config: CoordinatorConfig
    stores: StoreSet
    service: SandboxService
    bridge: MountedToolBridge
    tool_exec: ToolExecRegistry
    scheduler: Scheduler
    # The server's bound address, as the ASGI scope of a request reports it (R45 rule 2).
    _server: tuple[str, int] | None = None
    _headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def origin(self, provider: str | None = None) -> str:
        """Where sandboxes of ``provider`` (default: the first profile's) call back; raises
        ``ToolBridgeConfigError`` when nothing safe is known."""
        if provider is None:
            provider = next((s.provider.name for s in self.config.sandboxes.values()), None)
        scope: dict[str, Any] = {"server": self._server, "headers": self._headers}
        return resolve_bridge_origin(
            scope,
            public_origin=self.config.public_origin,
            provider=provider,
            trust_request_host=self.config.trust_request_host,
            allowed_hosts=self.config.allowed_hosts,
        )

    def note_request(self, scope: Scope) -> None:
        server = scope.get("server")
        if server is not None and self._server is None:
            # A unix socket or a test transport may report no port: then no loopback rule applies.
            self._server = (str(server[0]), int(server[1]) if server[1] is not None else 0)
        if self.config.trust_request_host:
            self._headers = [(k, v) for k, v in scope.get("headers", ()) if k == b"host"]


def _authorizer(config: CoordinatorConfig) -> Authorize:
    if config.authorize is not None:
        return config.authorize
    if config.client_token:
        return bearer_authorizer(config.client_token)
    if config.allow_anonymous:
        return allow_anyone
    raise CoordinatorConfigError(
        "a coordinator needs client auth: pass authorize=, client_token= (or $BOXWRIGHT_CLIENT_TOKEN), "
        "or allow_anonymous=True for development"
    )


def _check_inactivity(config: CoordinatorConfig) -> None:
    """Refuse a watchdog that would fail every run it adopts: a successor's first append waits for the log to be
    quiet for ``DEFAULT_FENCE_QUIET_MS`` (R30), and that wait logs no event (measured: 3 s fails an adopted run
    that still produces, 6 s does not)."""
    quiet_s = DEFAULT_FENCE_QUIET_MS / 1000
    if 0 < config.inactivity_timeout <= quiet_s:
        raise CoordinatorConfigError(
            f"inactivity_timeout {config.inactivity_timeout:g} s: must be 0 (no watchdog) or longer than a "
            f"takeover's {quiet_s:g} s quiet wait, or the watchdog fails every run a replica adopts "
            "(--inactivity-timeout; default 1800 s)"
        )


def _factory(config: CoordinatorConfig) -> Any:
    async def factory(request: StartRunRequest) -> RunChoice:
        if config.resolve is not None:
            made: Any = config.resolve(request)
            if inspect.isawaitable(made):
                made = await made
            return made  # type: ignore[no-any-return]
        # A takeover's request carries the profile names its record kept (metadata itself is never stored).
        metadata = request.metadata or {}
        name = _pick(config.sandboxes, metadata.get("sandbox"), "sandbox")
        sandbox = config.sandboxes[name]
        harness_name = _pick(config.harnesses, metadata.get("harness"), "harness")
        session = metadata.get("sessionId")
        return RunSpec(
            sandbox=sandbox,
            harness=config.harnesses[harness_name],
            tools=list(config.tools) or None,
            durable=config.durable,
            session_id=session if isinstance(session, str) and session else None,
            mode=config.modes.get(name, "host-driven"),
            sandbox_profile=name,
            harness_profile=harness_name,
        )

    return factory


def _pick(profiles: Mapping[str, object], name: object, what: str) -> str:
    """The profile name a trigger chose (``metadata.<what>``), or the first one."""
    if not profiles:
        raise RunRequestRefused(f"this coordinator has no {what} profile configured")
    if name is None:
        return next(iter(profiles))
    if not isinstance(name, str) or name not in profiles:
        known = ", ".join(sorted(profiles))
        raise RunRequestRefused(f"metadata.{what} must name one of this coordinator's {what}s: {known}")
    return name


class _ToolExecEndpoint:
    """``tool_exec_app`` as a route endpoint (an ASGI app, not a request function)."""

    def __init__(self, registry: ToolExecRegistry) -> None:
        self._registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._registry.app(scope, receive, send)


class _SpecBridgePath:
    """The bridge at the spec's path too: ``/_bridge/<id>`` (spec §6) is ``/_bridge/runs/<id>/mcp``.

    The URL the agent is given is the long one (``MountedToolBridge.url_for``: the same path a standalone
    bridge serves, so one ``ToolBridgeApp`` routes both); a client written to the spec's table posts to
    the short one. Only the path changes: the id segment stays percent-encoded as sent, so the bridge's
    own id check (``..``, ``%2F``, NUL) and its token check see exactly what they would on the long path.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root: str = scope.get("root_path", "")
        raw: bytes = scope.get("raw_path") or quote(scope["path"]).encode()
        prefix = quote(root).encode()
        below = raw[len(prefix) :] if raw.startswith(prefix) else b""
        segment = below[1:]
        if scope["type"] == "http" and below.startswith(b"/") and segment and b"/" not in segment:
            path = f"{root}/runs/{unquote(segment.decode('latin-1'))}/mcp"
            scope = {**scope, "path": path, "raw_path": prefix + b"/runs/" + segment + b"/mcp"}
        await self.app(scope, receive, send)


class _NoteOrigin:
    """Outermost ASGI layer: records the bound address a request arrived on (never its ``Host``)."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coordinator = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self.coordinator.note_request(scope)
        await self.app(scope, receive, send)


def create_coordinator_app(config: CoordinatorConfig) -> Starlette:
    """A Starlette app serving the coordinator of ``config`` (run it under uvicorn; see ``boxwright serve``)."""
    authorize = _authorizer(config)
    _check_inactivity(config)
    # Masked in logs and in every run's events: an agent that prints what it can read (on a local-process
    # sandbox, this process's argv and env) must not put them in the log.
    store_password = urlsplit(config.store_url).password if config.store_url else None
    register_secret_values(
        v for v in (config.client_token, config.admin_token, config.runner_secret, store_password) if v
    )
    stores = config.stores if config.stores is not None else open_store_set(config.store_url)
    holder: list[Coordinator] = []

    def origin() -> str:
        return holder[0].origin()

    def origin_for(provider: str | None) -> str:
        return holder[0].origin(provider)

    bridge = MountedToolBridge(origin)
    tool_exec = ToolExecRegistry(origin_for)
    service = SandboxService(
        stores.runs,
        stores.log,
        locks=stores.locks,
        store=stores.instances,
        factory=_factory(config),
        lease_ttl_ms=config.lease_ttl_ms,
        thread_runs=config.thread_runs,
        on_close="detach",
        bridge=bridge,
        # Co-located runs: their host tools on this coordinator's /tool-exec, the runner token from the
        # secret every replica shares (a successor derives it to re-point the runner to itself).
        tool_exec=tool_exec,
        runner_secret=config.runner_secret,
        approvals=config.approvals,
    )
    scheduler = Scheduler(
        service,
        inactivity_timeout=config.inactivity_timeout,
        watchdog_interval=config.watchdog_interval,
        sweep_interval=config.sweep_interval,
        max_runs=config.sweep_max_runs,
    )
    coordinator = Coordinator(config, stores, service, bridge, tool_exec, scheduler)
    holder.append(coordinator)

    async def healthz(request: Request) -> Response:
        return json_response(200, {"ok": True, "driving": len(service.active_runs)})

    async def sweep(request: Request) -> Response:
        secret = config.admin_token
        given = [v for k, v in request.scope["headers"] if k == b"authorization"]
        if not secret or len(given) != 1 or not hmac.compare_digest(given[0], f"Bearer {secret}".encode()):
            return json_response(401, {"error": "the sweep needs the admin token", "code": "unauthorized"})
        result = await scheduler.sweep()
        return Response(msgspec.json.encode(result), media_type="application/json")

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/admin/sweep", sweep, methods=["POST"]),
        Mount(BRIDGE_PREFIX, app=_SpecBridgePath(bridge.app)),
        Route("/tool-exec/{run_id:path}", _ToolExecEndpoint(tool_exec), methods=["POST"]),
        *guard_routes(sandbox_routes(service), authorize, stores.runs),
        # The run viewer at ``/``: static, so unguarded; its API calls go through the guarded routes.
        # EventSource sends no Authorization header: a guarded coordinator's page needs a cookie-reading
        # ``authorize`` hook (none is built in).
        *viewer_routes(profiles_config(config.harnesses, config.sandboxes)),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        if authorize is allow_anyone:
            log.warning("coordinator: allow_anonymous is on: any client may start and read runs (development only)")
        warn_if_not_durable(stores.locks, "coordinator runs")
        try:
            async with service:
                async with scheduler:
                    yield {STATE_KEY: service, "coordinator": coordinator}
                    await _drain(service, config.drain_timeout)
        finally:
            await bridge.close()
            tool_exec.close_all()
            await stores.aclose()

    app = Starlette(routes=routes, lifespan=lifespan)
    # A run id that decodes to a slash (``%2F``) must be refused, not redirected to another route.
    app.router.redirect_slashes = False
    app.state.coordinator = coordinator
    app.add_middleware(_NoteOrigin, coordinator=coordinator)
    return app


async def _drain(service: SandboxService, timeout: float) -> None:
    """R33: no new run from now on; the runs going here get ``timeout`` seconds to end on their own."""
    service.stop_accepting()
    waits = [asyncio.ensure_future(service.wait_run(run_id)) for run_id in service.active_runs]
    if not waits:
        return
    try:
        await asyncio.wait(waits, timeout=timeout)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.wait(waits)


__all__ = ["Coordinator", "CoordinatorConfigError", "create_coordinator_app"]
