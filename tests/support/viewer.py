"""The run viewer under test: its app served by uvicorn on 127.0.0.1, and a headless Debian chromium.

Shared by tests/e2e/test_viewer_*.py: ``viewer_stack`` serves ``boxwright.viewer.serve.viewer_app``
(SQLite, local-process sandboxes under the test's own directory), ``chromium`` opens a page in the
system browser (never ``playwright install``), ``CutEventsOnce`` ends the first SSE response early
as a proxy would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from boxwright.events import encode_event
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import AsgiServer, serve_asgi
from tests.support.require import missing
from tests.support.sse import aparse_frames

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Generous: two cores shared with other test processes; a demo run takes a few seconds.
UI_TIMEOUT_MS = 60_000


class CutEventsOnce:
    """ASGI wrapper: the first ``/events`` response ends after ``after`` events (the tail sees a disconnect)."""

    def __init__(self, app: Any, after: int) -> None:
        self.app = app
        self.after = after
        self.used = False
        self.cut_at: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/events") or self.used:
            await self.app(scope, receive, send)
            return
        self.used = True
        cut = asyncio.Event()
        sent = 0

        async def cut_send(message: Any) -> None:
            nonlocal sent
            if cut.is_set():
                return
            await send(message)
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and body.startswith(b"id: "):
                sent += 1
                if sent == self.after:
                    self.cut_at = body.split(b"\n", 1)[0].removeprefix(b"id: ").decode()
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    cut.set()

        async def cut_receive() -> Any:
            incoming = asyncio.ensure_future(receive())
            ended = asyncio.ensure_future(cut.wait())
            await asyncio.wait({incoming, ended}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if incoming.done():
                return incoming.result()
            incoming.cancel()
            return {"type": "http.disconnect"}

        await self.app(scope, cut_receive, cut_send)


@dataclass
class ViewerStack:
    url: str
    db_path: Path
    sandboxes: Path
    client: httpx.AsyncClient
    cut: CutEventsOnce | None = None
    requests: list[str] = field(default_factory=list)

    async def record(self, run_id: str, thread_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/runs/{run_id}", params={"threadId": thread_id})
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def stored(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every (offset, event JSON) the run's log holds, read straight from the SQLite file."""
        db = open_database(self.db_path)
        try:
            _, log = sqlite_run_backend(db)
            return [(o, json.loads(encode_event(e))) async for o, e in log.read(run_id, "-1", live=False)]
        finally:
            await db.close()

    async def wait_status(self, run_id: str, thread_id: str, *statuses: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            record = await self.record(run_id, thread_id)
            if record["status"] in statuses or time.monotonic() > deadline:
                return record
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def viewer_stack(
    tmp_path: Path, *, pace_s: float = 0.15, cut_after: int | None = None
) -> AsyncIterator[ViewerStack]:
    """``viewer_app`` on a fresh SQLite file, served on 127.0.0.1; its lifespan runs for the block."""
    from boxwright.viewer.serve import viewer_app

    db_path = tmp_path / "viewer.db"
    sandboxes = tmp_path / "sandboxes"
    app: Any = viewer_app(db_path, demo_repo=tmp_path / "demo-repo", sandbox_base=str(sandboxes), pace_s=pace_s)
    cut = CutEventsOnce(app, cut_after) if cut_after is not None else None
    # lifespan="on": the app's own lifespan owns the service (and cancels what runs at the end).
    server: AsgiServer = await serve_asgi(cut if cut is not None else app, lifespan="on")
    client = httpx.AsyncClient(base_url=server.url, timeout=30)
    try:
        yield ViewerStack(server.url, db_path, sandboxes, client, cut)
    finally:
        await client.aclose()
        await server.close()


def require_browser() -> Any:
    """Playwright's async API, once the system chromium and the Python package are both here."""
    if not os.path.exists(CHROMIUM):
        missing(f"Debian chromium is not installed ({CHROMIUM}; apt-get install -y chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        missing("playwright for Python is not installed (pip install playwright; it is in the dev extra)")
    return async_playwright


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Any]:
    """A page of a headless system chromium with its own profile; closed with the block."""
    async_playwright = require_browser()
    async with async_playwright() as playwright:
        try:
            context = await playwright.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
        except Exception as exc:
            missing(f"chromium cannot start here: {str(exc).splitlines()[0]}")
        try:
            yield context.pages[0] if context.pages else await context.new_page()
        finally:
            await context.close()


async def start_from_page(page: Any, prompt: str) -> tuple[str, str]:
    """Fill the form, press Start, and return the run's (id, thread id) once the page shows it."""
    await page.fill("#prompt", prompt)
    await page.select_option("#harness", "demo")
    await page.click("#start")
    await page.wait_for_function("location.hash.includes('run=')", timeout=UI_TIMEOUT_MS)
    hash_ = await page.evaluate("Object.fromEntries(new URLSearchParams(location.hash.slice(1)))")
    return str(hash_["run"]), str(hash_["thread"])


async def page_offsets(page: Any) -> list[str]:
    return list(await page.evaluate("window.boxwrightViewer.offsets"))


async def wait_page_status(page: Any, *statuses: str) -> str:
    await page.wait_for_function(
        f"{json.dumps(list(statuses))}.includes(window.boxwrightViewer.status)", timeout=UI_TIMEOUT_MS
    )
    return str(await page.evaluate("window.boxwrightViewer.status"))


def artifact_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$BOXWRIGHT_TEST_ARTIFACTS`` (CI keeps it), else the test's tmp dir."""
    chosen = Path(os.environ.get("BOXWRIGHT_TEST_ARTIFACTS") or tmp_path / "artifacts")
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen


@dataclass
class SseFrame:
    id: str | None
    event: str
    data: str


async def sse_frames(response: httpx.Response) -> AsyncIterator[SseFrame]:
    """The response's SSE messages (tests/support/sse.py), ``event`` ``"message"`` where a message names none."""
    async with contextlib.aclosing(aparse_frames(response.aiter_lines())) as frames:
        async for frame in frames:
            yield SseFrame(frame.id, frame.event or "message", frame.data)
