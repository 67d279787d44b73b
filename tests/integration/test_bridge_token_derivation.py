"""A host-driven run's bridge token: derived from the replicas' shared secret, random without one.

Real runs (``run_agent``, the command harness in a local-process sandbox) on real bridges over HTTP on
127.0.0.1: the token the run got on host A is the one host B registers the same run under, B's bridge
serves that run's tools with it and refuses another run's derived token (401); the agent's print of
its token is masked in the run's events. Without a secret every run gets a fresh random token. And a
bridge told a run is coming (``ToolBridgeApp.hold_unregistered``) holds a call until it is registered.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.agent import run_agent
from boxwright.colocated import RUNNER_SECRET_ENV
from boxwright.definition import define_sandbox
from boxwright.events import Event
from boxwright.providers import local_process_sandbox
from boxwright.secrets import TOKEN_PREFIX, run_bridge_token
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge import HostToolBridge, start_host_tool_bridge
from tests.support.coordinator import BridgeEnvHarness, record_call_tool

SECRET = "derivation-test-secret-" + "s" * 16
THREAD = "t-derive"
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "record_call", "arguments": {}}}


def _harness(token_file: Path, go: Path | None = None) -> BridgeEnvHarness:
    wait = f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; " if go is not None else ""
    command = (
        f'printf %s "$BOXWRIGHT_BRIDGE_TOKEN" > {shlex.quote(str(token_file))}; '
        f'echo "token=$BOXWRIGHT_BRIDGE_TOKEN"; {wait}echo done'
    )
    return BridgeEnvHarness(command=command)


async def _run(
    tmp: Path, bridge: HostToolBridge, run_id: str, harness: BridgeEnvHarness, secret: str | None
) -> list[Event]:
    sandbox = define_sandbox("derive", local_process_sandbox(base_dir=str(tmp / "sb")))
    tools = [record_call_tool(str(tmp / "tools.ndjson"))]
    events = run_agent(
        sandbox,
        harness,
        "go",
        thread_id=THREAD,
        run_id=run_id,
        tools=tools,
        bridge=bridge,
        runner_secret=secret,
        store=MemoryInstanceStore(),
    )
    return [e async for e in events]


def _text(events: list[Event]) -> str:
    return "".join(getattr(e, "delta", "") for e in events if e.type == "TEXT_MESSAGE_CONTENT")


def test_a_token_derived_on_one_host_is_accepted_by_anothers_bridge_for_that_run_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUNNER_SECRET_ENV, raising=False)
    run = "r-derive-1"
    token_file, go = tmp_path / "token-a", tmp_path / "go"

    async def main() -> None:
        async with await start_host_tool_bridge() as a, await start_host_tool_bridge() as b:
            on_a = await _run(tmp_path, a, run, _harness(token_file), SECRET)
            assert on_a[-1].type == "RUN_FINISHED", on_a[-1]
            token = token_file.read_text()
            assert token == run_bridge_token(SECRET, run, THREAD) and token.startswith(TOKEN_PREFIX)
            assert "token=***\n" in _text(on_a) and token not in repr(on_a)
            # The same run driven from host B (as a successor would): registered under the very same token.
            token_file.unlink()
            driving = asyncio.ensure_future(_run(tmp_path, b, run, _harness(token_file, go), SECRET))
            try:
                deadline = time.monotonic() + 30
                while run not in b.app.run_ids or not token_file.exists():
                    assert time.monotonic() < deadline and not driving.done(), "B never registered the run"
                    await asyncio.sleep(0.05)
                assert token_file.read_text() == token
                async with httpx.AsyncClient(timeout=10) as http:

                    async def post(url: str, bearer: str) -> httpx.Response:
                        return await http.post(url, json=CALL, headers={"Authorization": f"Bearer {bearer}"})

                    served = await post(b.url_for(run), token)
                    assert served.status_code == 200 and "recorded" in served.text, served.text
                    other = await post(b.url_for(run), run_bridge_token(SECRET, "r-derive-other", THREAD))
                    assert other.status_code == 401
                    elsewhere = await post(b.url_for(run), run_bridge_token(SECRET, run, "t-other"))
                    assert elsewhere.status_code == 401
                    # A's bridge no longer has the run: its token opens nothing there.
                    assert (await post(a.url_for(run), token)).status_code == 404
            finally:
                go.write_text("go")
                on_b = await asyncio.wait_for(driving, 60)
            assert on_b[-1].type == "RUN_FINISHED", on_b[-1]
            calls = [json.loads(line) for line in (tmp_path / "tools.ndjson").read_text().splitlines()]
            assert [c["runId"] for c in calls] == [run]

    asyncio.run(main())


def test_without_a_shared_secret_every_run_gets_a_random_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNNER_SECRET_ENV, raising=False)
    run = "r-random-1"

    async def main() -> list[str]:
        tokens = []
        async with await start_host_tool_bridge() as bridge:
            for n in range(2):
                token_file = tmp_path / f"token-{n}"
                events = await _run(tmp_path, bridge, run, _harness(token_file), None)
                assert events[-1].type == "RUN_FINISHED", events[-1]
                tokens.append(token_file.read_text())
                assert "token=***\n" in _text(events)
        return tokens

    first, second = asyncio.run(main())
    assert first != second and first.startswith(TOKEN_PREFIX) and second.startswith(TOKEN_PREFIX)
    assert run_bridge_token(SECRET, run, THREAD) not in (first, second)
    # The environment's secret is the shared one when none is passed.
    monkeypatch.setenv(RUNNER_SECRET_ENV, SECRET)
    token_file = tmp_path / "token-env"
    asyncio.run(_with_bridge(lambda bridge: _run(tmp_path, bridge, run, _harness(token_file), None)))
    assert token_file.read_text() == run_bridge_token(SECRET, run, THREAD)


async def _with_bridge(work: Any) -> Any:
    async with await start_host_tool_bridge() as bridge:
        return await work(bridge)


def test_the_derivation_is_one_function_of_the_secret_and_both_ids() -> None:
    token = run_bridge_token(SECRET, "r-1", "t-1")
    assert token == run_bridge_token(SECRET, "r-1", "t-1") and token.startswith(TOKEN_PREFIX)
    assert len(token) == len(TOKEN_PREFIX) + 64
    others = {
        run_bridge_token(SECRET, "r-2", "t-1"),
        run_bridge_token(SECRET, "r-1", "t-2"),
        run_bridge_token(SECRET + "x", "r-1", "t-1"),
        # The ids are separated: ("r-1", "t-1") and ("r-1\0t", "-1") must not collide.
        run_bridge_token(SECRET, "r-1\0t", "-1"),
    }
    assert token not in others and len(others) == 4
    assert SECRET not in token
    assert run_bridge_token(None, "r-1", "t-1") != run_bridge_token(None, "r-1", "t-1")
    assert run_bridge_token("", "r-1", "t-1") != token


def test_a_bridge_holds_a_call_for_a_run_it_is_told_is_coming(tmp_path: Path) -> None:
    log = tmp_path / "held.ndjson"
    token = run_bridge_token(SECRET, "r-held", THREAD)
    coming = {"r-held": True}

    async def expected(run_id: str, authorization: bytes) -> Any:
        if authorization != f"Bearer {token}".encode() or run_id not in coming:
            return None
        return lambda: coming[run_id]

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge:
            bridge.app.hold_unregistered(expected, hold_s=20)
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(timeout=30) as http:
                started = time.monotonic()
                held = asyncio.ensure_future(http.post(bridge.url_for("r-held"), json=CALL, headers=headers))
                await asyncio.sleep(0.5)
                assert not held.done(), "the call was answered before the run was registered"
                registration = bridge.register("r-held", [record_call_tool(str(log))], token=token)
                served = await held
                assert served.status_code == 200 and "recorded" in served.text, served.text
                assert 0.5 <= time.monotonic() - started < 10
                registration.close()
                # Not vouched for (another token): a 404 at once, as without a hold.
                wrong = await http.post(
                    bridge.url_for("r-held"), json=CALL, headers={"Authorization": "Bearer " + "x" * 40}
                )
                assert wrong.status_code == 404
                # Vouched for, then no longer coming (a claim refused): a 404 once that is known.
                waiting = asyncio.ensure_future(http.post(bridge.url_for("r-held"), json=CALL, headers=headers))
                await asyncio.sleep(0.3)
                coming["r-held"] = False
                assert (await waiting).status_code == 404
            bridge.app.hold_unregistered(expected, hold_s=0.3)
            coming["r-held"] = True
            async with httpx.AsyncClient(timeout=30) as http:
                started = time.monotonic()
                late = await http.post(bridge.url_for("r-held"), json=CALL, headers=headers)
                assert late.status_code == 404 and 0.3 <= time.monotonic() - started < 5

    asyncio.run(main())
    assert len(log.read_text().splitlines()) == 1
