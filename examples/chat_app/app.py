"""A small Starlette chat app that runs a coding agent for its users.

What it shows, in one file:

- ``SandboxMiddleware`` puts the boxwright service on ``request.state.boxwright``; ``POST /chat``
  uses it to start a run and answers with the run's SSE stream (resumable with Last-Event-ID on
  ``/agent/runs/{id}/events``).
- One host tool, ``style_guide``: a Python function of this app the agent calls over the bridge.
- The run viewer page and the service's routes under ``/agent/`` (open it in a browser).
- An ``authorize(user, thread_id)`` callback: a user reads, answers and cancels only the runs of
  their own threads (the first user to start a run on a thread owns it).

Run it from the repository root: ``python -m examples.chat_app`` (``--fastapi`` for app_fastapi.py).
The user is the ``chat_user`` cookie (``GET /login?user=NAME`` sets it) or an ``X-User`` header.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from boxwright import tool
from boxwright.middleware import SandboxMiddleware, SandboxService, StartRunRequest, sandbox_routes
from boxwright.middleware.approvals import ApprovalDesk
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.viewer import ViewerRuns, viewer_routes

Authorize = Callable[[str, str], bool]
MAX_BODY = 2 * 1024 * 1024


@tool(read_only=True)
def style_guide(topic: str) -> str:
    """This app's style guide for a topic: the agent asks it before it writes."""
    guide = {"greetings": "Greetings end with an exclamation mark!"}
    return guide.get(topic.strip().lower(), f"Nothing in the style guide about {topic!r}.")


class ThreadOwners:
    """Who owns which thread: the app's authorize callback (a real app asks its own database)."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    def claim(self, user: str, thread_id: str) -> bool:
        return self._owners.setdefault(thread_id, user) == user

    def __call__(self, user: str, thread_id: str) -> bool:
        return self._owners.get(thread_id) == user


def _user(scope: Scope) -> str | None:
    headers: dict[str, str] = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    if headers.get("x-user"):
        return headers["x-user"]
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "chat_user" and value:
            return value
    return None


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": "forbidden" if status == 403 else "unauthorized"}, status)


class AuthorizeRuns:
    """Pure ASGI: every request under ``prefix`` + ``/runs`` passes ``authorize`` for the run's thread.

    A start (``POST /runs``) claims its thread for the user (or is refused when another user
    owns it); a run-scoped request is allowed only when the run's thread is the user's.
    """

    def __init__(self, app: ASGIApp, service: SandboxService, owners: ThreadOwners, prefix: str = "/agent") -> None:
        self.app = app
        self.service = service
        self.owners = owners
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or not path.startswith(f"{self.prefix}/runs"):
            return await self.app(scope, receive, send)
        user = _user(scope)
        if user is None:
            return await _refuse(401, "log in first: GET /login?user=NAME")(scope, receive, send)
        rest = path[len(f"{self.prefix}/runs") :].strip("/")
        if not rest:  # POST /runs: the body names the thread
            body, receive = await _buffered(receive)
            try:
                thread_id = json.loads(body or b"{}").get("threadId")
            except (ValueError, AttributeError):
                thread_id = None  # the service's own validation answers 400
            if isinstance(thread_id, str) and not self.owners.claim(user, thread_id):
                return await _refuse(403, "this thread is another user's")(scope, receive, send)
            return await self.app(scope, receive, send)
        record = await self.service.runs.get(rest.split("/", 1)[0])
        if record is not None and not self.owners(user, record.thread_id):
            return await _refuse(403, "this run is in another user's thread")(scope, receive, send)
        await self.app(scope, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body (at most MAX_BODY, the service refuses more) and a receive that replays it."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False) and size <= MAX_BODY
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        return await receive()

    return b"".join(chunks), replay


def chat_routes(owners: ThreadOwners) -> list[BaseRoute]:
    async def chat(request: Request) -> Response:
        user = _user(request.scope)
        if user is None:
            return _refuse(401, "log in first: GET /login?user=NAME")
        body = await request.json()
        thread_id = str(body.get("threadId") or f"{user}-{uuid.uuid4().hex[:8]}")
        if not owners.claim(user, thread_id):
            return _refuse(403, "this thread is another user's")
        service: SandboxService = request.state.boxwright  # put there by SandboxMiddleware
        start = StartRunRequest(thread_id=thread_id, prompt=str(body["message"]), metadata={"harness": "demo"})
        assert service.factory is not None
        spec: Any = service.factory(start)
        run_id = await service.start_run(
            spec.sandbox, spec.harness, start.prompt, thread_id=thread_id, tools=spec.tools
        )
        response = await service.events_response(run_id, request)
        response.headers["X-Run-Id"] = run_id
        response.headers["X-Thread-Id"] = thread_id
        return response

    async def login(request: Request) -> Response:
        response = RedirectResponse("/agent/", status_code=303)
        response.set_cookie("chat_user", request.query_params.get("user", "guest"), httponly=True, samesite="strict")
        return response

    async def home(request: Request) -> Response:
        return RedirectResponse("/login?user=guest" if _user(request.scope) is None else "/agent/", status_code=303)

    return [Route("/", home), Route("/login", login), Route("/chat", chat, methods=["POST"])]


def build(
    db: str | os.PathLike[str] | None = None,
    *,
    sandbox_base: str | None = None,
    pace_s: float = 0.3,
) -> tuple[SandboxService, ThreadOwners, list[BaseRoute], Callable[[Any], contextlib.AbstractAsyncContextManager[Any]]]:
    """The parts both variants share: the service, the owners, the routes, the lifespan."""
    path = Path(db or os.environ.get("CHAT_APP_DB", ".boxwright/chat-app.db")).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    database = open_database(path)
    runs, log = sqlite_run_backend(database)
    desk = ApprovalDesk()
    factory = ViewerRuns(
        desk, path.parent / "chat-app-repo", tools=[style_guide], sandbox_base=sandbox_base, pace_s=pace_s
    )
    service = SandboxService(
        runs, log, locks=SqliteLockStore(database), store=SqliteInstanceStore(database), factory=factory, approvals=desk
    )
    owners = ThreadOwners()
    routes = [*chat_routes(owners), Mount("/agent", routes=[*sandbox_routes(service), *viewer_routes()])]

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            async with service.lifespan(app) as state:
                yield state
        finally:
            await database.close()

    return service, owners, routes, lifespan


def create_app(db: str | os.PathLike[str] | None = None, **options: Any) -> Starlette:
    service, owners, routes, lifespan = build(db, **options)
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(AuthorizeRuns, service=service, owners=owners)
    app.add_middleware(SandboxMiddleware, service=service)
    return app
