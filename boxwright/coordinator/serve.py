"""``boxwright serve``: one coordinator replica under uvicorn.

Several replicas given one store URL are one coordinator: any of them takes a trigger, serves
any run's tails, and adopts a run whose replica went away. A config comes from
``--config MODULE:ATTR`` (a ``CoordinatorConfig``, or a callable returning one), else from the
command line's provider and harnesses. Secrets come from the environment, never from argv.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import socket
import sys
from typing import Any, Final

import uvicorn

from .app import create_coordinator_app
from .config import CoordinatorConfig

# The uvicorn whose WebSocket internals ``ws_protocol`` was built and attacked against: it subclasses
# them, and an older uvicorn lacks what it overrides (backpressure on writes came in 0.53, its ping hook later).
_HARDENED_FROM_UVICORN: Final = (0, 54)

log = logging.getLogger("boxwright.serve")


def _ws_protocol() -> Any:
    """The WebSocket protocol class for uvicorn: the hardened one, or uvicorn's own where that does not fit."""
    parts = uvicorn.__version__.split(".")[:2]
    found = tuple(int(p) for p in parts if p.isdigit())
    if found < _HARDENED_FROM_UVICORN:
        log.warning(
            "uvicorn %s: the WebSocket hardening of boxwright serve needs uvicorn >= %s; running uvicorn's own",
            uvicorn.__version__,
            ".".join(map(str, _HARDENED_FROM_UVICORN)),
        )
        return "auto"
    from .ws_protocol import CoordinatorWebSocketProtocol

    return CoordinatorWebSocketProtocol


CLIENT_TOKEN_ENV: Final = "BOXWRIGHT_CLIENT_TOKEN"
ADMIN_TOKEN_ENV: Final = "BOXWRIGHT_ADMIN_TOKEN"
PUBLIC_ORIGIN_ENV: Final = "BOXWRIGHT_PUBLIC_ORIGIN"
STORE_ENV: Final = "BOXWRIGHT_STORE"
RUNNER_SECRET_ENV: Final = "BOXWRIGHT_RUNNER_SECRET"
# Open SSE tails would hold a graceful shutdown forever: they get this long, then the lifespan drains.
GRACEFUL_SHUTDOWN_S: Final = 3


class ConfigLoadError(ValueError):
    pass


def load_config(spec: str) -> CoordinatorConfig:
    """``MODULE:ATTR`` -> the ``CoordinatorConfig`` it names (called first if it is a callable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigLoadError(f"--config {spec!r}: expected MODULE:ATTR (a CoordinatorConfig or a function)")
    try:
        value: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigLoadError(f"--config {spec!r}: {exc}") from exc
    if callable(value) and not isinstance(value, CoordinatorConfig):
        value = value()
    if not isinstance(value, CoordinatorConfig):
        raise ConfigLoadError(f"--config {spec!r} gave a {type(value).__name__}, not a CoordinatorConfig")
    return value


def with_overrides(config: CoordinatorConfig, **given: Any) -> CoordinatorConfig:
    """``config`` with what the command line and environment set (a given ``None`` changes nothing)."""
    env = {
        "client_token": os.environ.get(CLIENT_TOKEN_ENV),
        "admin_token": os.environ.get(ADMIN_TOKEN_ENV),
        "public_origin": os.environ.get(PUBLIC_ORIGIN_ENV),
        "store_url": os.environ.get(STORE_ENV),
        "runner_secret": os.environ.get(RUNNER_SECRET_ENV),
    }
    chosen = {k: v for k, v in given.items() if v is not None}
    changes: dict[str, Any] = dict(chosen)
    for name, value in env.items():
        if value and name not in chosen and getattr(config, name) in (None, ""):
            changes[name] = value
    return dataclasses.replace(config, **changes)


def serve_coordinator(config: CoordinatorConfig, host: str, port: int, *, announce: str | None = None) -> None:
    """Serve ``config`` on ``host:port`` until SIGINT/SIGTERM (then: drain, release, exit).

    ``announce`` (with ``{url}``) is printed once the socket listens, with the port it got (``port`` 0: any).
    """
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_coordinator_app(config)
    # No access log: a WebSocket ticket rides in the query string and must never be logged (S6).
    settings = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ws=_ws_protocol(),
    )
    if announce is None:
        uvicorn.Server(settings).run()
        return
    sock = _listen(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # Listening already: a browser opened on this line is queued until uvicorn accepts.
    print(announce.format(url=f"http://{shown}:{bound_port}/"), flush=True)
    try:
        uvicorn.Server(settings).run(sockets=[sock])
    finally:
        sock.close()


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror} (pick another --port)") from None
    sock.listen(128)
    return sock


__all__ = ["ConfigLoadError", "load_config", "serve_coordinator", "with_overrides"]
