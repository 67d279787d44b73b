"""The approval answer route (POST /runs/{id}/approval) and the desk behind it, through the example app.

The happy path (a person allows, the agent goes on) is in test_example_app.py and the browser
tests; here: what is refused, and what the desk does when nobody answers or two calls ask at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx

from boxwright.middleware.approvals import ApprovalDesk
from boxwright.tool_bridge.asgi import serve_asgi

APPROVAL = "demo:command:python3 -m unittest -q"


def test_an_answer_the_run_is_not_waiting_for_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    from examples.chat_app.app import create_app

    async def main() -> None:
        app = create_app(tmp_path / "chat.db", sandbox_base=str(tmp_path / "sandboxes"), pace_s=0.05)
        server = await serve_asgi(app, lifespan="on")
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30, headers={"X-User": "alice"}) as client:
                thread_id = f"alice-{uuid.uuid4().hex[:8]}"
                body = {"threadId": thread_id, "prompt": "Greet the team.", "metadata": {"harness": "demo"}}
                run_id = (await client.post("/agent/runs", json=body)).json()["runId"]
                route = f"/agent/runs/{run_id}/approval"
                early = await client.post(route, json={"approvalId": APPROVAL, "decision": "allow"})
                bad = [
                    await client.post(route, content=b"not json"),
                    await client.post(route, json={"approvalId": APPROVAL, "decision": "maybe"}),
                    await client.post(route, json={"approvalId": APPROVAL}),
                    await client.post(route, json={"approvalId": APPROVAL, "decision": "allow", "extra": 1}),
                ]
                too_large = await client.post(route, content=b" " * 5000)
                unknown = await client.post(
                    "/agent/runs/no-such-run/approval", json={"approvalId": APPROVAL, "decision": "allow"}
                )
                assert early.status_code == 404 and early.json()["code"] == "no_pending_approval", early.text
                assert [r.status_code for r in bad] == [400] * 4 and {r.json()["code"] for r in bad} == {"invalid_body"}
                assert too_large.status_code == 413 and too_large.json()["code"] == "too_large"
                assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_run"
                # The early answer settled nothing: the run still asks, and waits for the real answer.
                deadline = time.monotonic() + 60
                while True:
                    poll = await client.get(f"/agent/runs/{run_id}/poll", params={"offset": "-1", "wait": "0"})
                    names = [e["event"].get("name") for e in poll.json()["events"]]
                    if "approval-requested" in names:
                        break
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                assert "approval-resolved" not in names
                denied = await client.post(route, json={"approvalId": APPROVAL, "decision": "deny"})
                assert denied.status_code == 200 and denied.json()["decision"] == "deny"
                again = await client.post(route, json={"approvalId": APPROVAL, "decision": "allow"})
                assert again.status_code == 404, "a question is answered once"
                while (await client.get(f"/agent/runs/{run_id}")).json()["status"] == "running":
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                poll = await client.get(f"/agent/runs/{run_id}/poll", params={"offset": "-1", "wait": "0"})
                events = [e["event"] for e in poll.json()["events"]]
                resolved = [e["value"] for e in events if e.get("name") == "approval-resolved"]
                assert resolved == [{"approvalId": APPROVAL, "decision": "deny", "by": "person"}]
                said = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
                assert "I did not run the tests" in said
                assert not any(e.get("toolCallName") == "Bash" and "unittest" in str(e) for e in events)
        finally:
            await server.close()

    asyncio.run(main())


def test_the_desk_denies_by_silence_shares_one_answer_and_forgets_a_caller_that_left() -> None:
    async def main() -> None:
        desk = ApprovalDesk()
        assert await desk.ask("r", "q", timeout_s=0.05) is None, "nobody answered: no decision"
        assert desk.pending("r") == []
        first = asyncio.ensure_future(desk.ask("r", "q"))
        second = asyncio.ensure_future(desk.ask("r", "q"))
        await asyncio.sleep(0)
        assert desk.pending("r") == ["q"]
        assert desk.answer("r", "q", True) is True
        assert await first is True and await second is True
        assert desk.answer("r", "q", True) is False, "answered once"
        leaving = asyncio.ensure_future(desk.ask("r", "q2"))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert desk.pending("r") == [] and desk.answer("r", "q2", True) is False

    asyncio.run(main())
