"""Where sandboxes call the coordinator back (R45, S3): never wherever a request's ``Host`` says.

On a plain server whoever sends the trigger picks ``Host`` and ``X-Forwarded-*``; a callback URL
built from them would hand the run's bearer token and tool arguments to that host (or aim the
container at an internal address). So the origin is, in order: the configured ``public_origin``;
for a loopback-bound server, the bound port from the ASGI scope (``host.docker.internal`` for
Docker sandboxes); the request host only when ``trust_request_host`` and it is allowlisted;
otherwise a configuration error naming ``BOXWRIGHT_PUBLIC_ORIGIN``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Final
from urllib.parse import urlsplit

from starlette.types import Scope

from boxwright.errors import ToolBridgeConfigError
from boxwright.tool_bridge.asgi import DOCKER_HOST, DOCKER_PROVIDERS

PUBLIC_ORIGIN_ENV: Final = "BOXWRIGHT_PUBLIC_ORIGIN"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _format(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def normalize_origin(origin: str) -> str:
    """``host[:port]`` or ``scheme://host[:port]`` -> ``scheme://host[:port]`` (http for loopback and Docker)."""
    text = origin.strip().rstrip("/")
    if "://" not in text:
        host = urlsplit(f"//{text}").hostname or text
        scheme = "http" if _loopback(host) or host == DOCKER_HOST else "https"
        text = f"{scheme}://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ToolBridgeConfigError(f"public origin {origin!r}: expected scheme://host[:port] with no path")
    return f"{parts.scheme}://{parts.netloc}"


def resolve_bridge_origin(
    scope: Scope | None,
    *,
    public_origin: str | None,
    provider: str | None = None,
    trust_request_host: bool = False,
    allowed_hosts: Sequence[str] = (),
) -> str:
    """The origin a sandbox of ``provider`` calls back on, by the first rule that applies (R45)."""
    if public_origin:
        return normalize_origin(public_origin)
    server = scope.get("server") if scope is not None else None
    if server is not None:
        bound_host, bound_port = str(server[0]), int(server[1])
        if _loopback(bound_host) and bound_port > 0:
            # The socket's own port: Host: localhost:6379 must not point a container at Redis.
            host = DOCKER_HOST if provider in DOCKER_PROVIDERS else bound_host
            return f"http://{_format(host)}:{bound_port}"
    if trust_request_host and scope is not None and allowed_hosts:
        requested = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        hostname = urlsplit(f"//{requested}").hostname or ""
        if hostname and hostname in allowed_hosts:
            return normalize_origin(requested)
    raise ToolBridgeConfigError(
        "no origin sandboxes can call back on: set public_origin (or $"
        f"{PUBLIC_ORIGIN_ENV}) to the coordinator's public scheme://host[:port]"
    )


__all__ = ["PUBLIC_ORIGIN_ENV", "normalize_origin", "resolve_bridge_origin"]
