"""The run viewer renders hostile event content as text (headless Debian chromium via Playwright).

A run's log is written by the agent: its text, tool names and arguments, file names, diffs and
approval titles are whatever the agent (or the repository it read) chose. A run whose every such
field is an HTML or script payload is opened on the page: nothing of it may run, no element of
it may exist, and each payload must be shown as the text it is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from boxwright import events as ev
from boxwright.runs import RunPatch
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from tests.support.viewer import UI_TIMEOUT_MS, chromium, require_browser, viewer_stack, wait_page_status


def _payload(n: int) -> str:
    return (
        f'<script>window.pwned={n}</script><img src=x onerror="window.pwned={n}">'
        f'<svg onload=window.pwned={n}></svg><a href="javascript:window.pwned={n}">p{n}</a>'
    )


def _events(run: str, thread: str) -> list[ev.Event]:
    diff = f"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-{_payload(7)}\n+'{_payload(8)}' # {_payload(9)}\n"
    return [
        ev.RunStartedEvent(thread_id=thread, run_id=run),
        ev.TextMessageStartEvent(message_id="m1", role="assistant"),
        ev.TextMessageContentEvent(message_id="m1", delta=_payload(1)),
        ev.TextMessageEndEvent(message_id="m1"),
        ev.ToolCallStartEvent(tool_call_id="c1", tool_call_name=_payload(2)),
        ev.ToolCallArgsEvent(tool_call_id="c1", delta='{"command": "' + _payload(3).replace('"', '\\"') + '"}'),
        ev.ToolCallEndEvent(tool_call_id="c1"),
        ev.ToolCallResultEvent(message_id="m2", tool_call_id="c1", content=_payload(4)),
        ev.CustomEvent(name="sandbox.file", value={"type": "created", "path": _payload(5)}),
        ev.CustomEvent(name="sandbox.file.diff", value={"path": "x", "diff": diff}),
        ev.CustomEvent(name="file.changed", value={"diff": diff}),
        ev.CustomEvent(name="approval-requested", value={"approvalId": _payload(6), "title": _payload(10)}),
        ev.CustomEvent(name=_payload(11), value={"x": _payload(12)}),
        ev.RunFinishedEvent(thread_id=thread, run_id=run),
    ]


def test_hostile_event_content_renders_as_text_and_runs_nothing(tmp_path: Path) -> None:
    require_browser()

    async def main() -> None:
        async with viewer_stack(tmp_path) as stack:
            db = open_database(stack.db_path)
            try:
                runs, log = sqlite_run_backend(db)
                await runs.create_or_resume("r-xss", "t-xss")
                await log.append("r-xss", _events("r-xss", "t-xss"))
                await log.close("r-xss")
                await runs.update("r-xss", RunPatch(status="completed"))
            finally:
                await db.close()
            async with chromium(tmp_path / "profile") as page:
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                await page.goto(f"{stack.url}/#run=r-xss&thread=t-xss")
                assert await wait_page_status(page, "completed", "failed") == "completed", errors
                await page.wait_for_selector(".ev-approval", timeout=UI_TIMEOUT_MS)
                await asyncio.sleep(0.5)  # an onerror fires once the broken image would have loaded
                assert await page.evaluate("window.pwned") is None, "a payload ran"
                for tag in ("#events script", "#events img", "#events svg", "#events a", "#diff img"):
                    assert await page.locator(tag).count() == 0, tag
                text = await page.inner_text("body")
                shown = [n for n in range(1, 13) if f"window.pwned={n}" in text]
                # 4 (a tool's result) and 11/12 (an unknown CUSTOM) may be summarised; the rest must be shown.
                assert {1, 2, 3, 5, 7, 8, 9, 10} <= set(shown), shown
                assert not errors, errors

    asyncio.run(main())
