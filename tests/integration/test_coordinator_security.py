"""The coordinator's security points (spec S1-S11, issue 14) against a real ``boxwright serve`` process.

Client routes without the auth hook's consent get 401/403; run-scoped routes need their own
thread; the bridge and tool-exec callbacks without the run's token get 401 and run nothing, and
404 once the run settled; a ``Host`` or ``X-Forwarded-*`` header never changes a callback URL; a
malformed or foreign offset or id is a 4xx; the sweep needs the admin secret.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from boxwright.coordinator import CoordinatorConfig, create_coordinator_app, mint_ws_ticket
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    BridgeEnvHarness,
    CoordinatorProcess,
    client_headers,
    coordinator_server,
    record_call_tool,
    scripted_agent,
    sse_events,
    trigger,
)

EVIL = {
    "Host": "evil.example:6379",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Port": "6379",
    "X-Forwarded-For": "169.254.169.254",
    "Forwarded": "for=169.254.169.254;host=evil.example;proto=https",
}


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    tmp = tmp_path_factory.mktemp("coordinator-security")
    process = CoordinatorProcess("security", tmp, scripted_agent(tmp))
    try:
        yield process
    finally:
        process.close()


Finished = tuple[str, str, list[str]]


@pytest.fixture(scope="module")
def finished(coordinator: CoordinatorProcess) -> list[Finished]:
    """Two completed runs of 3 lines (started together): their run id, thread id and SSE offsets."""
    made = [(f"r-{secrets.token_hex(4)}", f"t-{secrets.token_hex(4)}") for _ in range(2)]
    for run, thread in made:
        assert coordinator.post("/runs", trigger(thread, "lines 3 0", run)).status_code == 202
    out: list[Finished] = []
    for run, thread in made:
        frames = sse_events(coordinator.url, run, thread)
        assert frames[-1][0] == "status" and '"completed"' in frames[-1][2], frames
        out.append((run, thread, [ident for _, ident, _ in frames if ident is not None]))
    return out


def _texts(frames: list[tuple[str | None, str | None, str]]) -> str:
    return "\n".join(data for _, _, data in frames)


def test_client_routes_need_the_auth_hooks_consent(coordinator: CoordinatorProcess, finished: list[Finished]) -> None:
    run, thread, _ = finished[0]
    q = f"?threadId={thread}"
    routes = [
        ("POST", "/runs"),
        ("GET", f"/runs/{run}{q}"),
        ("GET", f"/runs/{run}/events{q}"),
        ("GET", f"/runs/{run}/poll{q}"),
        ("GET", f"/runs/{run}/stream{q}&offset=-1"),
        ("POST", f"/runs/{run}/cancel{q}"),
        ("POST", f"/runs/{run}/attach{q}"),
        ("GET", f"/threads/{thread}/active"),
        ("POST", f"/threads/{thread}/cancel"),
        # The service core's AG-UI endpoint comes with the core's routes, behind the same hook.
        ("POST", "/agui"),
        ("GET", f"/agui?runId={run}"),
    ]
    for method, path in routes:
        body = trigger(f"t-{secrets.token_hex(4)}", "lines 1 0") if path == "/runs" else None
        anonymous = httpx.request(method, coordinator.url + path, json=body, timeout=10)
        assert anonymous.status_code == 401, (method, path, anonymous.text)
        for wrong in (f"Bearer {CLIENT_TOKEN}x", CLIENT_TOKEN, f"Basic {CLIENT_TOKEN}"):
            refused = httpx.request(method, coordinator.url + path, json=body, headers={"Authorization": wrong})
            assert refused.status_code == 403, (method, path, wrong, refused.text)
    # Nothing the refused triggers asked for was started.
    assert coordinator.get(f"/threads/{thread}/active").json() == {"runId": None}
    assert coordinator.get(f"/runs/{run}{q}").json()["status"] == "completed"

    async def websockets() -> None:
        ws_url = coordinator.url.replace("http://", "ws://") + f"/runs/{run}/stream?threadId={thread}&offset=-1"
        for extra in (
            "",
            f"&ticket={mint_ws_ticket('another secret', run)}",
            f"&ticket={mint_ws_ticket(CLIENT_TOKEN, run, ttl_s=-5)}",
        ):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(ws_url + extra):
                    pass
            # As for HTTP: no credentials at all is 401, a ticket that does not hold is 403.
            assert refused.value.response.status_code == (403 if extra else 401), extra
        # A valid short-lived ticket (a browser cannot set headers) is consent for that run's tail only.
        async with connect(ws_url + f"&ticket={mint_ws_ticket(CLIENT_TOKEN, run)}") as ws:
            frames = [frame async for frame in _frames(ws)]
        assert '"type":"status"' in frames[-1] and len(frames) >= 4

    asyncio.run(websockets())


async def _frames(ws: Any) -> Any:
    try:
        while True:
            yield await ws.recv()
    except ConnectionClosed:
        return


def test_run_scoped_routes_need_their_own_thread(coordinator: CoordinatorProcess, finished: list[Finished]) -> None:
    run, _thread, _ = finished[0]
    for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/cancel"), ("POST", "/attach")]:
        missing = httpx.request(method, f"{coordinator.url}/runs/{run}{path}", headers=client_headers())
        assert missing.status_code == 400 and missing.json()["error"] == "threadId query param required"
        other = httpx.request(
            method, f"{coordinator.url}/runs/{run}{path}", params={"threadId": "t-other"}, headers=client_headers()
        )
        unknown = httpx.request(
            method, f"{coordinator.url}/runs/r-nope{path}", params={"threadId": "t-other"}, headers=client_headers()
        )
        # Another thread's run looks exactly like no run at all.
        assert other.status_code == unknown.status_code == 404, (path, other.text, unknown.text)
        assert other.json()["error"] == "unknown run"


def test_bridge_calls_without_the_runs_token_get_401_and_run_nothing(coordinator: CoordinatorProcess) -> None:
    thread, run = f"t-{secrets.token_hex(4)}", f"r-{secrets.token_hex(4)}"
    before = len(coordinator.tool_calls())
    assert coordinator.post("/runs", trigger(thread, "bridge 3", run, harness="bridge-env")).status_code == 202
    frames = sse_events(coordinator.url, run, thread, limit=6)
    match = re.search(r"bridge-url=(\S+?)\\n", _texts(frames))
    assert match, frames
    url = match.group(1)
    deadline = time.monotonic() + 30
    while len(coordinator.tool_calls()) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c["runId"] for c in coordinator.tool_calls()[before:]] == [run], "the agent's own call ran once"
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "record_call", "arguments": {"text": "intruder"}},
    }
    for headers in ({}, {"Authorization": "Bearer guessed"}, {"Authorization": f"Bearer {CLIENT_TOKEN}"}):
        refused = httpx.post(url, json=call, headers=headers, timeout=10)
        assert refused.status_code == 401, (headers, refused.text)
    assert len(coordinator.tool_calls()) == before + 1, "a refused call ran a tool"
    rest = sse_events(coordinator.url, run, thread, timeout=60)
    assert rest[-1][0] == "status" and '"completed"' in rest[-1][2], rest
    assert "bridge-status=200" in _texts(rest)
    # Settled: the run's registration is gone, whatever token a caller has.
    assert httpx.post(url, json=call, headers={"Authorization": "Bearer guessed"}, timeout=10).status_code == 404
    assert len(coordinator.tool_calls()) == before + 1


def test_a_host_or_forwarded_header_never_changes_a_callback_url(coordinator: CoordinatorProcess) -> None:
    thread, run = f"t-{secrets.token_hex(4)}", f"r-{secrets.token_hex(4)}"
    response = httpx.post(
        coordinator.url + "/runs",
        json=trigger(thread, "bridge 0", run, harness="bridge-env"),
        headers={**client_headers(), **EVIL},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    frames = sse_events(coordinator.url, run, thread)
    text = _texts(frames)
    assert f"bridge-url=http://127.0.0.1:{coordinator.port}/_bridge/runs/{run}/mcp" in text, text
    assert "evil" not in text and "169.254" not in text and "6379" not in text
    assert "bridge-status=200" in text and '"completed"' in frames[-1][2]


def test_offsets_and_ids_malformed_or_of_another_run_get_4xx(
    coordinator: CoordinatorProcess, finished: list[Finished]
) -> None:
    (run_a, thread_a, offsets_a), (_run_b, _thread_b, offsets_b) = finished
    events = f"{coordinator.url}/runs/{run_a}/events"
    last = offsets_a[-1]
    beyond = re.sub(r"\d+$", lambda m: str(int(m.group(0)) + 5).zfill(len(m.group(0))), last)
    for offset in (offsets_b[1], "abc", f"{last}\n", f" {last}", f"{last}\x00", beyond, "-2"):
        answer = httpx.get(events, params={"threadId": thread_a, "offset": offset}, headers=client_headers())
        assert answer.status_code == 400, (offset, answer.status_code, answer.text)
    # Last-Event-ID is the cursor when both are sent (and a foreign one is refused just the same).
    foreign = httpx.get(
        events, params={"threadId": thread_a, "offset": "-1"}, headers=client_headers({"Last-Event-ID": offsets_b[1]})
    )
    assert foreign.status_code == 400
    resumed = sse_events(coordinator.url, run_a, thread_a, last_event_id=offsets_a[2])
    assert [ident for _, ident, _ in resumed if ident] == offsets_a[3:]
    for bad_id in ("%2E%2E", "a%00b", "x" * 300, "a%0Ab", "%2F"):
        for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/cancel"), ("POST", "/attach")]:
            answer = httpx.request(
                method,
                f"{coordinator.url}/runs/{bad_id}{path}",
                params={"threadId": thread_a},
                headers=client_headers(),
            )
            assert 400 <= answer.status_code < 500, (bad_id, path, answer.status_code)
    for bad_id in ("%2E%2E", "a%00b", "x" * 300):
        answer = httpx.post(f"{coordinator.url}/tool-exec/{bad_id}", json={"name": "record_call", "args": {}})
        assert answer.status_code == 400, (bad_id, answer.text)
        answer = httpx.post(f"{coordinator.url}/_bridge/runs/{bad_id}/mcp", json={})
        assert answer.status_code == 400, (bad_id, answer.text)
    assert httpx.post(f"{coordinator.url}/tool-exec/{run_a}", json={"name": "record_call"}).status_code == 404

    async def websocket() -> None:
        ws_url = coordinator.url.replace("http://", "ws://") + f"/runs/{run_a}/stream?threadId={thread_a}"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url + f"&offset={offsets_b[1]}", additional_headers=client_headers()):
                pass
        assert refused.value.response.status_code == 400

    asyncio.run(websocket())


def test_the_sweep_needs_the_admin_secret(coordinator: CoordinatorProcess) -> None:
    for headers in ({}, client_headers(), {"Authorization": f"Bearer {ADMIN_TOKEN}x"}):
        assert httpx.post(coordinator.url + "/admin/sweep", headers=headers).status_code == 401
    swept = httpx.post(coordinator.url + "/admin/sweep", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert swept.status_code == 200 and swept.json()["considered"] == 0


def test_tool_exec_without_the_runs_token_gets_401_and_runs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.ndjson"

    async def main() -> None:
        db = open_database(tmp_path / "c.db")
        runs, events = sqlite_run_backend(db)
        from boxwright.coordinator import StoreSet

        config = CoordinatorConfig(
            sandboxes={"local": define_sandbox("te", local_process_sandbox(base_dir=tmp_path / "sb"))},
            harnesses={"command": CommandHarness(command="true")},
            stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
            client_token=CLIENT_TOKEN,
        )
        tool = record_call_tool(str(log))
        async with coordinator_server(config) as (url, coordinator), httpx.AsyncClient(timeout=10) as http:
            # The first request tells the coordinator its bound address (the origin of its callback URLs).
            assert (await http.get(f"{url}/healthz")).status_code == 200
            grant = coordinator.tool_exec.register("r-exec", [tool], thread_id="t-exec")
            other = coordinator.tool_exec.register("r-other", [tool], thread_id="t-other")
            assert grant.url == f"{url}/tool-exec/r-exec?threadId=t-exec"
            assert len(grant.token) >= 43 and grant.token not in grant.url
            call = {"name": "record_call", "args": {"text": "hi"}}
            for headers in (
                {},
                {"Authorization": f"Bearer {other.token}"},
                {"Authorization": grant.token},
                {"Authorization": f"Bearer {grant.token}x"},
            ):
                refused = await http.post(grant.url, json=call, headers=headers)
                assert refused.status_code == 401, (headers, refused.text)
            assert not log.exists(), "a refused call ran the tool"
            auth = {"Authorization": f"Bearer {grant.token}"}
            ok = await http.post(grant.url, json=call, headers=auth)
            assert ok.status_code == 200 and ok.json() == {"result": {"recorded": True, "echo": "hi"}}
            assert (await http.post(grant.url, json={"name": "nope", "args": {}}, headers=auth)).status_code == 400
            assert (await http.post(grant.url, content=b"{not json", headers=auth)).status_code == 400
            big = {"name": "record_call", "args": {"text": "x" * (1024 * 1024 + 1)}}
            assert (await http.post(grant.url, json=big, headers=auth)).status_code == 413
            grant.close()
            assert (await http.post(grant.url, json=call, headers=auth)).status_code == 404
            other.close()
        assert len(log.read_text().splitlines()) == 1

    asyncio.run(main())


def test_without_a_public_origin_an_unbound_host_is_never_a_callback_url(tmp_path: Path) -> None:
    """A55: no ``public_origin``, a server not bound to loopback and ``Host: evil.example``: the run that needs
    a callback fails with a configuration error naming the setting, and no URL with ``evil.example`` exists."""

    async def main() -> tuple[dict[str, Any], str]:
        db = open_database(tmp_path / "c.db")
        runs, events = sqlite_run_backend(db)
        from boxwright.coordinator import StoreSet

        config = CoordinatorConfig(
            sandboxes={"local": define_sandbox("origin", local_process_sandbox(base_dir=tmp_path / "sb"))},
            harnesses={"bridge-env": BridgeEnvHarness(command='echo "url=$BOXWRIGHT_BRIDGE_URL"')},
            tools=[record_call_tool(str(tmp_path / "calls"))],
            stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
            client_token=CLIENT_TOKEN,
        )
        app = create_coordinator_app(config)
        # The ASGI scope's server is what an un-proxied server bound to a public address reports.
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://evil.example") as http:
                posted = await http.post("/runs", json=trigger("t-o", "go", "r-origin"), headers=client_headers(EVIL))
                assert posted.status_code == 202, posted.text
                deadline = time.monotonic() + 30
                while True:
                    record = (await http.get("/runs/r-origin?threadId=t-o", headers=client_headers())).json()
                    if record["status"] != "running" or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                stored = "\n".join(str(e) for e in await events.snapshot("r-origin"))
        return record, stored

    record, stored = asyncio.run(main())
    assert record["status"] == "failed", record
    assert "public_origin" in record["error"]["message"] and "BOXWRIGHT_PUBLIC_ORIGIN" in record["error"]["message"]
    assert "evil" not in stored and "url=" not in stored


def test_serve_refuses_an_unknown_store_and_a_coordinator_without_client_auth(tmp_path: Path) -> None:
    """``boxwright serve`` says what to fix and exits 2 before it listens (an unknown store URL); a config with
    no client auth (no token, no hook, no ``allow_anonymous``) builds no app."""
    import os
    import subprocess
    import sys

    from boxwright.coordinator import CoordinatorConfigError

    env = {k: v for k, v in os.environ.items() if k not in ("BOXWRIGHT_CLIENT_TOKEN", "BOXWRIGHT_STORE")}
    argv = [sys.executable, "-m", "boxwright", "serve", "--port", "1", "--harness", "command:true"]
    argv += ["--store", "postgres://db/x", "--allow-anonymous"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "expected sqlite:///PATH or redis://HOST" in done.stderr and "Traceback" not in done.stderr
    sandbox = define_sandbox("noauth", local_process_sandbox(base_dir=tmp_path / "sb"))
    with pytest.raises(CoordinatorConfigError, match="client auth"):
        create_coordinator_app(CoordinatorConfig(sandboxes={"local": sandbox}, store_url=f"sqlite:///{tmp_path}/c.db"))
