"""The run viewer on the coordinator: the page at ``/`` is static and unguarded, its API calls stay guarded;
``boxwright serve`` with no config (the viewer's demo) allows anonymous clients on loopback only."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from boxwright.coordinator.config import CoordinatorConfig
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from tests.support.coordinator import CLIENT_TOKEN, client_headers, coordinator_server, trigger

ROOT = Path(__file__).resolve().parents[2]


def test_a_guarded_coordinator_serves_the_page_to_anyone_and_its_runs_to_its_clients_only(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        sandboxes={"box": define_sandbox("viewer-test", local_process_sandbox(base_dir=str(tmp_path)))},
        harnesses={"echo": CommandHarness(command="echo hi"), "other": CommandHarness(command="true")},
        store_url=f"sqlite:///{tmp_path / 'c.db'}",
        client_token=CLIENT_TOKEN,
        inactivity_timeout=0,
        sweep_interval=0,
    )

    async def main() -> None:
        async with coordinator_server(config) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/")
            assert page.status_code == 200 and "<html" in page.text
            assert (await client.get("/viewer/viewer.js")).status_code == 200
            offered = (await client.get("/viewer/config.json")).json()
            assert [h["name"] for h in offered["harnesses"]] == ["echo", "other"]
            assert [p["name"] for p in offered["providers"]] == ["box"]
            assert offered["defaultHarness"] == "echo"
            refused = await client.post("/runs", json=trigger("t-viewer", "hello", harness="echo", sandbox="box"))
            assert refused.status_code == 401
            started = await client.post(
                "/runs", json=trigger("t-viewer", "hello", harness="echo", sandbox="box"), headers=client_headers()
            )
            assert started.status_code == 202, started.text

    asyncio.run(main())


def test_serve_with_no_config_refuses_anonymous_clients_off_loopback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("BOXWRIGHT_CLIENT_TOKEN", "BOXWRIGHT_STORE")}
    env["BOXWRIGHT_DB"] = str(tmp_path / "demo.db")
    argv = [sys.executable, "-m", "boxwright", "serve", "--host", "0.0.0.0", "--port", "0"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "anonymous clients on loopback only" in done.stderr, done.stderr
