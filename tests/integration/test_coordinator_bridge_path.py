"""The coordinator's MCP bridge at the spec's path (§6 ``POST /_bridge/{id}``) as well as the one agents are given.

The URL a run's agent gets is ``/_bridge/runs/<id>/mcp`` (the path a standalone bridge serves too); a
client written to the spec's route table posts to ``/_bridge/<id>``. Both reach the same registration:
same token check (401, nothing run), same id check (400), same settle (404), same JSON-RPC answers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, coordinator_server, record_call_tool


def _call(ident: int, text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": ident,
        "method": "tools/call",
        "params": {"name": "record_call", "arguments": {"text": text}},
    }


def test_the_spec_bridge_path_serves_the_runs_bridge_behind_the_same_checks(tmp_path: Path) -> None:
    log = tmp_path / "calls.ndjson"

    def calls() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    async def main() -> None:
        db = open_database(tmp_path / "c.db")
        runs, events = sqlite_run_backend(db)
        config = CoordinatorConfig(
            sandboxes={"local": define_sandbox("bp", local_process_sandbox(base_dir=tmp_path / "sb"))},
            harnesses={"command": CommandHarness(command="true")},
            stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
            client_token=CLIENT_TOKEN,
        )
        async with coordinator_server(config) as (url, coordinator), httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{url}/healthz")).status_code == 200  # the bound address is known from here
            reg = coordinator.bridge.register("r-path", [record_call_tool(str(log))])
            other = coordinator.bridge.register("r-other", [record_call_tool(str(log))])
            assert reg.url == f"{url}/_bridge/runs/r-path/mcp"
            short = f"{url}/_bridge/r-path"
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}}
            answer = await http.post(short, json=init, headers=reg.headers)
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["protocolVersion"] == "2024-11-05"
            assert answer.json()["result"]["serverInfo"]["name"] == "boxwright"
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            noted = await http.post(short, json=note, headers=reg.headers)
            assert (noted.status_code, noted.content) == (202, b"")
            tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            listed = await http.post(short, json=tools_list, headers=reg.headers)
            assert [t["name"] for t in listed.json()["result"]["tools"]] == ["record_call"]
            for headers in (
                {},
                {"Authorization": "Bearer guessed"},
                other.headers,
                {"Authorization": reg.token},
                {"Authorization": f"Bearer {CLIENT_TOKEN}"},
            ):
                refused = await http.post(short, json=_call(3, "intruder"), headers=headers)
                assert refused.status_code == 401, (headers, refused.status_code, refused.text)
            assert calls() == [], "a refused call on the spec path ran a tool"
            done = await http.post(short, json=_call(4, "spec path"), headers=reg.headers)
            assert done.status_code == 200 and done.json()["result"]["isError"] is False, done.text
            long = await http.post(reg.url, json=_call(5, "agent path"), headers=reg.headers)
            assert long.status_code == 200, long.text
            assert [line.count("spec path") + line.count("agent path") for line in calls()] == [1, 1]
            for bad in ("%2E%2E", "a%00b", "x" * 300, "%2F"):
                refused = await http.post(f"{url}/_bridge/{bad}", json=_call(6, "bad"), headers=reg.headers)
                assert refused.status_code == 400, (bad, refused.status_code, refused.text)
            reg.close()
            gone = await http.post(short, json=_call(7, "after settle"), headers=reg.headers)
            assert gone.status_code == 404, gone.text
            other.close()
        assert len(calls()) == 2

    asyncio.run(main())
