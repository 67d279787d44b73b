"""A real browser tails a run: Chromium's own EventSource, including its automatic reconnect.

The page is served by the test app and renders every text delta it receives. The server ends
the first SSE response part-way through the run (as a proxy or a restart would); the browser
reconnects by itself, sending ``Last-Event-ID``, and the page must still show each delta
exactly once, then the run's final status.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from tests.integration.test_delivery_sse import agent_script, expected_text, run_async, running_stack
from tests.support.require import missing

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
CUT_AFTER = 8  # events the first connection carries before the server ends it

PAGE = """<!doctype html>
<meta charset="utf-8"><title>run tail</title>
<pre id="text"></pre><p id="status"></p>
<script>
  const runId = __RUN_ID__;
  window.opens = 0;
  window.ids = [];
  const source = new EventSource(`/runs/${encodeURIComponent(runId)}/events`);
  source.onopen = () => { window.opens += 1; };
  source.onmessage = (message) => {
    window.ids.push(message.lastEventId);
    const event = JSON.parse(message.data);
    if (event.type === "TEXT_MESSAGE_CONTENT") document.getElementById("text").textContent += event.delta;
  };
  source.addEventListener("status", (message) => {
    source.close();  // or EventSource would reconnect to a finished stream forever
    document.getElementById("status").textContent = JSON.parse(message.data).status;
  });
</script>
"""


class EndFirstStreamEarly:
    """Test hook (ASGI): the first SSE response is ended right after its ``after``-th event; the tail sees a
    disconnect."""

    def __init__(self, app: Any, after: int) -> None:
        self.app = app
        self.after = after
        self.used = False
        self.cut_at: str | None = None
        self.requests: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/events"):
            return await self.app(scope, receive, send)
        self.requests.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if self.used:
            return await self.app(scope, receive, send)
        self.used = True
        cut = asyncio.Event()
        sent = 0

        async def cut_send(message: Any) -> None:
            nonlocal sent
            if cut.is_set():
                return
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or b"id: " not in body:
                await send(message)
                return
            # One body may carry several events (the tail coalesces what is ready, a whole backlog at once):
            # pass on the messages up to the ``after``-th event, then end the response there.
            kept: list[bytes] = []
            for part in body.split(b"\n\n")[:-1]:
                kept.append(part + b"\n\n")
                if part.startswith(b"id: "):
                    sent += 1
                    if sent == self.after:
                        self.cut_at = part.split(b"\n", 1)[0].removeprefix(b"id: ").decode()
                        break
            await send({**message, "body": b"".join(kept)})
            if self.cut_at is not None:
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


async def _launch(playwright: Any, profile: Path) -> Any:
    try:
        return await playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
    except Exception as exc:
        missing(f"chromium cannot start here: {str(exc).splitlines()[0]}")


def test_browser_eventsource_reconnects_and_renders_every_delta_once(tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        missing(f"Debian chromium is not installed ({CHROMIUM}; apt-get install -y chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        missing("playwright for Python is not installed (pip install playwright; it is in the dev extra)")

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE.replace("__RUN_ID__", json.dumps(request.path_params["run_id"])))

    hooks: list[EndFirstStreamEarly] = []

    def wrap(app: Any) -> Any:
        hooks.append(EndFirstStreamEarly(app, CUT_AFTER))
        return hooks[0]

    async def main() -> None:
        async with running_stack(tmp_path, extra_routes=[Route("/page/{run_id}", page)], wrap=wrap) as stack:
            deltas = 20
            run_id = await stack.start(agent_script(deltas, 0.08))
            async with async_playwright() as playwright:
                context = await _launch(playwright, tmp_path / "profile")
                try:
                    tab = context.pages[0] if context.pages else await context.new_page()
                    await tab.goto(f"{stack.url}/page/{run_id}")
                    await tab.wait_for_function("document.getElementById('status').textContent !== ''", timeout=30_000)
                    status = await tab.text_content("#status")
                    text = await tab.text_content("#text")
                    ids = await tab.evaluate("window.ids")
                    opens = await tab.evaluate("window.opens")
                finally:
                    await context.close()
            hook = hooks[0]
            stored = await stack.log_entries(run_id)
            assert status == "completed"
            assert text == expected_text(deltas), "every delta exactly once, in order"
            assert ids == [offset for offset, _ in stored], "the browser saw each stored event once"
            assert opens == 2, "one automatic reconnect"
            assert hook.cut_at is not None and hook.cut_at != stored[-1][0], "cut mid-run"
            assert len(hook.requests) == 2
            assert "last-event-id" not in hook.requests[0]
            assert hook.requests[1]["last-event-id"] == hook.cut_at
            await stack.wait_reads_closed()

    run_async(main)
