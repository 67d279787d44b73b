"""The run viewer in a real browser (headless Debian chromium via Playwright), over the real app.

Each test starts the built-in demo agent from the page's form: a command harness that edits
``greet.py`` in a local-process sandbox, calls the app's host tool over the bridge, asks before it
runs the tests (the demo policy's ``ask``, answered on the page) and runs them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.support.viewer import (
    UI_TIMEOUT_MS,
    artifact_dir,
    chromium,
    page_offsets,
    require_browser,
    start_from_page,
    viewer_stack,
    wait_page_status,
)

APPROVAL = "demo:command:python3 -m unittest -q"
ALLOW = f"[data-approval-id='{APPROVAL}'] button.allow"


def test_a_demo_run_started_from_the_page_shows_its_work_and_takes_an_answer(tmp_path: Path) -> None:
    require_browser()

    async def main() -> None:
        async with viewer_stack(tmp_path) as stack, chromium(tmp_path / "profile") as page:
            await page.goto(stack.url)
            first_paint = await page.evaluate(
                "(performance.getEntriesByName('first-contentful-paint')[0]"
                " || performance.getEntriesByName('first-paint')[0] || {}).startTime ?? null"
            )
            run_id, thread_id = await start_from_page(page, "Greet the team.")
            await page.wait_for_function("window.boxwrightViewer.firstEventAt !== null", timeout=UI_TIMEOUT_MS)
            to_first_event = await page.evaluate(
                "window.boxwrightViewer.firstEventAt - window.boxwrightViewer.startClickedAt"
            )
            # Chromium may not report a paint entry at all (a loaded machine, a page painted before the
            # observer): the figure is printed when there is one, never asserted.
            paint = "not reported" if first_paint is None else f"{first_paint:.0f} ms"
            print(f"\nviewer: first paint {paint}, Start to first event {to_first_event:.0f} ms")

            # The policy's ask reaches the page as a question; the run waits for the answer.
            await page.wait_for_selector(ALLOW, timeout=UI_TIMEOUT_MS)
            assert (await stack.record(run_id, thread_id))["status"] == "running"
            await page.click(ALLOW)
            assert await wait_page_status(page, "completed", "failed", "aborted") == "completed"
            await page.wait_for_selector("#diff .line.add", timeout=UI_TIMEOUT_MS)

            text = await page.inner_text("#events")
            assert "Greetings end with an exclamation mark!" in text, "the host tool's result"
            assert "the tests pass." in text, "the agent ran the tests once allowed"
            assert "Answered: allow." in text
            assert await page.locator("[data-kind=thinking] details").count() == 1, "thinking, folded"
            assert not await page.locator("[data-kind=thinking] details").get_attribute("open")
            assert await page.locator("[data-kind=host]").count() == 2, "two bridge calls (house_style, ask_person)"
            assert await page.locator("[data-kind=tool]").count() == 5
            added = await page.locator("#diff .line.add").all_inner_texts()
            assert any('+ "!"' in line for line in added), added
            assert await page.locator("#diff .tok-kw").count() > 0, "the diff's code is coloured"

            stored = await stack.stored(run_id)
            assert await page_offsets(page) == [offset for offset, _ in stored], "every event once, in order"
            row = page.locator(f"#runs-body tr[data-run-id='{run_id}']")
            await row.locator(".badge[data-status=completed]").wait_for(timeout=UI_TIMEOUT_MS)
            assert "$0 (no model)" in await row.inner_text()
            shot = artifact_dir(tmp_path) / "viewer-finished-run.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            print(f"viewer: screenshot of the finished run: {shot}")

    asyncio.run(main())


def test_a_reload_and_a_dropped_stream_resume_from_the_last_offset_with_no_duplicate(tmp_path: Path) -> None:
    require_browser()

    async def main() -> None:
        # The first SSE response ends after 6 events: EventSource reconnects by itself (Last-Event-ID).
        async with viewer_stack(tmp_path, cut_after=6) as stack, chromium(tmp_path / "profile") as page:
            tails: list[str] = []
            page.on("request", lambda request: tails.append(request.url) if "/events" in request.url else None)
            await page.goto(stack.url)
            run_id, thread_id = await start_from_page(page, "Greet the team.")
            # Mid-run: the agent waits on its question, and some of its events are on the page.
            await page.wait_for_selector(ALLOW, timeout=UI_TIMEOUT_MS)
            before = await page_offsets(page)
            assert stack.cut is not None and stack.cut.cut_at in before, "the dropped stream was resumed"
            assert await page.evaluate("window.boxwrightViewer.opens") == 2
            tails.clear()

            await page.reload()
            await page.wait_for_selector(ALLOW, timeout=UI_TIMEOUT_MS)  # restored, still answerable
            assert await page.evaluate("window.boxwrightViewer.resumedFrom") == before[-1]
            assert tails and f"offset={before[-1]}" in tails[0], tails
            await page.click(ALLOW)
            assert await wait_page_status(page, "completed", "failed", "aborted") == "completed"

            stored = await stack.stored(run_id)
            offsets = await page_offsets(page)
            assert offsets == [offset for offset, _ in stored], "after the reload: each event exactly once"
            assert offsets[: len(before)] == before
            text = await page.inner_text("#events")
            assert await page.locator("[data-tool-call-id=demo-call-1] pre.result").count() == 1
            assert await page.locator("[data-kind=text]").count() == 1
            assert text.count("the tests pass.") == 1
            assert await page.locator("[data-kind=tool]").count() == 5
            record = await stack.record(run_id, thread_id)
            assert record["status"] == "completed"

    asyncio.run(main())


def test_stop_ends_the_run_aborted_and_its_sandbox_is_gone(tmp_path: Path) -> None:
    require_browser()

    async def main() -> None:
        async with viewer_stack(tmp_path) as stack, chromium(tmp_path / "profile") as page:
            await page.goto(stack.url)
            run_id, thread_id = await start_from_page(page, "Greet the team.")
            await page.wait_for_selector(ALLOW, timeout=UI_TIMEOUT_MS)
            sandboxes = os.listdir(stack.sandboxes)
            assert len(sandboxes) == 1, "the run's sandbox exists while it runs"
            await page.keyboard.press("Escape")
            await page.focus("#stop")
            await page.keyboard.press("Enter")  # keyboard only
            assert await wait_page_status(page, "completed", "failed", "aborted") == "aborted"
            record = await stack.record(run_id, thread_id)
            assert record["status"] == "aborted" and record["cancelRequested"] is True
            assert os.listdir(stack.sandboxes) == [], "the cancelled run's sandbox directory is gone"
            assert await page.locator("#stop").is_disabled()
            await page.set_viewport_size({"width": 390, "height": 844})  # a phone
            overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"the page scrolls sideways on a phone by {overflow} px"
            assert "the tests pass." not in await page.inner_text("#events"), "the agent stopped waiting"

    asyncio.run(main())
