"""README's first command, as a newcomer runs it: it brings the page up, and a demo run completes on it."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.support.viewer import UI_TIMEOUT_MS, chromium, require_browser, start_from_page, wait_page_status

ROOT = Path(__file__).resolve().parents[2]
URL_LINE = re.compile(r"boxwright viewer: (http://127\.0\.0\.1:\d+/)")
ALLOW = "[data-approval-id='demo:command:python3 -m unittest -q'] button.allow"


def readme_first_command() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None, "README has a shell block"
    return shlex.split(block.group(1).splitlines()[0].split("#", 1)[0])


def test_readme_first_command_serves_the_page_and_a_demo_run_completes_on_it(tmp_path: Path) -> None:
    require_browser()
    command = readme_first_command()
    assert command == ["make", "demo"]
    stamp = ROOT / ".venv" / ".installed"
    if stamp.exists() and stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        # A work tree whose pyproject.toml changed after the last install (CI installs first): the
        # test is about the command, not about re-running pip here.
        command = [command[0], "-o", str(stamp), *command[1:]]
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "PORT": "0",
        "BOXWRIGHT_DB": str(tmp_path / "demo.db"),
        "TMPDIR": str(tmp_path / "tmp"),  # the local-process sandboxes of the demo go here
    }
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        url = None
        seen: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:  # bounded by the server printing its URL (or exiting)
            seen.append(line)
            match = URL_LINE.search(line)
            if match:
                url = match.group(1)
                break
            assert time.monotonic() - started < 180, "".join(seen)
        assert url is not None, "".join(seen)
        print(f"\n`make demo` printed its URL after {time.monotonic() - started:.1f} s")
        assert any("providers:" in line for line in seen), "doctor ran first"

        async def drive() -> None:
            async with chromium(tmp_path / "profile") as page:
                await page.goto(url)
                await start_from_page(page, "Greet the newcomer.")
                await page.wait_for_selector(ALLOW, timeout=UI_TIMEOUT_MS)
                await page.click(ALLOW)
                assert await wait_page_status(page, "completed", "failed", "aborted") == "completed"
                await page.wait_for_selector("#diff .line.add", timeout=UI_TIMEOUT_MS)
                assert "the tests pass." in await page.inner_text("#events")

        asyncio.run(drive())
    finally:
        # Ctrl-C, as a user stops it: make and the server it started end together.
        with_group = os.getpgid(process.pid)
        os.killpg(with_group, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(with_group, signal.SIGKILL)
            process.wait(timeout=10)
            raise AssertionError("make demo did not stop on Ctrl-C") from None
