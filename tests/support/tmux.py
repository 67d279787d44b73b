"""A command run in a real terminal (a detached tmux session), and what it left on the screen and scrollback."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from tests.support.require import missing

EXIT_MARK = "__boxwright_exit="


def run_in_terminal(
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    *,
    width: int = 80,
    height: int = 40,
    timeout: float = 120.0,
) -> tuple[int, str]:
    """Run ``argv`` in a ``width``x``height`` tmux pane; return its exit code and the whole pane history.

    Lines the terminal wrapped are joined again (``capture-pane -J``): the text reads as the
    program wrote it, and a line a program cut or erased stays missing.
    """
    tmux = shutil.which("tmux")
    if tmux is None:
        missing("`tmux` is not installed (apt-get install tmux; .ci/run installs it)")
    socket = f"boxwright-test-{uuid.uuid4().hex[:12]}"  # a private server: no user session is touched
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = f"cd {shlex.quote(str(cwd))} && env {exports} {shlex.join(argv)}; echo {EXIT_MARK}$?; sleep 600"
    base = [tmux, "-L", socket, "-f", "/dev/null"]
    subprocess.run(
        [*base, "new-session", "-d", "-x", str(width), "-y", str(height), "sh", "-c", script],
        check=True,
        timeout=30,
    )
    try:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [*base, "capture-pane", "-p", "-J", "-S", "-", "-t", "0"],
                check=True,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            done = [line for line in screen.splitlines() if line.startswith(EXIT_MARK)]
            if done:
                return int(done[-1][len(EXIT_MARK) :]), screen
            time.sleep(0.2)
        raise AssertionError(f"{argv} did not end within {timeout}s; the screen:\n{screen}")
    finally:
        subprocess.run([*base, "kill-server"], check=False, timeout=30)


def squeeze(text: str) -> str:
    """``text`` without any whitespace: a line wrapped at a word boundary still matches."""
    return "".join(text.split())
