"""A hostile client against the coordinator's client auth (``coordinator.auth``), under uvicorn.

What ``tests/integration/test_coordinator_security.py`` does not already try: a hook that grants some
actions only (a read-only viewer must not decide an approval), a hook scoped to a thread (it must not
be told a thread the request does not act on), the AG-UI join of another thread's run, and tickets
that are not tickets (garbage, truncated, another run's, expired) on every route that takes one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import HTTPConnection

from boxwright.coordinator import AuthScope, CoordinatorConfig, StoreSet, mint_ws_ticket
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, client_headers, coordinator_server, trigger, wait_record

VIEWER = "Bearer viewer-" + "v" * 24
READS = ("runs.read", "runs.tail", "threads.read")


@asynccontextmanager
async def _server(tmp: Path, authorize: Any) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    db = open_database(tmp / "c.db")
    runs, events = sqlite_run_backend(db)
    config = CoordinatorConfig(
        sandboxes={"local": define_sandbox("attack", local_process_sandbox(base_dir=tmp / "sb"))},
        harnesses={"command": CommandHarness(command="echo attacked")},
        stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
        authorize=authorize,
    )
    async with coordinator_server(config) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield url, http


def _header(connection: HTTPConnection) -> str:
    return connection.headers.get("authorization", "")


def test_a_read_only_client_cannot_answer_an_approval(tmp_path: Path) -> None:
    """An approval decides what the agent may do: it is not a read, whatever else a viewer may see."""
    seen: list[str] = []

    def authorize(connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
        seen.append(action)
        return _header(connection) == f"Bearer {CLIENT_TOKEN}" or (_header(connection) == VIEWER and action in READS)

    async def main() -> None:
        async with _server(tmp_path, authorize) as (url, http):
            assert (
                await http.post("/runs", json=trigger("t-a", "go", "r-a"), headers=client_headers())
            ).status_code == 202
            await wait_record(url, "r-a", "t-a", status=("completed",))
            viewer = {"Authorization": VIEWER}
            assert (await http.get("/runs/r-a", params={"threadId": "t-a"}, headers=viewer)).status_code == 200
            answer = {"approvalId": "agent:command:rm -rf /", "decision": "allow"}
            refused = await http.post("/runs/r-a/approval", params={"threadId": "t-a"}, json=answer, headers=viewer)
            assert refused.status_code == 403, (refused.status_code, refused.text, seen[-1])
            for path in ("/runs/r-a/cancel", "/runs/r-a/attach"):
                assert (await http.post(path, params={"threadId": "t-a"}, headers=viewer)).status_code == 403, path

    asyncio.run(main())


def test_a_thread_scoped_hook_is_never_told_a_thread_the_trigger_does_not_start_on(tmp_path: Path) -> None:
    """``POST /runs?threadId=mine`` with ``{"threadId": "victim"}``: a hook that allows creates on the user's
    own thread must not let the run start on the victim's (the query's thread is not the run's)."""

    def authorize(connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
        return _header(connection) == VIEWER and scope.thread_id == "t-mine"

    async def main() -> None:
        async with _server(tmp_path, authorize) as (_url, http):
            viewer = {"Authorization": VIEWER}
            body = trigger("t-victim", "go", "r-confused")
            posted = await http.post("/runs", params={"threadId": "t-mine"}, json=body, headers=viewer)
            agui = {"threadId": "t-victim", "runId": "r-confused-agui", "messages": [], "tools": [], "context": []}
            agui["messages"] = [{"id": "m1", "role": "user", "content": "go"}]
            agui_posted = await http.post("/agui", params={"threadId": "t-mine"}, json=agui, headers=viewer)
            assert posted.status_code in (400, 403), posted.text
            assert agui_posted.status_code in (400, 403), agui_posted.text[:300]
            active = await http.get("/threads/t-victim/active", headers={"Authorization": VIEWER})
            assert active.status_code == 403 or active.json() == {"runId": None}

    asyncio.run(main())


def test_the_agui_join_of_another_threads_run_is_refused_like_the_other_run_routes(tmp_path: Path) -> None:
    """``GET /agui?runId=`` reads a run's whole log: it needs the run's own ``?threadId`` (404 otherwise)."""

    def authorize(connection: HTTPConnection, action: str, scope: AuthScope) -> bool:
        return _header(connection) == f"Bearer {CLIENT_TOKEN}"

    async def main() -> None:
        async with _server(tmp_path, authorize) as (url, http):
            assert (
                await http.post("/runs", json=trigger("t-b", "go", "r-b"), headers=client_headers())
            ).status_code == 202
            await wait_record(url, "r-b", "t-b", status=("completed",))
            join = {"runId": "r-b", "offset": "-1"}
            no_thread = await http.get("/agui", params=join, headers=client_headers())
            other = await http.get("/agui", params={**join, "threadId": "t-other"}, headers=client_headers())
            own = await http.get("/agui", params={**join, "threadId": "t-b"}, headers=client_headers())
            assert own.status_code == 200 and "attacked" in own.text, own.text[:300]
            assert no_thread.status_code == 400 and "attacked" not in no_thread.text, no_thread.text[:300]
            assert other.status_code == 404 and "attacked" not in other.text, other.text[:300]

    asyncio.run(main())


def test_tickets_that_are_not_this_runs_valid_ticket_are_refused_everywhere(tmp_path: Path) -> None:
    """A ticket is consent for one run's tail for a minute; anything else (and any other action) is a 403."""
    from boxwright.coordinator import bearer_authorizer

    async def main() -> None:
        async with _server(tmp_path, bearer_authorizer(CLIENT_TOKEN)) as (url, http):
            for run, thread in (("r-c", "t-c"), ("r-d", "t-d")):
                assert (
                    await http.post("/runs", json=trigger(thread, "go", run), headers=client_headers())
                ).status_code == 202
                await wait_record(url, run, thread, status=("completed",))
            good = mint_ws_ticket(CLIENT_TOKEN, "r-c")
            expires, _, mac = good.partition(".")
            bad = [
                mint_ws_ticket(CLIENT_TOKEN, "r-d"),  # another run's
                mint_ws_ticket(CLIENT_TOKEN, "r-c", ttl_s=-1),  # expired
                good[:-1],  # truncated
                f"{expires}.",
                f".{mac}",
                f"{int(expires) + 3600}.{mac}",  # its expiry pushed back
                "\u00b2.x",  # str.isdigit() says yes, int() says no
                "9" * 5000 + "." + mac,  # int() refuses over 4,300 digits
                "x" * 10_000,
            ]
            tails = ["/runs/r-c/events", "/runs/r-c/poll", "/runs/r-c/stream"]
            for ticket in bad:
                for path in tails:
                    refused = await http.get(path, params={"threadId": "t-c", "ticket": ticket, "offset": "-1"})
                    assert refused.status_code == 403, (path, ticket[:40], refused.status_code)
            # A valid ticket tails its run, and is consent for nothing else.
            tailed = await http.get("/runs/r-c/poll", params={"threadId": "t-c", "ticket": good, "offset": "-1"})
            assert tailed.status_code == 200, tailed.text
            for method, path in [("GET", "/runs/r-c"), ("POST", "/runs/r-c/cancel"), ("POST", "/runs/r-c/approval")]:
                other = await http.request(method, path, params={"threadId": "t-c", "ticket": good})
                assert other.status_code == 403, (method, path, other.status_code)

    asyncio.run(main())
