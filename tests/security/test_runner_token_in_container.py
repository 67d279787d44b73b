"""The agent inside the runner's container cannot get the runner's token (issue 12, security).

In the runner image, as its ``agent`` user, through the real co-located start path
(``colocated_drive`` -> ``spawn_runner``): the real ``claude`` the runner spawned runs
tests/support/runner_token_attack.py from its Bash tool, against the fake model. The attack reads
the runner's ``/proc/<pid>/environ``, ``cmdline``, ``maps``, ``mem`` (at the addresses maps
would give), ``fd/``, attaches with ``ptrace`` and ``process_vm_readv`` (ctypes; no gdb in the
image), dumps its own shell's env and inherited fds and those of its ancestors up to the runner,
and reopens the exec stdin that carried the token. CI runs as root on the host, where root reads
any ``/proc``: so the attack runs in the container, never on the host. Each attempt the kernel
refuses is asserted by its errno (EACCES/EPERM), not skipped; then ``docker inspect`` of the
container and a committed snapshot's config and layers are searched for the token. Control: the
runner served the run under the right token, and the wrong ones the agent tried got 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from boxwright.colocated import colocated_drive, runner_token
from boxwright.events import Event, ToolCallStartEvent
from boxwright.harnesses.base import Message
from boxwright.scrub import EventScrubber
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.docker import (
    RUNNER_IMAGE,
    TEST_LABEL,
    bridge_address,
    claude_in_image,
    image_problem,
    no_leaked_containers,
    remove_images,
)
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]
SECRET = "the-replicas-shared-runner-secret-p6"
ATTACK = Path(__file__).parents[1] / "support" / "runner_token_attack.py"
IN_BOX = "/tmp/boxwright-attack.py"
REPORT = "/tmp/boxwright-attack.json"


def _docker_json(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def _committed(api: Any, container: str, image: str) -> str:
    """The committed snapshot's config and history, and every file of its own layer (the container's changes).

    Its other layers are the runner image's, built before any token existed: reading them (2 GB with
    `docker save`) would take minutes and show nothing a run could have put there.
    """
    parts = [_docker_json("image", "inspect", image), _docker_json("history", "--no-trunc", image)]
    kinds = {c["Path"]: c["Kind"] for c in api.diff(container) or []}  # 0 changed, 1 added, 2 deleted
    # Each added tree once, from its top, and each changed file (a changed path no other is under); never a
    # changed directory whole (/usr, for the docker-init Docker adds, is the image's own).
    read = [
        path
        for path, kind in kinds.items()
        if (kind == 1 and kinds.get(path.rsplit("/", 1)[0] or "/") != 1)
        or (kind == 0 and not any(other.startswith(path + "/") for other in kinds))
    ]
    assert any(path.startswith("/tmp/") for path in read), kinds  # the runner's log and NDJSON, the report
    for path in sorted(read):
        stream, _ = api.get_archive(container, path)
        parts.append(b"".join(stream).decode("latin-1"))
    return "".join(parts)


def test_an_agent_in_the_container_cannot_read_or_use_the_runner_token() -> None:
    if (problem := image_problem(RUNNER_IMAGE)) is not None:
        missing(problem)
    from boxwright.providers.docker import docker_sandbox

    model = FakeModelServer(
        {
            "attack": [
                ToolCall("Bash", {"command": f"python3 {IN_BOX} {REPORT}", "description": "look around"}),
                Text("I looked around."),
            ]
        },
        host=bridge_address(),
    )
    model.start()
    port = model.base_url.rsplit(":", 1)[1]
    harness = claude_in_image()

    async def main() -> tuple[str, list[Event], str, str, str]:
        handle = await docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"}).create()
        snapshot: str | None = None
        try:
            await handle.fs.write(IN_BOX, ATTACK.read_text())
            stream = colocated_drive(
                handle,
                harness,
                run_id="r-token-attack",
                thread_id="t-token-attack",
                messages=[Message(role="user", content="[[script:attack]] look around")],
                tools=[],
                host_env={"ANTHROPIC_BASE_URL": f"http://host.docker.internal:{port}", "ANTHROPIC_API_KEY": "sk-t"},
                scrub=EventScrubber(),
                signal=None,
                runner_secret=SECRET,
            )
            async with contextlib.aclosing(stream):
                events = [event async for event in stream]
            report = await handle.fs.read(REPORT)
            inspected = await asyncio.to_thread(_docker_json, "inspect", handle.id)
            execs = json.loads(inspected)[0].get("ExecIDs") or []
            for exec_id in execs:  # the execs still known to the engine (the runner's among them, if alive)
                inspected += json.dumps(await handle.api.call(handle.api.api.exec_inspect, exec_id))
            ref = await handle.snapshot("token-attack")
            snapshot = ref.id
            image = await asyncio.to_thread(_committed, handle.api.api, handle.id, ref.id)
            return runner_token(SECRET, handle.id), events, report, inspected, image
        finally:
            await handle.destroy()
            if snapshot is not None:
                await asyncio.to_thread(remove_images, [snapshot])

    try:
        token, events, text, inspected, image = asyncio.run(asyncio.wait_for(main(), 300))
    finally:
        model.stop()

    # Control: the runner served the run under the right token (the agent ran, the run finished).
    types = [e.type for e in events]
    assert types[-1] == "RUN_FINISHED", types
    assert [e.tool_call_name for e in events if isinstance(e, ToolCallStartEvent)] == ["Bash"], types
    report: dict[str, Any] = json.loads(text)
    assert token not in text, "the agent found the runner's token"
    assert len(token) == 64 and token not in report["candidates"]

    runner = report["runner_probes"]
    assert "boxwright.runner" in runner["cmdline"] and token not in runner["cmdline"]
    # Non-dumpable: its /proc entries (environ, fd, maps...) belong to root, and every read that needs ptrace
    # access is refused.
    assert runner["proc_owner_uid"] == 0, runner["proc_owner_uid"]
    for probe in ("environ", "maps", "mem", "fd", "task_environ"):
        assert runner[probe] == {"error": "EACCES"}, (probe, runner[probe])
    assert runner["ptrace"] == {"attach": "EPERM", "seize": "EPERM", "process_vm_readv": "EPERM"}, runner["ptrace"]

    # The agent's side is dumpable (the kernel reset the flag at exec), and carries nothing of the token.
    agent = report["agent"]
    assert any("claude" in a["cmdline"] for a in agent.values()), [a["cmdline"] for a in agent.values()]
    for pid, seen in agent.items():
        assert seen["proc_owner_uid"] == 1000, (pid, seen["cmdline"], "the agent was left non-dumpable")
        assert "data" in seen["environ"] and "links" in seen["fd"], (pid, seen)
        assert "BOXWRIGHT_RUNNER_TOKEN" not in seen["environ"]["data"], (pid, seen["cmdline"])
    claude_env = next(a["environ"]["data"] for a in agent.values() if "claude" in a["cmdline"])
    assert "ANTHROPIC_BASE_URL=" in claude_env, "the agent's env was read (so the token's absence means something)"
    assert "BOXWRIGHT_RUNNER_TOKEN" not in report["own_env"]

    # The exec's stdin that carried the token: drained (EOF or nothing to read), and no agent fd is that pipe.
    stdin = report["exec_stdin"]
    assert stdin.get("read", "") == "" and stdin.get("read_error") in (None, "EAGAIN"), stdin
    assert "BOXWRIGHT_RUNNER_TOKEN" not in stdin["wrapper_environ"].get("data", ""), stdin["wrapper_environ"]
    if stdin.get("link", "").startswith("pipe:"):
        inherited = {link for a in agent.values() for link in a["fd"]["links"].values()}
        assert stdin["link"] not in inherited, "the agent inherited the pipe that carried the token"

    # Wrong tokens (none, a guess, every 64-hex string it saw) are refused; the runner kept serving.
    assert report["tries"] and all(code == 401 for code in report["tries"].values()), report["tries"]

    assert token not in inspected, "docker inspect of the container (or one of its execs) shows the token"
    assert "ExecIDs" in inspected
    assert token not in image, "the committed snapshot's config or its layer holds the token"
    assert "boxwright-runner.log" in image and REPORT.rsplit("/", 1)[1] in image, "the layer's files were read"
