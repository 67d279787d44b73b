"""Durable Streams test pieces: the pinned npm install, and `boxwright serve --streams` as a real process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support.require import missing

REPO = Path(__file__).resolve().parents[2]
STREAMS_DIR = REPO / "tests" / "streams"
NPM_ENV = "BOXWRIGHT_STREAMS_NPM"
DEFAULT_NPM_DIR = "/opt/boxwright-streams"


def streams_npm() -> Path:
    """The node_modules of tests/streams/package.json (.ci/run installs it), or a named skip/failure."""
    root = Path(os.environ.get(NPM_ENV, DEFAULT_NPM_DIR))
    if shutil.which("node") is None:
        missing("`node` is not installed (Debian: apt-get install nodejs npm)")
    if not (root / "node_modules" / "@durable-streams" / "server-conformance-tests").is_dir():
        missing(
            f"the Durable Streams npm pieces are not installed in {root} (cp tests/streams/package.json there; npm install)"
        )
    return root / "node_modules"


def scratch_project(tmp: Path, node_modules: Path, *files: str) -> Path:
    """A folder with the given tests/streams files and a link to the installed node_modules."""
    project = tmp / "ds-npm"
    project.mkdir(exist_ok=True)
    for name in files:
        shutil.copy(STREAMS_DIR / name, project / name)
    link = project / "node_modules"
    if not link.exists():
        link.symlink_to(node_modules, target_is_directory=True)
    return project


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.options(url, timeout=1.0)
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing answered at {url} within {timeout} s")


@contextlib.contextmanager
def streams_server(db: Path, *, long_poll_timeout: float = 0.5, max_body: int | None = None) -> Iterator[str]:
    """`boxwright serve --streams` on a free 127.0.0.1 port over SQLite at ``db``; yields its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "boxwright", "serve", "--streams", "--port", str(port), "--db", str(db)]
    argv += ["--long-poll-timeout", str(long_poll_timeout)]
    if max_body is not None:
        argv += ["--max-body", str(max_body)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
