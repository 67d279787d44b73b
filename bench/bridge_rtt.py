"""Round trip of one MCP ``tools/call`` over HTTP on loopback: our bridge against the official SDK's server.

Both servers run in this process as uvicorn tasks of one event loop, and one keep-alive httpx
client posts JSON-RPC to each, alternating call by call so drift hits both equally. The tool is
the same trivial function on both sides (async, and a sync variant that both servers run in a
worker thread). The SDK server (FastMCP, ``MCPServer`` in mcp 2.x) runs in its fairest mode,
``stateless_http=True, json_response=True``, and once more in its default mode (a session
initialised first, SSE answers) for reference.

A third server, a bare ASGI app answering every POST with one fixed reply, gives the floor: what
uvicorn (h11) and the httpx client cost per round trip before any MCP work, so each server's own
work is its median minus the floor.

Run: .venv/bin/python bench/bridge_rtt.py [--calls 500] [--warmup 100]
Goal (issue "Tool bridge"): median ours <= 0.5 x theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from boxwright.tool_bridge import serve_asgi, start_host_tool_bridge, tool

ACCEPT = "application/json, text/event-stream"


async def echo_async(text: str) -> str:
    return text


def echo_sync(text: str) -> str:
    return text


def sdk_server() -> Any:
    try:
        from mcp.server.mcpserver import MCPServer as FastMCP  # mcp >= 2
    except ImportError:
        from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef,attr-defined,unused-ignore]  # mcp 1.x
    server = FastMCP("baseline", log_level="WARNING")
    server.tool(name="echo_async")(echo_async)
    server.tool(name="echo_sync")(echo_sync)
    return server


def sdk_app(server: Any, *, stateless: bool, json_response: bool) -> Any:
    try:
        return server.streamable_http_app(stateless_http=stateless, json_response=json_response)
    except TypeError:  # mcp 1.x takes these as settings
        server.settings.stateless_http = stateless
        server.settings.json_response = json_response
        return server.streamable_http_app()


FIXED_REPLY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}'


async def fixed_reply_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(FIXED_REPLY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": FIXED_REPLY})


def call_body(i: int, name: str) -> bytes:
    message = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": {"text": "hi"}}}
    return json.dumps(message).encode()


def result_of(response: httpx.Response) -> Any:
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        reply = json.loads(data[-1])
    else:
        reply = response.json()
    assert reply["result"]["content"][0]["text"] == "hi", reply
    return reply


Caller = Callable[[int], Awaitable[None]]


def caller(client: httpx.AsyncClient, url: str, name: str, headers: dict[str, str]) -> Caller:
    async def call(i: int) -> None:
        result_of(await client.post(url, content=call_body(i, name), headers=headers))

    return call


async def sdk_session_headers(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    """Initialise a session on the SDK's default (stateful) transport; returns headers to reuse it."""
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    response = await client.post(url, content=json.dumps(init).encode(), headers=base)
    response.raise_for_status()
    headers = {**base, "Mcp-Session-Id": response.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    (await client.post(url, content=json.dumps(note).encode(), headers=headers)).raise_for_status()
    return headers


async def measure(calls: dict[str, Caller], n: int, warmup: int) -> dict[str, list[float]]:
    for i in range(warmup):
        for call in calls.values():
            await call(i)
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for i in range(n):
        for label, call in calls.items():
            started = time.perf_counter_ns()
            await call(i)
            samples[label].append((time.perf_counter_ns() - started) / 1000)
    return samples


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.95) - 1]


async def main(n: int, warmup: int) -> None:
    ours_tools = [tool(echo_async), tool(echo_sync)]
    baseline = sdk_server()
    fair = sdk_server()
    async with (
        await start_host_tool_bridge() as bridge,
        await serve_asgi(sdk_app(fair, stateless=True, json_response=True), lifespan="on") as fair_server,
        await serve_asgi(sdk_app(baseline, stateless=False, json_response=False), lifespan="on") as default_server,
        await serve_asgi(fixed_reply_app) as floor_server,
        httpx.AsyncClient(timeout=30) as client,
    ):
        registration = bridge.register("bench", ours_tools)
        ours_headers = {**registration.headers, "Accept": ACCEPT, "Content-Type": "application/json"}
        fair_headers = {"Accept": ACCEPT, "Content-Type": "application/json", "Mcp-Protocol-Version": "2025-06-18"}
        default_headers = await sdk_session_headers(client, default_server.url + "/mcp")
        rows: list[tuple[str, str, float, float]] = []
        for variant in ("echo_async", "echo_sync"):
            calls = {
                "boxwright": caller(client, registration.url, variant, ours_headers),
                "sdk stateless+json": caller(client, fair_server.url + "/mcp", variant, fair_headers),
                "sdk default (session, SSE)": caller(client, default_server.url + "/mcp", variant, default_headers),
                "floor (fixed reply)": caller(client, floor_server.url + "/mcp", variant, fair_headers),
            }
            samples = await measure(calls, n, warmup)
            for label, values in samples.items():
                rows.append((variant, label, *summary(values)))

    print(f"tools/call round trip over HTTP on loopback, N={n} per server after {warmup} warm-up calls (µs)")
    print(f"{'tool':<11} {'server':<28} {'median':>9} {'p95':>9}")
    for variant, label, median, p95 in rows:
        print(f"{variant:<11} {label:<28} {median:>9.0f} {p95:>9.0f}")
    for variant in ("echo_async", "echo_sync"):
        by_label = {label: (median, p95) for v, label, median, p95 in rows if v == variant}
        ours = by_label["boxwright"]
        fair_row = by_label["sdk stateless+json"]
        default_row = by_label["sdk default (session, SSE)"]
        floor = by_label["floor (fixed reply)"][0]
        print(
            f"{variant}: ours/sdk-stateless+json median {ours[0] / fair_row[0]:.2f}, p95 {ours[1] / fair_row[1]:.2f}; "
            f"ours/sdk-default median {ours[0] / default_row[0]:.2f} (goal: <= 0.5); above the floor: "
            f"ours {ours[0] - floor:.0f} µs, sdk stateless+json {fair_row[0] - floor:.0f} µs, "
            f"sdk default {default_row[0] - floor:.0f} µs"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.warmup))
