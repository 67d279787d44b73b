"""Where the runner's tool-exec calls go: to whichever host drives the run now, held while none does.

The run outlives the host that posted it (a host may be SIGKILLed mid-run), so the URL and
bearer token its remote tool stubs call are not fixed at ``/run``: a successor host re-points
them (``POST /runs/{id}/attach``, ``ToolExecTarget.repoint``). ``HeldToolExecTransport`` is the
httpx transport under the run's ``HttpRemoteToolExecutor`` (whose request and reply shapes stay
the one copy in ``tool_bridge.remote``); each request goes to the current target.

What happens to a call made while no host answers (the choice, and why):

- The connection is refused or times out: nothing reached any host, so sending it again cannot
  run the tool twice. The call is HELD, not failed: it is retried as soon as a successor
  re-points the target (or every ``RETRY_EVERY`` seconds, for a host that was only slow), for at
  most ``hold`` seconds. Failing it at once would hand the agent an error caused by a host
  failure that a takeover heals within a lease and a quiet window, and the agent would act on
  it (give up, try another way): the run's outcome would depend on when the host died.
- Past the bound it fails with an error the agent sees, naming the wait and the cause, so a run
  nobody takes over ends its tool call instead of hanging.
- The request was sent and the reply was lost (the host died during the call): the tool may
  have run, so it is NOT sent again (twice is worse for a tool with effects than an error the
  agent can react to); the call fails saying so.

Keep-alive is off: each call dials afresh, so a connect error unambiguously means "not sent".
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

DEFAULT_HOLD = 120.0
RETRY_EVERY = 1.0
_CONNECT = 5.0


class ToolExecTarget:
    """The tool-exec URL and run token of the host driving the run now; ``repoint`` moves both at once."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.generation = 0
        self._moved = asyncio.Event()

    def __repr__(self) -> str:  # never the token
        return f"ToolExecTarget(url={self.url!r}, generation={self.generation})"

    def repoint(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.generation += 1
        # Wake every held call, then arm a fresh event for the next move.
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def moved(self, timeout: float) -> None:
        """Return once re-pointed, or after ``timeout`` seconds, whichever is first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._moved.wait(), max(timeout, 0.0))


class HeldToolExecTransport(httpx.AsyncBaseTransport):
    """Sends each request to ``target``'s URL with its token; holds a call no host answers (module doc)."""

    def __init__(self, target: ToolExecTarget, *, hold: float = DEFAULT_HOLD) -> None:
        self.target = target
        self.hold = hold
        self._inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        deadline = time.monotonic() + self.hold
        while True:
            target = self.target
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "authorization")}
            headers["Authorization"] = f"Bearer {target.token}"
            outgoing = httpx.Request(
                request.method, target.url, headers=headers, content=body, extensions=request.extensions
            )
            try:
                return await self._inner.handle_async_request(outgoing)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise httpx.ConnectError(
                        f"no host answered tool-exec for {self.hold:g} s (the host driving this run is gone and "
                        f"no successor attached): {exc}"[:180],
                        request=request,
                    ) from None
                await target.moved(min(RETRY_EVERY, left))
            except httpx.TransportError as exc:
                raise httpx.ReadError(
                    "the host driving this run went away during the call; it may have run, so it is not sent "
                    f"again: {type(exc).__name__}",
                    request=request,
                ) from None

    async def aclose(self) -> None:
        await self._inner.aclose()


def held_tool_exec_client(target: ToolExecTarget, *, hold: float = DEFAULT_HOLD) -> httpx.AsyncClient:
    """The httpx client for the run's ``HttpRemoteToolExecutor``: no read timeout (a tool may run for minutes)."""
    return httpx.AsyncClient(
        transport=HeldToolExecTransport(target, hold=hold), timeout=httpx.Timeout(_CONNECT, read=None)
    )
