"""Where the coordinator tells sandboxes to call back (spec R45, S3, §8 A56), from requests a client shapes.

A loopback-bound coordinator takes the port from its bound socket, never from ``Host`` or
``X-Forwarded-*``: ``Host: localhost:6379`` must not point a container at Redis. A Docker sandbox gets
``host.docker.internal:<bound port>``, a local one the loopback. With ``trust_request_host`` only an
allowlisted host is taken, and a forwarded one never; ``public_origin`` beats them all.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from boxwright.coordinator import Coordinator, CoordinatorConfig, StoreSet, create_coordinator_app
from boxwright.errors import ToolBridgeConfigError
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, coordinator_server

SHAPED = {
    "Host": "localhost:6379",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Port": "6379",
    "X-Forwarded-Proto": "https",
    "Forwarded": "host=evil.example;proto=https",
}


def _config(tmp_path: Path, name: str, **settings: object) -> CoordinatorConfig:
    db = open_database(tmp_path / f"{name}.db")
    runs, events = sqlite_run_backend(db)
    stores = StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close)
    return CoordinatorConfig(stores=stores, client_token=CLIENT_TOKEN, **settings)  # type: ignore[arg-type]


def test_a_loopback_coordinator_takes_the_port_of_its_socket_never_of_a_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with coordinator_server(_config(tmp_path, "loopback")) as (url, coordinator):
            port = urlsplit(url).port
            async with httpx.AsyncClient(timeout=10) as http:
                assert (await http.get(f"{url}/healthz", headers=SHAPED)).status_code == 200
            assert coordinator.origin("docker") == f"http://host.docker.internal:{port}"
            assert coordinator.origin("local") == f"http://127.0.0.1:{port}"
            assert coordinator.bridge.url_for("r-1") == f"http://127.0.0.1:{port}/_bridge/runs/r-1/mcp"

    asyncio.run(main())


def test_a_trusted_request_host_counts_only_when_allowlisted_and_a_public_origin_beats_it(tmp_path: Path) -> None:
    async def origin_after(config: CoordinatorConfig, headers: dict[str, str]) -> str:
        app = create_coordinator_app(config)
        coordinator: Coordinator = app.state.coordinator
        # What an un-proxied server bound to a public address reports: no loopback rule applies.
        transport = httpx.ASGITransport(app=app, client=("203.0.113.9", 5000))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://203.0.113.7:8000") as http:
                assert (await http.get("/healthz", headers=headers)).status_code == 200
        # Asked after the lifespan: a raise inside it would come out wrapped in its task group's ExceptionGroup.
        return coordinator.origin("local")

    trusted = {"trust_request_host": True, "allowed_hosts": ["boxwright.example", "fwd.example"]}
    # Allowlisted, but only as a forwarded host: a client sets those headers as it likes.
    forwarded = {"Host": "203.0.113.7:8000", "X-Forwarded-Host": "fwd.example", "Forwarded": "host=fwd.example"}

    async def main() -> None:
        allowed = await origin_after(_config(tmp_path, "a", **trusted), {"Host": "boxwright.example"})
        assert allowed == "https://boxwright.example"
        for n, headers in enumerate(({"Host": "evil.example"}, forwarded)):
            with pytest.raises(ToolBridgeConfigError, match="BOXWRIGHT_PUBLIC_ORIGIN"):
                await origin_after(_config(tmp_path, f"r{n}", **trusted), headers)
        configured = _config(tmp_path, "p", public_origin="https://runs.example/", **trusted)
        assert await origin_after(configured, {"Host": "boxwright.example"}) == "https://runs.example"

    asyncio.run(main())
