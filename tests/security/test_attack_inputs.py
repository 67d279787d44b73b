"""Hostile bodies, content types, offsets and resume ids on the coordinator's newer routes, under uvicorn.

``POST /agui``, ``POST /runs/{id}/approval``, ``POST /runs/{id}/attach`` and ``GET /agui`` (the older
routes are ``tests/security/test_bounded_input.py`` and ``test_bad_ids.py``): deep JSON, invalid UTF-8,
a wrong content type, an oversized body, NUL bytes; ``Last-Event-ID`` / ``offset`` / ``lastSeq`` that are
garbage, huge, negative or another run's. Each is a 4xx JSON answer (never a 500 or a cut stream), an
approval answered from another thread is a 404, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, client_headers, coordinator_server, trigger, wait_record

DEEP = b'{"threadId": "t-new", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BODIES = [
    ("deep", DEEP, "application/json"),
    ("invalid utf-8", b'{"threadId": "\xff\xfe", "approvalId": "\xff", "decision": "allow"}', "application/json"),
    ("text/plain", b'{"threadId": "t-new"}', "text/plain"),
    ("oversized", b'{"threadId": "' + b"t" * (3 << 20) + b'"}', "application/json"),
    ("nul", b'{"threadId": "t\x00", "approvalId": "a\x00", "decision": "allow"}', "application/json"),
    ("not an object", b"[1, 2, 3]", "application/json"),
]


def test_hostile_bodies_offsets_and_resume_ids_get_a_4xx_and_the_server_keeps_serving(tmp_path: Path) -> None:
    db = open_database(tmp_path / "c.db")
    runs, events = sqlite_run_backend(db)
    config = CoordinatorConfig(
        sandboxes={"local": define_sandbox("inputs", local_process_sandbox(base_dir=tmp_path / "sb"))},
        harnesses={"command": CommandHarness(command="echo hello")},
        stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
        client_token=CLIENT_TOKEN,
    )

    async def main() -> None:
        async with (
            coordinator_server(config) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=30, headers=client_headers()) as http,
        ):
            for run, thread in (("r-1", "t-1"), ("r-2", "t-2")):
                assert (await http.post("/runs", json=trigger(thread, "go", run))).status_code == 202
                await wait_record(url, run, thread, status=("completed",))
            other_offset = (await http.get("/runs/r-2/poll", params={"threadId": "t-2", "offset": "-1"})).json()
            foreign = other_offset["nextOffset"]  # an offset r-2's log issued: refused on r-1
            answers: list[tuple[str, int, str]] = []
            for path in ("/agui", "/runs/r-1/approval"):
                for name, body, content_type in BODIES:
                    response = await http.post(
                        path, params={"threadId": "t-1"}, content=body, headers={"content-type": content_type}
                    )
                    answers.append((f"POST {path} {name}", response.status_code, response.text[:120]))
            answer = {"approvalId": "agent:command:rm -rf /", "decision": "allow"}
            crossed = await http.post("/runs/r-1/approval", params={"threadId": "t-2"}, json=answer)
            assert crossed.status_code == 404 and crossed.json()["code"] == "unknown_run", crossed.text
            resumes = ["abc", "-5", "9" * 40, "1e3", "x" * 10_000, "1_2", str(2**63), foreign]
            for value in resumes:
                for how in ("Last-Event-ID", "offset", "lastSeq"):
                    params = {"threadId": "t-1", "runId": "r-1"}
                    headers: dict[str, str] = {}
                    if how == "Last-Event-ID":
                        headers[how] = value
                    else:
                        params[how] = value
                    response = await http.get("/agui", params=params, headers=headers)
                    answers.append((f"GET /agui {how}={value[:12]}", response.status_code, response.text[:120]))
            bad = [a for a in answers if not 400 <= a[1] < 500 and not a[0].startswith("GET /agui lastSeq")]
            assert not bad, bad
            # lastSeq is the WebSocket's name: GET /agui ignores it and replays from the start, whole.
            replay = [a for a in answers if a[0].startswith("GET /agui lastSeq")]
            assert all(status == 200 and "RUN_STARTED" in text for _, status, text in replay), replay
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/runs/r-1", params={"threadId": "t-1"})).json()["status"] == "completed"

    asyncio.run(main())
