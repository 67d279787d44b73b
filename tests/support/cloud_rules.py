"""The cloud providers' seed-rule tests share this: the fake-or-named-skip fixture, the bounded
run, the HTTP server a ports test starts in a sandbox, and the checks every provider's rules
repeat (the secret env reaching commands but no command string, a gone sandbox resuming as None,
an auth failure raising, network deny refused, the abort/cancel during create, the workspace mapping).

Each ``tests/integration/test_<provider>_rules.py`` says ``fake_required = require_fake("e2b")``
at module level (an autouse fixture: no fake, no SDK or no Docker is a named skip locally and a
failure in CI) and runs each test's body through ``run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from boxwright.abort import AbortController
from boxwright.errors import AbortError, UnsupportedCapabilityError
from boxwright.sandbox import CreateInput, NetworkPolicy, ProcessOptions, ResumeInput
from tests.support.cloud_providers import fake_problem
from tests.support.require import missing

# A case's body, bounded: a fake that stops answering fails the test instead of hanging the run.
BODY_TIMEOUT = 150.0


def require_fake(name: str) -> Any:
    """An autouse fixture for a module: its tests need the fake of ``name``."""

    @pytest.fixture(autouse=True)
    def _fake_available() -> None:
        problem = fake_problem(name)
        if problem is not None:
            missing(problem)

    return _fake_available


def run(body: Callable[[], Awaitable[None]], timeout: float = BODY_TIMEOUT) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout))


async def serve_http(handle: Any, text: str, port: int = 8080) -> None:
    """Serve ``text`` at ``/index.html`` on ``port`` inside the sandbox; return once it accepts connections."""
    await handle.fs.write(f"/workspace/www{port}/index.html", text)
    await handle.process.spawn(f"cd www{port} && exec python3 -m http.server {port} --bind 0.0.0.0")
    probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'"
    for _ in range(100):
        if (await handle.process.exec(probe)).exit_code == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server in the sandbox did not start on port {port}")


async def abort_and_cancel_create(
    fake: Any, provider: Any, *, after: float = 0.3, env: dict[str, str] | None = None
) -> None:
    """Abort one create and cancel another, each ``after`` seconds in, while the fake holds its create answer.

    Both raise (``AbortError``, ``CancelledError``) only after their clean-up; the caller then
    checks the fake for what was left.
    """
    fake.create_delay = 1.5
    try:
        controller = AbortController()
        asyncio.get_running_loop().call_later(after, controller.abort, "user cancelled")
        with pytest.raises(AbortError):
            await provider.create(CreateInput(env=env, signal=controller.signal))
        task = asyncio.ensure_future(provider.create())
        await asyncio.sleep(after)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        fake.create_delay = 0.0


async def refuses_network_deny(provider: Any, made: Callable[[], set[str]]) -> None:
    """A provider with no egress policy refuses deny (with or without a host list), never drops it,
    and makes nothing for a refused create (``made`` lists the fake's sandboxes)."""
    before = made()
    for policy in (NetworkPolicy(mode="deny"), NetworkPolicy(mode="deny", allow_hosts=("api.anthropic.com",))):
        with pytest.raises(UnsupportedCapabilityError) as caught:
            await provider.create(CreateInput(network=policy))
        assert caught.value.capability == "network_policy"
    assert made() == before, "a refused create still made a sandbox"


async def maps_workspace(provider: Any, root: str) -> None:
    """``/workspace`` is ``root`` in a new sandbox: its cwd, its files, its listings' paths."""
    handle = await provider.create()
    try:
        assert handle.workspace_root == root
        assert (await handle.process.exec("pwd")).stdout == root + "\n"
        await handle.fs.write("/workspace/sub/f.txt", "mapped")
        assert (await handle.process.exec(f"cat {root}/sub/f.txt")).stdout == "mapped"
        listed = await handle.fs.list("/workspace/sub")
        assert [(e.name, e.path) for e in listed] == [("f.txt", "/workspace/sub/f.txt")]
    finally:
        await handle.destroy()


async def sees_secret_env(handle: Any, secret: str) -> None:
    """A command sees the create's ``BW_SECRET`` (``secret``), the handle's ``BW_SET`` and its own ``BW_CMD``."""
    count = await handle.process.exec('printf %s "$BW_SECRET" | wc -c')
    assert count.stdout.strip() == str(len(secret)), count
    handle.env.set({"BW_SET": secret + "-set"})
    both = await handle.process.exec(
        'test -n "$BW_SET" && test -n "$BW_CMD" && echo ok', ProcessOptions(env={"BW_CMD": secret + "-cmd"})
    )
    assert both.stdout == "ok\n", both


def assert_no_secret_in_commands(fake: Any, secret: str) -> None:
    """The fake ran commands, and ``secret`` is in none of their command lines."""
    commands = fake.commands()
    assert commands, "the fake received no commands"
    assert [c for c in commands if secret in c] == [], "a secret reached a command string"


async def resume_with_token(provider: Any, fake: Any, sandbox_id: str, token: str) -> BaseException:
    """What a resume raises while the fake's ``token`` is another (a rotated key): an auth failure is
    never "gone" (None). The caller checks it is the vendor's auth error."""
    kept = fake.token
    fake.token = token
    try:
        with pytest.raises(Exception) as caught:
            await provider.resume(ResumeInput(id=sandbox_id))
    finally:
        fake.token = kept
    return caught.value


async def gone_resumes_as_none(provider: Any, handle: Any) -> None:
    """Destroy ``handle``: it and a never-made sandbox resume as None, and destroying it again succeeds."""
    await handle.destroy()
    assert await provider.resume(ResumeInput(id=handle.id)) is None
    assert await provider.resume(ResumeInput(id="bw-never-made-1")) is None
    await handle.destroy()  # already gone is success
