"""Run semantics where boxwright follows the seed: cancel ends ``aborted``, durability is one opt-in,
a durable run needs the caller's run id, ``keep_alive`` is refused, one active run per thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette

from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import Lifecycle, SandboxHooks, define_sandbox
from boxwright.errors import DurableRunIdRequiredError, HalfDurableRunError
from boxwright.events import CustomEvent, Event, RunFinishedEvent, encode_event
from boxwright.file_hooks import FileHookContext, RunFileHooks
from boxwright.harnesses.command import command_harness
from boxwright.middleware import RunSpec, SandboxService, StartRunRequest, sandbox_routes
from boxwright.middleware.service import RecordDurability
from boxwright.providers import local_process_sandbox
from boxwright.stores.memory import MemoryInstanceStore, memory_run_backend
from boxwright.stores.sqlite import SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import serve_asgi
from boxwright.watcher import FileEvent, WorkspaceWatcher


def _tag() -> str:
    return uuid.uuid4().hex[:12]


async def _until_log_has(log: object, run_id: str, event_type: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.type == event_type for e in await log.snapshot(run_id)):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"no {event_type} in run {run_id}'s log after {timeout} s"
        await asyncio.sleep(0.05)


def test_a_cancel_under_a_cross_process_claim_ends_aborted_not_failed(tmp_path: Path) -> None:
    # With a lock store that spans processes the service drives the run under its claim, where the
    # pump sees no signal: only the RUN_ERROR the run reports tells it the run was stopped.
    async def main() -> None:
        db = open_database(tmp_path / "runs.db")
        runs, log = sqlite_run_backend(db)
        service = SandboxService(runs, log, store=MemoryInstanceStore(), locks=SqliteLockStore(db))
        sandbox = define_sandbox("cancel", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)
        try:
            run_id = await service.start_run(
                sandbox,
                command_harness("echo started; sleep 60"),
                "go",
                thread_id=f"t-{_tag()}",
                run_id=f"cancel-{_tag()}",
            )
            await _until_log_has(log, run_id, "TEXT_MESSAGE_CONTENT", 20)
            await service.cancel_run(run_id)
            record = await asyncio.wait_for(service.wait_run(run_id), 30)
            assert record is not None
            assert record.status == "aborted", record
            assert record.error is not None and record.error.code == "cancelled"
            assert record.cancel_requested is True
            last = (await log.snapshot(run_id))[-1]
            assert last.type == "RUN_ERROR" and last.code == "cancelled"  # type: ignore[union-attr]
        finally:
            await service.aclose(cancel=True)
            await db.close()

    asyncio.run(main())


async def _first(stream: AsyncGenerator[Event, None]) -> Event:
    async with contextlib.aclosing(stream) as events:
        return await anext(events)


def test_a_journaled_run_needs_the_callers_run_id(tmp_path: Path) -> None:
    sandbox = define_sandbox("rid", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def main() -> None:
        stream: Any = run_agent(sandbox, command_harness("echo hi"), "go", thread_id="t", journal=JournalOptions())
        with pytest.raises(DurableRunIdRequiredError, match="needs a run_id"):
            await _first(stream)
        assert not (tmp_path / "sb").exists() or not any((tmp_path / "sb").iterdir()), "refused before any sandbox"

    asyncio.run(main())


def test_durability_without_a_journal_is_refused_before_any_sandbox(tmp_path: Path) -> None:
    runs, _ = memory_run_backend()
    sandbox = define_sandbox("half", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def main() -> None:
        stream: Any = run_agent(
            sandbox,
            command_harness("echo hi"),
            "go",
            thread_id="t",
            run_id=f"half-{_tag()}",
            durability=RecordDurability(runs, "half"),
        )
        with pytest.raises(HalfDurableRunError, match="durability is one opt-in"):
            await _first(stream)
        assert not (tmp_path / "sb").exists() or not any((tmp_path / "sb").iterdir()), "refused before any sandbox"

    asyncio.run(main())


def test_keep_alive_is_refused_with_what_to_do_instead() -> None:
    with pytest.raises(ValueError, match=r"keep_alive.*not supported.*destroy_on_complete"):
        Lifecycle(keep_alive="30m")
    with pytest.raises(msgspec.ValidationError, match="keep_alive"):
        msgspec.convert({"keep_alive": "30m"}, Lifecycle)
    assert Lifecycle(destroy_on_complete=True).keep_alive is None


def _service_app(service: SandboxService) -> Any:
    return Starlette(routes=sandbox_routes(service))


def test_a_second_start_on_a_busy_thread_gets_409_thread_busy_naming_the_active_run(tmp_path: Path) -> None:
    async def main() -> None:
        runs, log = memory_run_backend()
        sandbox = define_sandbox("busy", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

        def factory(body: StartRunRequest) -> RunSpec:
            return RunSpec(sandbox=sandbox, harness=command_harness(body.prompt), durable=False)

        service = SandboxService(runs, log, store=MemoryInstanceStore(), factory=factory)
        server = await serve_asgi(_service_app(service))
        thread = f"t-{_tag()}"
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                first = await client.post("/runs", json={"prompt": "echo one; sleep 60", "threadId": thread})
                assert first.status_code == 202, first.text
                active = first.json()["runId"]
                await _until_log_has(log, active, "TEXT_MESSAGE_CONTENT", 20)
                second = await client.post("/runs", json={"prompt": "echo two", "threadId": thread})
                assert second.status_code == 409, second.text
                body = second.json()
                assert body["code"] == "thread_busy" and body["activeRunId"] == active
                assert active in body["error"] and "cancel" in body["error"]
                # Another thread is not affected; a retried trigger of the active run is not refused.
                other = await client.post("/runs", json={"prompt": "echo other", "threadId": f"{thread}-b"})
                assert other.status_code == 202, other.text
                retried = await client.post("/runs", json={"prompt": "x", "threadId": thread, "runId": active})
                assert retried.status_code == 202 and retried.json()["runId"] == active
                # Once the active run has ended, the thread takes a new run.
                await client.post(f"/runs/{active}/cancel")
                assert (await asyncio.wait_for(service.wait_run(active), 30)).status == "aborted"  # type: ignore[union-attr]
                third = await client.post("/runs", json={"prompt": "echo three", "threadId": thread})
                assert third.status_code == 202, third.text
        finally:
            await server.close()
            await service.aclose(cancel=True)

    asyncio.run(main())


def test_the_queue_option_runs_a_threads_runs_one_after_the_other(tmp_path: Path) -> None:
    async def main() -> None:
        runs, log = memory_run_backend()
        sandbox = define_sandbox("queue", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)
        service = SandboxService(runs, log, store=MemoryInstanceStore(), thread_runs="queue")
        thread = f"t-{_tag()}"
        marks = tmp_path / "marks"
        try:
            # Each run notes when it starts and ends; run 1 is still sleeping when run 2 is started.
            first = await service.start_run(
                sandbox,
                command_harness(f"echo start-1 >> {marks}; sleep 1; echo end-1 >> {marks}"),
                "go",
                thread_id=thread,
                durable=False,
            )
            second = await service.start_run(
                sandbox,
                command_harness(f"echo start-2 >> {marks}; echo end-2 >> {marks}"),
                "go",
                thread_id=thread,
                durable=False,
            )
            assert (await runs.get(second)) is not None, "a queued run is recorded at once"
            done = [await asyncio.wait_for(service.wait_run(r), 30) for r in (first, second)]
            assert [r.status for r in done if r is not None] == ["completed", "completed"]
            assert marks.read_text().split() == ["start-1", "end-1", "start-2", "end-2"]
        finally:
            await service.aclose(cancel=True)

    asyncio.run(main())


def test_thread_runs_takes_only_busy_or_queue() -> None:
    runs, log = memory_run_backend()
    with pytest.raises(ValueError, match="'busy' or 'queue'"):
        SandboxService(runs, log, thread_runs="parallel")  # type: ignore[arg-type]


def test_events_are_stamped_when_emitted_so_the_run_ends_last_in_time(tmp_path: Path) -> None:
    # The agent's own RUN_FINISHED carries a stale stamp and is held back for the file events and
    # the diff: as emitted, every stamp is at least the one before, and file.changed has one.
    finished = encode_event(RunFinishedEvent(thread_id="t", run_id="r", timestamp=1)).decode()
    agent = (
        f"git init -q . && echo said && sleep 0.05 && echo new > made.txt && sleep 0.05 && printf '%s\\n' '{finished}'"
    )
    sandbox = define_sandbox("stamps", local_process_sandbox(base_dir=tmp_path / "sb"))

    async def main() -> list[Event]:
        stream: Any = run_agent(sandbox, command_harness(agent), "go", thread_id=f"t-{_tag()}")
        async with contextlib.aclosing(stream) as events:
            return [event async for event in events]

    events = asyncio.run(main())
    kinds = [e.name if isinstance(e, CustomEvent) else e.type for e in events]
    assert kinds[-1] == "RUN_FINISHED" and "file.changed" in kinds and "sandbox.file" in kinds, kinds
    stamps = [e.timestamp for e in events]
    assert all(isinstance(s, int) for s in stamps), list(zip(kinds, stamps, strict=True))
    assert stamps == sorted(stamps), list(zip(kinds, stamps, strict=True))
    assert stamps[-1] >= max(s for s in stamps if s is not None) > 1


def test_the_end_of_a_run_costs_its_reads_not_a_fixed_wait(tmp_path: Path) -> None:
    # From the agent's last output to RUN_FINISHED: the exit, one listing-and-diff exec. A settling
    # sleep (the watcher's was 150 ms) shows in every run, so even the quickest of five would miss.
    async def tail(n: int) -> float:
        sandbox = define_sandbox(
            "tail", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
        )
        said = finished = 0.0
        stream: Any = run_agent(sandbox, command_harness("echo hi"), "go", thread_id=f"tail-{n}-{_tag()}")
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if event.type == "TEXT_MESSAGE_CONTENT":
                    said = time.perf_counter()
                elif event.type == "RUN_FINISHED":
                    finished = time.perf_counter()
        assert said and finished
        return finished - said

    async def main() -> list[float]:
        return [await tail(n) for n in range(5)]

    tails = asyncio.run(main())
    assert min(tails) < 0.12, [round(t * 1e3, 1) for t in tails]


def test_a_native_event_arriving_after_the_last_listing_is_not_reported_twice(tmp_path: Path) -> None:
    async def main() -> list[FileEvent]:
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append).start()
            assert watcher.mode == "native"
            await handle.process.exec("echo late > late.txt")
            await watcher.finish()  # at once: inotify's batch for late.txt is still being debounced
            await asyncio.sleep(0.4)  # ... and arrives now, after the listing reported the file
            await watcher.stop()
            return seen
        finally:
            await handle.destroy()

    seen = asyncio.run(main())
    assert [(e.type, e.path) for e in seen] == [("create", "late.txt")]


def test_file_hooks_of_the_sandbox_and_of_the_run_are_called_in_order(tmp_path: Path) -> None:
    calls: list[tuple[str, str, str]] = []

    def sandbox_hook(name: str) -> Any:
        def hook(event: FileEvent) -> None:
            calls.append((name, event.type, event.path))

        return hook

    async def run_on_file(ctx: FileHookContext, event: FileEvent) -> None:
        await asyncio.sleep(0)  # an async hook is awaited
        calls.append((f"run:on_file:{ctx.run_id}", event.type, event.path))

    def failing(ctx: FileHookContext, event: FileEvent) -> None:
        raise RuntimeError("an app's hook failing must not fail the run")

    hooks = SandboxHooks(
        on_file=sandbox_hook("on_file"),
        on_file_create=sandbox_hook("on_file_create"),
        on_file_change=sandbox_hook("on_file_change"),
        on_file_delete=sandbox_hook("on_file_delete"),
    )
    sandbox = define_sandbox("hooks", local_process_sandbox(base_dir=tmp_path / "sb"), hooks=hooks)
    # Pauses longer than inotify's batching, so each step's events arrive while the run is live.
    steps = "echo 1 > kept.txt && echo 1 > gone.txt && sleep 0.4 && echo 2 >> kept.txt && rm gone.txt && sleep 0.4"
    agent = f"{steps} && echo done"
    run_id = f"hooks-{_tag()}"

    async def main() -> list[Event]:
        stream: Any = run_agent(
            sandbox,
            command_harness(agent),
            "go",
            thread_id=f"t-{_tag()}",
            run_id=run_id,
            file_hooks=[RunFileHooks(on_file=run_on_file, on_file_delete=failing)],
        )
        async with contextlib.aclosing(stream) as events:
            return [event async for event in events]

    events = asyncio.run(main())
    assert events[-1].type == "RUN_FINISHED", events[-1]
    # Every event reached its hooks before the run ended: on_file, the typed hook, then the run's.
    for kind, path in [("create", "kept.txt"), ("create", "gone.txt"), ("change", "kept.txt"), ("delete", "gone.txt")]:
        mine = [name for name, k, p in calls if (k, p) == (kind, path)]
        assert mine[:3] == ["on_file", f"on_file_{kind}", f"run:on_file:{run_id}"], (kind, path, calls)
    streamed = [e.value for e in events if isinstance(e, CustomEvent) and e.name == "sandbox.file"]
    assert len(streamed) == len({(k, p) for _, k, p in calls})


def test_a_delete_still_in_flight_at_the_end_is_reported_by_the_last_listing(tmp_path: Path) -> None:
    async def main() -> list[tuple[str, str]]:
        handle = await local_process_sandbox(base_dir=tmp_path).create()
        try:
            seen: list[FileEvent] = []
            watcher = await WorkspaceWatcher(handle, seen.append).start()
            await handle.process.exec("echo 1 > kept.txt && echo 1 > gone.txt")
            await asyncio.sleep(0.4)  # the creates arrive live
            await handle.process.exec("rm gone.txt")
            await watcher.stop()  # at once: the delete is still being batched by inotify
            return [(e.type, e.path) for e in seen]
        finally:
            await handle.destroy()

    seen = asyncio.run(main())
    assert seen[-1] == ("delete", "gone.txt") and seen.count(("delete", "gone.txt")) == 1, seen
    assert ("create", "kept.txt") in seen and ("create", "gone.txt") in seen, seen


def test_a_services_run_calls_its_run_scoped_file_hooks(tmp_path: Path) -> None:
    async def main() -> list[tuple[str, str, str]]:
        runs, log = memory_run_backend()
        service = SandboxService(runs, log, store=MemoryInstanceStore())
        sandbox = define_sandbox("svc-hooks", local_process_sandbox(base_dir=tmp_path / "sb"))
        seen: list[tuple[str, str, str]] = []

        def on_file_create(ctx: FileHookContext, event: FileEvent) -> None:
            seen.append((ctx.run_id, event.type, event.path))

        try:
            run_id = await service.start_run(
                sandbox,
                command_harness("echo x > made.txt && sleep 0.3"),
                "go",
                thread_id=f"t-{_tag()}",
                durable=False,
                file_hooks=[RunFileHooks(on_file_create=on_file_create)],
            )
            record = await asyncio.wait_for(service.wait_run(run_id), 30)
            assert record is not None and record.status == "completed"
            return [("this run" if r == run_id else r, k, p) for r, k, p in seen]
        finally:
            await service.aclose(cancel=True)

    assert asyncio.run(main()) == [("this run", "create", "made.txt")]
