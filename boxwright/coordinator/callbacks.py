"""The callbacks a sandbox makes to the coordinator, served on the coordinator's own origin.

Do-drives: the whole MCP bridge at ``/_bridge/runs/<id>/mcp`` (``MountedToolBridge``, the same
``ToolBridgeApp`` a standalone bridge serves). Co-located: ``{name, args}`` at
``/tool-exec/<id>`` (``ToolExecRegistry`` over ``tool_exec_app``). Each run's bearer token is
minted by ``boxwright.secrets.mint_token()`` before its URL exists, lives only in memory and is
dropped at settle (S1); a call without it is a 401 that runs nothing, a call after settle a 404.
The URLs come from the configured origin (``hosts.resolve_bridge_origin``), never from a request.
With a secret the replicas share (``runner_secret``), a do-drive's bridge token is derived from it
and the run's ids instead (``boxwright.secrets.run_bridge_token``), and with ``public_origin`` its
URL is the deployment's, not this replica's: after a takeover the agent's calls, still made with
the URL and token its first driver gave it, reach the successor, which registered the run under
that same token (a call arriving first waits for it: ``ToolBridgeApp.hold_unregistered``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from boxwright.abort import AbortSignal
from boxwright.secrets import mint_token
from boxwright.tool_bridge import BridgeRegistration, HostToolBridge
from boxwright.tool_bridge.asgi import ToolBridgeApp
from boxwright.tool_bridge.remote import ToolExecRun, tool_exec_app, tool_exec_path
from boxwright.tool_bridge.tools import EmitCustomEvent, Tool

BRIDGE_PREFIX: Final = "/_bridge"
TOOL_EXEC_PREFIX: Final = ""  # tool_exec_app serves /tool-exec/<id> itself
TOOL_EXEC_MAX_BODY: Final = 1024 * 1024  # S7


class MountedToolBridge(HostToolBridge):
    """A ``HostToolBridge`` whose listener is the coordinator's own server (no socket of its own).

    ``origin`` is read at each registration: it is settled once the server knows its bound port.
    """

    def __init__(self, origin: Callable[[], str]) -> None:
        self.app = ToolBridgeApp()
        self._origin = origin

    @property
    def host(self) -> str:
        raise AttributeError("a mounted bridge has no listener of its own: it is served by the coordinator")

    @property
    def port(self) -> int:
        raise AttributeError("a mounted bridge has no listener of its own: it is served by the coordinator")

    @property
    def base_url(self) -> str:
        return self._origin().rstrip("/") + BRIDGE_PREFIX

    def url_for(self, run_id: str) -> str:
        return self.base_url + ToolBridgeApp.path_for(run_id)

    def register(
        self, run_id: str, tools: Iterable[Tool], *, token: str | None = None, **core_opts: Any
    ) -> BridgeRegistration:
        # The URL is fixed before the token exists anywhere but here (S1).
        url = self.url_for(run_id)
        return self.app.register(run_id, tools, token=token or mint_token(), url=url, **core_opts)

    async def close(self) -> None:
        self.app.close_all()


@dataclass(eq=False)
class ToolExecGrant:
    """One run's tool-exec endpoint: where the runner posts, with which token; ``close()`` at settle."""

    url: str
    token: str
    _close: Callable[[], None]

    def close(self) -> None:
        self._close()

    def __enter__(self) -> ToolExecGrant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ToolExecRegistry:
    """The co-located runs' host tools, by run id, as the coordinator's ``/tool-exec/<id>`` serves them.

    ``origin(provider)`` is where a sandbox of that provider reaches this coordinator (``Coordinator.origin``).
    It is a ``boxwright.colocated.ToolExecHost``: ``colocated_drive`` registers each run here, and a
    successor's drive registers the run it took over, then re-points the runner to that grant.
    """

    def __init__(self, origin: Callable[[str | None], str]) -> None:
        self._origin = origin
        self._runs: dict[str, ToolExecRun] = {}
        self.app = tool_exec_app(self._runs.get, max_body_bytes=TOOL_EXEC_MAX_BODY)

    def register(
        self,
        run_id: str,
        tools: Sequence[Tool],
        *,
        thread_id: str,
        signal: AbortSignal | None = None,
        token: str | None = None,
        provider: str | None = None,
        context: Any = None,
        emit_custom_event: EmitCustomEvent | None = None,
    ) -> ToolExecGrant:
        """Serve ``tools`` for ``run_id`` until the grant is closed; only these tools, only this token (S7).

        ``token``: the run's bearer (default: a new one); a co-located run passes the one it derives from
        the runner secret, so every host of the run scrubs the same value. ``provider``: the sandbox's,
        for the origin it can reach (a Docker container: ``host.docker.internal`` on a loopback server).
        """
        if run_id in self._runs:
            raise ValueError(f"run {run_id!r} already has a tool-exec grant")
        token = token or mint_token()
        run = ToolExecRun(
            tools, token=token, thread_id=thread_id, signal=signal, context=context, emit_custom_event=emit_custom_event
        )
        self._runs[run_id] = run
        url = f"{self._origin(provider).rstrip('/')}{tool_exec_path(run_id)}?threadId={quote(thread_id, safe='')}"

        def close() -> None:
            if self._runs.get(run_id) is run:
                del self._runs[run_id]

        return ToolExecGrant(url=url, token=token, _close=close)

    @property
    def run_ids(self) -> list[str]:
        return list(self._runs)

    def close_all(self) -> None:
        self._runs.clear()


__all__ = ["BRIDGE_PREFIX", "MountedToolBridge", "ToolExecGrant", "ToolExecRegistry"]
