"""Client authorization for the coordinator's routes (S6): every client route asks ``authorize`` first.

``authorize(connection, action, scope)`` answers True (go on) or False (refused: 401 when the
request carried no credentials, else 403). ``bearer_authorizer(token)`` is the plain form: the
whole ``Authorization: Bearer <token>`` header compared in constant time (S2), or, for a browser
WebSocket that cannot set headers, a short-lived HMAC ``?ticket=`` (``mint_ws_ticket``).

``guard_routes`` wraps the service core's routes (never a copy of them): the guard runs, and
for run-scoped routes the ``?threadId`` check (400 when missing, 404 when another thread's),
before the route's own endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from boxwright.middleware.delivery import DeliveryRefusal, json_response, refuse_handshake
from boxwright.runs import RunStore

log = logging.getLogger("boxwright.middleware")

TICKET_TTL_S: Final = 60.0


@dataclass(frozen=True)
class AuthScope:
    """What a client route acts on: a run (and its thread) or a thread."""

    run_id: str | None = None
    thread_id: str | None = None


Authorize: TypeAlias = Callable[[HTTPConnection, str, AuthScope], bool | Awaitable[bool]]


def _ticket_mac(secret: str, run_id: str, expires: int) -> str:
    return hmac.new(secret.encode(), f"ws-ticket:{run_id}:{expires}".encode(), hashlib.sha256).hexdigest()


def mint_ws_ticket(secret: str, run_id: str, *, ttl_s: float = TICKET_TTL_S, now: float | None = None) -> str:
    """A ``?ticket=`` for one run's WebSocket tail, valid ``ttl_s`` seconds."""
    expires = int((time.time() if now is None else now) + ttl_s)
    return f"{expires}.{_ticket_mac(secret, run_id, expires)}"


def check_ws_ticket(secret: str, run_id: str, ticket: str, *, now: float | None = None) -> bool:
    expires_text, _, mac = ticket.partition(".")
    if not expires_text.isdigit() or not mac:
        return False
    expires = int(expires_text)
    if expires < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(mac, _ticket_mac(secret, run_id, expires))


def bearer_authorizer(token: str) -> Authorize:
    """Consent for a request with ``Authorization: Bearer <token>`` (or a valid WebSocket ticket)."""
    expected = f"Bearer {token}".encode()

    def authorize(connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
        given = [v for k, v in connection.scope["headers"] if k == b"authorization"]
        if len(given) == 1 and hmac.compare_digest(given[0], expected):
            return True
        ticket = connection.query_params.get("ticket")
        if action == "runs.tail" and ticket and scope.run_id is not None:
            return check_ws_ticket(token, scope.run_id, ticket)
        return False

    return authorize


def allow_anyone(connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
    return True


def _action(path: str, method: str) -> str:
    if path.startswith("/threads/"):
        return "threads.cancel" if path.endswith("/cancel") else "threads.read"
    if path in ("/runs", "/agui"):
        # The AG-UI endpoint starts a run with POST and joins one with GET (``?runId=``).
        return "runs.tail" if path == "/agui" and method == "GET" else "runs.create"
    tail = path.rsplit("/", 1)[-1]
    if tail in ("events", "poll", "ws", "stream"):
        return "runs.tail"
    if tail == "cancel":
        return "runs.cancel"
    if tail == "attach":
        return "runs.attach"
    if tail == "approval":
        # It decides what the agent may do: never a read, whatever else a hook lets a viewer see.
        return "runs.approve"
    return "runs.read"


async def _consents(authorize: Authorize, connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
    try:
        answer: Any = authorize(connection, action, scope)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # a hook that fails refuses: never an open door
        log.error("authorize hook raised for %s: %s", action, type(exc).__name__)
        return False
    return answer is True


def _refusal(connection: HTTPConnection) -> tuple[int, str]:
    carried = any(k == b"authorization" for k, _ in connection.scope["headers"]) or "ticket" in connection.query_params
    return (403, "forbidden") if carried else (401, "unauthorized")


def guard_routes(
    routes: Sequence[BaseRoute], authorize: Authorize, runs: RunStore, *, require_thread_id: bool = True
) -> list[BaseRoute]:
    """``routes`` behind ``authorize`` and, for run-scoped ones, the ``?threadId`` check."""
    guarded: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, Route):
            guarded.append(
                Route(
                    route.path,
                    _guard_http(route, authorize, runs, require_thread_id),
                    methods=sorted(route.methods or ()),
                    name=route.name,
                )
            )
        elif isinstance(route, WebSocketRoute):
            guarded.append(
                WebSocketRoute(route.path, _guard_ws(route, authorize, runs, require_thread_id), name=route.name)
            )
        else:
            guarded.append(route)
    return guarded


async def _thread_refusal(connection: HTTPConnection, runs: RunStore, run_id: str) -> tuple[int, str, str] | None:
    thread_id = connection.query_params.get("threadId")
    if not thread_id:
        return 400, "threadId query param required", "thread_id_required"
    try:
        record = await runs.get(run_id)
    except Exception:
        record = None  # an id no run can have: the route itself answers it (400)
    if record is not None and record.thread_id != thread_id:
        # The same answer as an unknown run: a client must not learn another thread's run ids.
        return 404, "unknown run", "unknown_run"
    return None


def _scope_of(connection: HTTPConnection, action: str) -> AuthScope:
    if action == "runs.create":
        # The run's thread is in the body, not known here: a ``?threadId`` would tell the hook a thread
        # the run may not start on (a hook scoped to the user's thread, fooled into a create on another's).
        return AuthScope()
    params = connection.path_params
    thread = params.get("thread_id") or connection.query_params.get("threadId")
    return AuthScope(run_id=params.get("run_id") or connection.query_params.get("runId"), thread_id=thread)


def _guard_http(
    route: Route, authorize: Authorize, runs: RunStore, require_thread_id: bool
) -> Callable[[Request], Awaitable[Response]]:
    endpoint: Any = route.endpoint

    async def guarded(request: Request) -> Response:
        action = _action(route.path, request.method)
        scope = _scope_of(request, action)
        if not await _consents(authorize, request, action, scope):
            status, message = _refusal(request)
            return json_response(status, {"error": message, "code": message})
        run_id = request.path_params.get("run_id")
        if run_id is None and action == "runs.tail":
            run_id = request.query_params.get("runId")  # GET /agui?runId= reads a run like /events does
        if run_id is not None and require_thread_id:
            refused = await _thread_refusal(request, runs, run_id)
            if refused is not None:
                return json_response(refused[0], {"error": refused[1], "code": refused[2]})
        response: Response = await endpoint(request)
        return response

    return guarded


def _guard_ws(
    route: WebSocketRoute, authorize: Authorize, runs: RunStore, require_thread_id: bool
) -> Callable[[WebSocket], Awaitable[None]]:
    endpoint: Any = route.endpoint

    async def guarded(websocket: WebSocket) -> None:
        scope = _scope_of(websocket, "runs.tail")
        # Refused before accept, as an HTTP answer to the handshake: a close before accept reaches the
        # client as a bare 403 whatever its code, so a missing token, a missing threadId and another
        # thread's run would all read as "forbidden".
        if not await _consents(authorize, websocket, "runs.tail", scope):
            status, message = _refusal(websocket)
            await refuse_handshake(websocket, DeliveryRefusal(status, 4000 + status, message, message))
            return
        run_id = websocket.path_params.get("run_id")
        if run_id is not None and require_thread_id:
            refused = await _thread_refusal(websocket, runs, run_id)
            if refused is not None:
                status, message, code = refused
                await refuse_handshake(websocket, DeliveryRefusal(status, 4000 + status, message, code))
                return
        await endpoint(websocket)

    return guarded


__all__ = [
    "AuthScope",
    "Authorize",
    "allow_anyone",
    "bearer_authorizer",
    "check_ws_ticket",
    "guard_routes",
    "mint_ws_ticket",
]
