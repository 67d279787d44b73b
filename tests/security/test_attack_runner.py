"""A hostile caller against the in-container runner (``boxwright.runner.server``) under uvicorn.

Every route without, with a wrong, or with another container's runner token; ids no run can have;
deep JSON; a body larger than the cap, declared or streamed; offsets that are garbage or huge.
Each refusal is a 4xx that starts nothing and leaves the runner serving. And how the runner gets its
token: the first line of its stdin (or a file it unlinks), never its env (refused), with the runner
non-dumpable and what it execs dumpable again; the attack by the agent itself, in the runner image, is
tests/security/test_runner_token_in_container.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.runner.hardening import RunnerTokenError, read_token, read_token_file
from boxwright.runner.server import create_runner_app
from boxwright.tool_bridge import serve_asgi
from tests.support.replicas import free_port

TOKEN_X = "runner-x-" + "x" * 32
TOKEN_Y = "runner-y-" + "y" * 32


@asynccontextmanager
async def _runner(tmp: Path, token: str) -> AsyncIterator[tuple[str, Path]]:
    directory = tmp / f"runner-{token[7]}"
    directory.mkdir()
    server = await serve_asgi(create_runner_app(token, str(directory)))
    try:
        yield server.url, directory
    finally:
        await server.close()


def _request(tmp: Path, run_id: str = "r-ok") -> dict[str, Any]:
    # A workspace that does not exist: the run ends at once with its RUN_ERROR (no agent is started).
    return {
        "runId": run_id,
        "threadId": "t-ok",
        "messages": [{"role": "user", "content": "hi"}],
        "harness": "claude-code",
        "model": "m",
        "workspace": {"path": str(tmp / "no-workspace"), "secrets": []},
        "toolDescriptors": [],
        "toolExecUrl": "http://127.0.0.1:9/tool-exec/r-ok",
        "toolExecToken": "t",
    }


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_every_runner_route_refuses_no_token_a_wrong_one_and_another_containers(tmp_path: Path) -> None:
    async def main() -> None:
        async with _runner(tmp_path, TOKEN_X) as (x, _), _runner(tmp_path, TOKEN_Y) as (y, y_dir):
            async with httpx.AsyncClient(timeout=20) as http:
                started = await http.post(f"{y}/run", json=_request(tmp_path), headers=_auth(TOKEN_Y))
                assert started.status_code == 200, started.text
                attach = {"toolExecUrl": "http://127.0.0.1:9/evil", "toolExecToken": "stolen"}
                routes = [
                    ("POST", "/run", _request(tmp_path, "r-other")),
                    ("GET", "/runs/r-ok", None),
                    ("GET", "/runs/r-ok/events", None),
                    ("POST", "/runs/r-ok/cancel", None),
                    ("POST", "/runs/r-ok/attach", attach),
                    ("POST", "/shutdown", None),
                ]
                wrong = [
                    {},
                    _auth(TOKEN_X),  # container X's token on container Y
                    _auth(TOKEN_Y[:-1]),
                    _auth(TOKEN_Y + "y"),
                    {"Authorization": TOKEN_Y},
                    {"Authorization": f"bearer {TOKEN_Y}"},
                ]
                for method, path, body in routes:
                    for headers in wrong:
                        refused = await http.request(method, y + path, json=body, headers=headers)
                        assert refused.status_code == 401, (method, path, headers, refused.text)
                assert sorted(p.name for p in y_dir.iterdir()) == ["r-ok.ndjson"], "a refused /run started a run"
                assert (await http.get(f"{y}/health")).status_code == 200
                assert (await http.post(f"{x}/shutdown", headers=_auth(TOKEN_Y))).status_code == 401, "Y's on X"
                status = await http.get(f"{y}/runs/r-ok", headers=_auth(TOKEN_Y))
                assert status.status_code == 200 and status.json()["runId"] == "r-ok"

    asyncio.run(main())


def test_ids_no_run_can_have_and_deep_json_are_400_and_start_nothing(tmp_path: Path) -> None:
    """The ids land in the NDJSON, file names and the runner's log: the same rule as the host's (S10)."""

    async def main() -> None:
        async with _runner(tmp_path, TOKEN_X) as (url, directory), httpx.AsyncClient(timeout=20) as http:
            for field_name, bad in [
                ("runId", "../../etc/passwd"),
                ("runId", "a/b"),
                ("runId", "a\x00b"),
                ("runId", "r" * 10_000),
                ("threadId", "t\x00"),
                ("threadId", "t" * 10_000),
            ]:
                body = {**_request(tmp_path), field_name: bad}
                refused = await http.post(f"{url}/run", json=body, headers=_auth(TOKEN_X))
                assert refused.status_code == 400, (field_name, bad[:20], refused.status_code, refused.text[:200])
            source = json.dumps({**_request(tmp_path), "workspace": {"path": "/w", "source": {"a": "DEEP"}}})
            deep = source.replace('"DEEP"', "[" * 100_000 + "]" * 100_000).encode()
            refused = await http.post(f"{url}/run", content=deep, headers=_auth(TOKEN_X))
            assert refused.status_code == 400, (refused.status_code, refused.text[:200])
            assert list(directory.iterdir()) == [], "a refused /run started a run"

            assert (await http.post(f"{url}/run", json=_request(tmp_path), headers=_auth(TOKEN_X))).status_code == 200
            deep_attach = b'{"toolExecUrl": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            refused = await http.post(f"{url}/runs/r-ok/attach", content=deep_attach, headers=_auth(TOKEN_X))
            assert refused.status_code == 400, (refused.status_code, refused.text[:200])
            assert (await http.get(f"{url}/health")).status_code == 200

    asyncio.run(main())


def test_offsets_garbage_negative_and_huge(tmp_path: Path) -> None:
    async def main() -> None:
        async with _runner(tmp_path, TOKEN_X) as (url, _), httpx.AsyncClient(timeout=20) as http:
            whole = await http.post(f"{url}/run", json=_request(tmp_path), headers=_auth(TOKEN_X))
            assert whole.status_code == 200 and '"RUN_ERROR"' in whole.text, whole.text
            events = f"{url}/runs/r-ok/events"
            for offset in ("abc", "1e3", "", "0x10", str(2**63), "9" * 30):
                refused = await http.get(events, params={"offset": offset}, headers=_auth(TOKEN_X))
                assert refused.status_code == 400, (offset, refused.status_code, refused.text[:100])
            again = await http.get(events, params={"offset": "-5"}, headers=_auth(TOKEN_X))
            assert again.status_code == 200 and again.text == whole.text, "a negative offset reads from 0"
            past = await http.get(events, params={"offset": str(10**12)}, headers=_auth(TOKEN_X))
            assert past.status_code == 200 and past.text == "", "past the end: nothing (the run ended)"

    asyncio.run(main())


def _declared_huge_body(url: str, path: str, token: str, within_s: float) -> bytes:
    """A head declaring 1 GiB, then 1 KiB of it: what the server answers while the rest never comes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=within_s) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n"
        sock.sendall(head.encode() + b"[" * 1024)
        deadline = time.monotonic() + within_s
        received = b""
        while b"\r\n\r\n" not in received and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received


def test_a_body_over_the_cap_is_413_before_it_is_read(tmp_path: Path) -> None:
    """A declared 1 GiB body is refused on its head; a streamed 5 MiB one is refused without being kept."""

    async def main() -> None:
        async with _runner(tmp_path, TOKEN_X) as (url, _), httpx.AsyncClient(timeout=20) as http:
            assert (await http.post(f"{url}/run", json=_request(tmp_path), headers=_auth(TOKEN_X))).status_code == 200
            for path in ("/run", "/runs/r-ok/attach"):
                answer = await asyncio.to_thread(_declared_huge_body, url, path, TOKEN_X, 10.0)
                assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(80):
                    yield b" " * 65536

            streamed = await http.post(f"{url}/run", content=chunks(), headers=_auth(TOKEN_X))
            assert streamed.status_code == 413, streamed.text
            assert (await http.get(f"{url}/health")).status_code == 200

    asyncio.run(main())


def _start_runner(*args: str, stdin: bytes | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    runner = subprocess.Popen(
        [sys.executable, "-m", "boxwright.runner", *args],
        env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert runner.stdin is not None
    if stdin is not None:
        runner.stdin.write(stdin)
    runner.stdin.close()
    return runner


def _exited(runner: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """Its exit code and stderr (a runner refusing to start exits at once)."""
    assert runner.stderr is not None
    err = runner.stderr.read()
    return runner.wait(timeout=60), err


def _wait_healthy(runner: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60  # a loaded machine: python and boxwright's imports take seconds
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        assert runner.poll() is None, f"the runner exited: {runner.stderr.read() if runner.stderr else b''!r}"
        assert time.monotonic() < deadline, "the runner did not start"
        time.sleep(0.1)


def test_the_runner_takes_its_token_on_stdin_never_from_its_env(tmp_path: Path) -> None:
    """What is in the runner's environ and argv an agent of its user reads: the token is in neither.

    The attack itself (as the agent, in the runner image) is tests/security/test_runner_token_in_container.py:
    here, as root on the host, /proc shows everything, so this checks only what the runner was given.
    """
    port = free_port()
    runner = _start_runner("--host", "127.0.0.1", "--port", str(port), stdin=f"{TOKEN_X}\n".encode())
    try:
        _wait_healthy(runner, port)
        environ = Path(f"/proc/{runner.pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{runner.pid}/cmdline").read_bytes()
        assert TOKEN_X.encode() not in environ and TOKEN_X.encode() not in cmdline
        assert b"BOXWRIGHT_RUNNER_TOKEN" not in environ
        # The pipe that carried it is gone from the runner: what it spawns cannot inherit it.
        assert os.readlink(f"/proc/{runner.pid}/fd/0") == os.devnull
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/runs/nope", headers=_auth(TOKEN_X), timeout=10).status_code == 404
        assert httpx.get(f"{base}/runs/nope", headers=_auth(TOKEN_Y), timeout=10).status_code == 401
        assert httpx.post(f"{base}/shutdown", headers=_auth(TOKEN_X), timeout=10).status_code == 202
        assert runner.wait(timeout=30) == 0
    finally:
        runner.kill()
        runner.wait(timeout=10)


def test_a_token_in_the_env_an_empty_stdin_or_a_bad_token_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pipe_with(data: bytes) -> int:
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        return read

    fd = pipe_with(f"{TOKEN_X}\nmore".encode())
    try:
        assert read_token(fd) == TOKEN_X
        assert os.read(fd, 10) == b"", "the fd that carried the token is /dev/null after"
    finally:
        os.close(fd)
    for data, said in [(b"", "stdin closed before its token"), (b"x" * 5000, "not a token")]:
        fd = pipe_with(data)
        try:
            with pytest.raises(RunnerTokenError, match=said):
                read_token(fd)
        finally:
            os.close(fd)
    read, write = os.pipe()
    try:
        with pytest.raises(RunnerTokenError, match=r"no token on the runner's stdin within 0\.2 s"):
            read_token(read, within=0.2)  # a host that hung before it wrote: bounded
    finally:
        os.close(read)
        os.close(write)

    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN_Y}\n")
    assert read_token_file(str(token_file)) == TOKEN_Y
    assert not token_file.exists(), "the token file outlived the runner's read"
    with pytest.raises(RunnerTokenError, match="cannot read the runner's token file"):
        read_token_file(str(token_file))

    monkeypatch.setenv("BOXWRIGHT_RUNNER_TOKEN", TOKEN_X)
    fd = pipe_with(f"{TOKEN_X}\n".encode())
    try:
        with pytest.raises(RunnerTokenError, match=r"must not be in its environment.*stdin"):
            read_token(fd)
    finally:
        os.close(fd)
    refused = _start_runner("--port", "9", stdin=f"{TOKEN_X}\n".encode(), env={"BOXWRIGHT_RUNNER_TOKEN": TOKEN_X})
    code, err = _exited(refused)
    assert code == 2 and b"must not be in its environment" in err, err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl PR_SET_DUMPABLE is Linux's")
def test_non_dumpable_is_the_runners_alone_a_program_it_runs_is_dumpable_again() -> None:
    """The agent the runner spawns must work as any process (its own /proc, a debugger of its own): exec resets."""
    script = (
        "import subprocess, sys\n"
        "from boxwright.runner.hardening import is_dumpable, set_non_dumpable\n"
        "before = is_dumpable()\n"
        "assert set_non_dumpable() is None\n"
        # The child asks the kernel itself (ctypes prctl PR_GET_DUMPABLE), without importing boxwright.
        "child = subprocess.run([sys.executable, '-c', 'import ctypes; "
        "print(bool(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)))'], capture_output=True, text=True, check=True)"
        ".stdout.strip()\n"
        "print(before, is_dumpable(), child)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "True"], out.stdout
