"""``python -m boxwright.runner [--host H] [--port P]``: the in-container runner.

Its bearer token comes from ``$BOXWRIGHT_RUNNER_TOKEN``, set by the host in the runner's exec env.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    from .server import create_runner_app

    parser = argparse.ArgumentParser(prog="boxwright runner", description="the in-container runner")
    # The container's own address on its bridge by default is chosen by the host (it passes --host):
    # loopback alone would be unreachable from the host, and 0.0.0.0 is more than the runner needs.
    parser.add_argument("--host", default=os.environ.get("RUNNER_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RUNNER_PORT", "8080")))
    args = parser.parse_args(argv)
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_runner_app(on_shutdown=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False))
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
