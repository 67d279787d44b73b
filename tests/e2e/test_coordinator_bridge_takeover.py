"""Host tools keep working after a takeover: two ``boxwright serve`` replicas behind one public origin.

Replicas A and B share a SQLite store and a runner secret, and a failover proxy on 127.0.0.1 is their
public origin (``$BOXWRIGHT_PUBLIC_ORIGIN``): it forwards to A while A is alive, to B once A is dead.
A host-driven run's agent (the command harness with a scripted agent that calls the bridge itself)
calls the host tool ``record_call`` through that origin with the URL and token its first driver gave
it, A is SIGKILLed, and the agent calls the tool again, unchanged. That call reaches B before any
client has asked B for the run: B's bridge sees the run's derived token, takes the run over and holds
the call until the run is registered there, then serves it (B's tool log shows it). While the run is
still going on B, B's bridge takes that run's token and refuses another run's or another thread's
(401). The client, back through the origin from its last offset, gets every event once; the log holds
each of the two calls' bridge events once, and neither the secret nor the token is in any log.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import httpx

from boxwright.secrets import run_bridge_token
from tests.support.coordinator import CoordinatorProcess, coordinators, sse_events, started_together, trigger
from tests.support.failover_proxy import failover_proxy
from tests.support.replicas import free_port, record_row, stored_events, wait_for

LEASE_MS = 1500
# The agent: call record_call ("first"), wait for the test's go file, call it again ("second"), then wait
# for the done file (the test probes B's bridge meanwhile). Each call's outcome is printed (the run's text).
AGENT = r"""
import json, os, sys, time, urllib.error, urllib.request
go, done = sys.stdin.read().split()
url, token = os.environ["BOXWRIGHT_BRIDGE_URL"], os.environ["BOXWRIGHT_BRIDGE_TOKEN"]
print(f"bridge-url={url}", flush=True)
print(f"token={token}", flush=True)  # masked in the run's events like any secret of the run

def call(n, text):
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "record_call", "arguments": {"text": text}}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=150) as response:
            reply = json.loads(response.read())
            ok = "error" not in reply and not reply.get("result", {}).get("isError")
            print(f"{text}-status={response.status} ok={ok}", flush=True)
    except urllib.error.HTTPError as exc:
        print(f"{text}-status={exc.code}", flush=True)
        sys.exit(3)

def wait(path):
    deadline = time.monotonic() + 150
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.05)

call(1, "first")
print("waiting", flush=True)
wait(go)
call(2, "second")
wait(done)
print("done", flush=True)
"""


def _texts(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")


def _calls(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["args"]["text"] for line in path.read_text().splitlines() if line.strip()]


def _tools_list(url: str, token: str) -> int:
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    return httpx.post(url, json=body, headers=headers, timeout=30).status_code


def test_a_host_tool_call_after_the_takeover_is_served_by_the_successor(tmp_path: Path) -> None:
    agent_path = tmp_path / "bridge_agent.py"
    agent_path.write_text(AGENT)
    agent = f"{sys.executable} {agent_path}"
    secret = "bridge-takeover-secret-" + secrets.token_hex(12)
    db = tmp_path / "coordinator.db"
    go, done = tmp_path / "go", tmp_path / "done"
    a_log, b_log = tmp_path / "a-tools.ndjson", tmp_path / "b-tools.ndjson"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-bridge-{secrets.token_hex(4)}"
    a_port, b_port = free_port(), free_port()
    started = time.monotonic()
    with failover_proxy([a_port, b_port]) as proxy:
        shared = {"BOXWRIGHT_RUNNER_SECRET": secret, "BOXWRIGHT_PUBLIC_ORIGIN": proxy.url}
        made = started_together(
            lambda: CoordinatorProcess(
                "a", tmp_path, agent, port=a_port, lease_ms=LEASE_MS, env={**shared, "BWT_TOOL_LOG": str(a_log)}
            ),
            lambda: CoordinatorProcess(
                "b", tmp_path, agent, port=b_port, lease_ms=LEASE_MS, env={**shared, "BWT_TOOL_LOG": str(b_log)}
            ),
        )
        with coordinators(*made) as (a, b):
            body = trigger(thread, f"{go} {done}", run, harness="bridge-env")
            assert httpx.post(proxy.url + "/runs", json=body, headers=a.headers(), timeout=30).status_code == 202
            wait_for("the agent's first call, served by A", lambda: "waiting" in _texts(stored_events(db, run)), 60)
            failures = lambda: f"A: {a.stderr()}\nB: {b.stderr()}"  # noqa: E731
            assert _calls(a_log) == ["first"] and _calls(b_log) == [], failures()
            first = sse_events(proxy.url, run, thread, limit=len(stored_events(db, run)))
            a.kill()
            go.write_text("go")
            # No client has asked B for the run: the agent's own call (with the token A derived) makes B
            # take it over, waits while B claims it, and is served by B's bridge.
            wait_for("the agent's second call, served by B", lambda: _calls(b_log) == ["second"], 90)
            assert _calls(a_log) == ["first"], failures()
            assert "second-status=200 ok=True" in _texts(stored_events(db, run)) or wait_for(
                "the second call's answer in the log",
                lambda: "second-status=200 ok=True" in _texts(stored_events(db, run)),
                30,
            )
            # B serves the run under the token derived on A, and only that run's token.
            bridge = f"{proxy.url}/_bridge/runs/{run}/mcp"
            assert _tools_list(bridge, run_bridge_token(secret, run, thread)) == 200
            assert _tools_list(bridge, run_bridge_token(secret, f"{run}-other", thread)) == 401
            assert _tools_list(bridge, run_bridge_token(secret, run, f"{thread}-other")) == 401
            assert _tools_list(bridge, run_bridge_token("another-secret-" + "z" * 16, run, thread)) == 401
            done.write_text("done")
            rest = sse_events(proxy.url, run, thread, last_event_id=first[-1][1], timeout=90)
            assert rest[-1][0] == "status" and json.loads(rest[-1][2])["status"] == "completed", (rest[-3:], failures())
            seen = [ident for _, ident, _ in first + rest if ident is not None]
            assert len(seen) == len(set(seen)), "an event was delivered twice"
            assert [i for _, i, _ in sse_events(proxy.url, run, thread) if i] == seen, "the client missed an event"
            events = stored_events(db, run)
            types = [e.type for e in events]
            assert types.count("RUN_STARTED") == 1 and types.count("RUN_FINISHED") == 1, types
            text = _texts(events)
            assert text == (
                f"bridge-url={bridge}\ntoken=***\nfirst-status=200 ok=True\nwaiting\nsecond-status=200 ok=True\ndone\n"
            ), text
            bridged = [
                (e.name, (e.value or {}).get("args"))
                for e in events
                if e.type == "CUSTOM" and str(e.name).startswith("tool_bridge.")
            ]
            assert bridged == [
                ("tool_bridge.started", {"text": "first"}),
                ("tool_bridge.finished", None),
                ("tool_bridge.started", {"text": "second"}),
                ("tool_bridge.finished", None),
            ], bridged
            row = record_row(db, run)
            assert row is not None and row["status"] == "completed" and row["driver_epoch"] == 2, (row, failures())
            assert proxy.accepted[b_port] > 0
            token = run_bridge_token(secret, run, thread)
            for where, said in (("A's log", a.stderr()), ("B's log", b.stderr()), ("the run's events", repr(events))):
                assert secret not in said and token not in said, where
    print(f"\nbridge takeover: {time.monotonic() - started:.1f} s")
