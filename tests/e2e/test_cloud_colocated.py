"""Co-located mode on the E2B, Daytona and Railway fakes: a durable run of the REAL `claude` in the runner image.

Each fake runs its sandbox as a container of the runner image (``FakeCloud`` with that image), with
``host.docker.internal`` on the host gateway: the agent reaches the fake model and the host's tool-exec callback
there (a ``ToolExecRegistry`` on the Docker bridge, its public origin the name the box resolves). The host
reaches the runner in the box only through the provider's port API, as on the vendor: E2B's
``https://8080-<id>.<domain>`` with its traffic-access token (public traffic off), Daytona's signed preview URL,
Railway's published domain. ``VendorEdge`` stands in for public DNS and the vendors' TLS edge (the host's
``HTTPS_PROXY``, its CA in ``SSL_CERT_FILE``); the fake's own proxy then streams to the box's port.

The run is a ``SandboxService`` run (durable, co-located) with one host Python tool call: it completes, the
durable log holds every event once, no secret is in it, and neither the fake nor Docker keeps anything after.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from boxwright.coordinator.callbacks import ToolExecRegistry
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import (
    Event,
    TextMessageContentEvent,
    TextMessageStartEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    encode_event,
)
from boxwright.harnesses.claude_code import claude_code
from boxwright.middleware import SandboxService
from boxwright.stores.memory import MemoryInstanceStore, MemoryLockStore, memory_run_backend
from boxwright.tool_bridge import tool
from boxwright.tool_bridge.asgi import serve_asgi
from boxwright.workspace import define_workspace
from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
from tests.support.docker import (
    RUNNER_IMAGE,
    RUNNER_SECRET,
    bridge_address,
    model_env_in_container,
    repo_setup,
    require_image,
)
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
ANSWER = "Your todos: write the spec, ship it."
SCRIPT: list[Step] = [ToolCall("mcp__boxwright__get_todos", {"status": "open"}), Text(ANSWER)]


@dataclass
class Cloud:
    """One vendor fake on the runner image, the provider pointed at it, and the edge the host reaches it through."""

    name: str
    fake: Any
    provider: Any
    edge: Any

    def live_sandboxes(self) -> list[str]:
        if self.name == "railway":  # a destroyed Railway sandbox stays listed as a DESTROYED tombstone
            return [key for key, box in self.fake.sandboxes.items() if box.status != "DESTROYED"]
        return list(self.fake.boxes)


def _fake(name: str) -> tuple[Any, str]:
    """The vendor's fake on the runner image (no warm pool: every machine is this test's) and its preview domain."""
    if name == "e2b":
        from tests.support.fake_cloud import e2b

        return e2b.FakeE2B(RUNNER_IMAGE), e2b.DOMAIN
    if name == "daytona":
        from tests.support.fake_cloud import daytona

        return daytona.FakeDaytona(RUNNER_IMAGE), daytona.PROXY_DOMAIN
    from tests.support.fake_cloud import railway

    return railway.FakeRailway(RUNNER_IMAGE), railway.DOMAIN


def _provider(name: str, fake: Any) -> Any:
    if name == "e2b":
        from boxwright.providers.e2b import e2b_sandbox

        # Public traffic off: the runner's port needs E2B's traffic-access token, which the channel carries.
        return e2b_sandbox(
            api_key=fake.api_key,
            api_url=fake.api_url,
            sandbox_url=fake.envd_url,
            http_version="1.1",
            lifetime=600,
            allow_public_traffic=False,
            metadata={"boxwright.test": "1"},
        )
    if name == "daytona":
        from boxwright.providers.daytona import daytona_sandbox

        # Not public: the channel is a signed preview URL (its token in the host name).
        return daytona_sandbox(api_key=fake.api_key, api_url=fake.api_url, labels={"boxwright.test": "1"})
    from boxwright.providers.railway import railway_sandbox

    # Railway publishes a port as a domain at create only, and only on a PRIVATE network. Its commands run as
    # root: the runner image's own /workspace belongs to its agent user, and git refuses a repository another
    # user owns (dubious ownership), so the workspace is one root makes at boot.
    return railway_sandbox(
        workdir="/root/workspace",
        token=fake.api_token,
        environment_id=fake.environment,
        endpoint=fake.endpoint,
        exec_url=fake.exec_url,
        network_isolation="PRIVATE",
        ports=[8080],
    )


@pytest.fixture(params=["e2b", "daytona", "railway"])
def cloud(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    name = str(request.param)
    require_image(RUNNER_IMAGE)
    sdk = {"e2b": "e2b", "daytona": "daytona", "railway": "websockets"}[name]
    if importlib_missing(sdk):
        missing(f"the {name} provider's client library ({sdk}) is not installed: pip install -e '.[dev]'")
    from tests.support.fake_cloud.backend import VendorEdge

    fake, domain = _fake(name)
    fake.cloud.warm_size = 0
    fake.start()
    edge = VendorEdge({domain: fake.server.port}, str(tmp_path)).start()
    containers: list[str] = []
    try:
        # The host's HTTPS goes through the edge (the vendors' public names); the fakes' own APIs are plain
        # http on 127.0.0.1 and never touch it.
        monkeypatch.setenv("HTTPS_PROXY", edge.url)
        monkeypatch.setenv("SSL_CERT_FILE", edge.ca_file)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield Cloud(name, fake, _provider(name, fake), edge)
        containers = list(fake.cloud._all)
    finally:
        fake.close()
        edge.close()
    left = [cid for cid in containers if _exists(fake, cid)]
    assert left == [], f"the {name} fake left containers behind: {left}"


def importlib_missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _exists(fake: Any, container: str) -> bool:
    try:
        fake.cloud.api.inspect_container(container)
    except fake.cloud.errors.NotFound:
        return False
    return True


def test_a_durable_colocated_claude_run_completes_on_the_cloud_fake_with_a_host_tool_call(cloud: Cloud) -> None:
    calls: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the todos of the app (state on this host)."""
        calls.append(status)
        return f"- write the spec [{status}]\n- ship it [{status}]"

    model = FakeModelServer({"cloud": SCRIPT}, host=bridge_address())
    model.start()
    sandbox = define_sandbox(
        f"{cloud.name}-colocated",
        cloud.provider,
        define_workspace(setup=repo_setup()),
        # No after-setup snapshot: nothing here restores one, and it costs a stop, commit and start per run.
        lifecycle=Lifecycle(destroy_on_complete=True, snapshot="none"),
    )
    harness = claude_code("claude-sonnet-4-5", env={"CLAUDE_CODE_MAX_RETRIES": "0"})
    run_id, thread_id = f"r-{cloud.name}-{secrets.token_hex(4)}", f"t-{cloud.name}"
    # The agent's env (from the host's, the harness's prefixes only): the model on the host gateway.
    env = model_env_in_container(model.base_url)

    async def main() -> tuple[Any, list[Event]]:
        origin: list[str] = []
        # The host's tool-exec callback, on the Docker bridge: the box reaches it at host.docker.internal.
        registry = ToolExecRegistry(lambda _provider: origin[0])
        server = await serve_asgi(registry.app, host=bridge_address())
        origin.append(f"http://host.docker.internal:{server.port}")
        runs, log = memory_run_backend()
        try:
            with pytest.MonkeyPatch.context() as patch:
                for key, value in env.items():
                    patch.setenv(key, value)
                async with SandboxService(
                    runs,
                    log,
                    locks=MemoryLockStore(),
                    store=MemoryInstanceStore(),
                    runner_secret=RUNNER_SECRET,
                    tool_exec=registry,
                ) as service:
                    await service.start_run(
                        sandbox,
                        harness,
                        "[[script:cloud]] read my todos",
                        thread_id=thread_id,
                        run_id=run_id,
                        tools=[get_todos],
                        durable=True,
                        mode="colocated",
                    )
                    record = await service.wait_run(run_id)
            events = [event async for _, event in log.read(run_id, live=False)]
            return record, events
        finally:
            await server.close()

    try:
        record, events = asyncio.run(asyncio.wait_for(main(), 360))
        requests = model.model_requests()
    finally:
        model.stop()
    types = [e.type for e in events]
    failed = [e for e in events if e.type == "RUN_ERROR"]
    assert record is not None and record.status == "completed", (record, failed, types)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    assert types.count("RUN_STARTED") == 1 and types.count("RUN_FINISHED") == 1, types
    # Every event once: one start and one result per tool call, one start per message.
    starts = [e.tool_call_id for e in events if isinstance(e, ToolCallStartEvent)]
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert len(starts) == len(set(starts)) == 1 and [r.tool_call_id for r in results] == starts, types
    messages = [e.message_id for e in events if isinstance(e, TextMessageStartEvent)]
    assert len(messages) == len(set(messages)), types
    assert calls == ["open"], "the host tool ran once, on the host, over the tool-exec callback"
    assert "write the spec" in str(results[0].content) and results[0].state != "output-error", results
    assert "write the spec" in str(requests[-1].body["messages"]), "the tool's answer reached the model"
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert ANSWER in text, text
    # The host reached the runner through the vendor's preview host (over TLS, the edge's tunnels), never directly.
    assert any(host.startswith("8080-") or host.endswith(".up.railway.fake") for host in cloud.edge.tunnels), (
        cloud.edge.tunnels
    )
    wire = b"".join(encode_event(e) for e in events)
    for value in (b"Bearer", b"sk-test", RUNNER_SECRET.encode()):
        assert value not in wire, value
    assert cloud.live_sandboxes() == [], "destroy_on_complete left the sandbox in the fake"
