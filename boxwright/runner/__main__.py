"""``python -m boxwright.runner [--host H] [--port P]``: the in-container runner.

Its bearer token is the first line of its stdin, written by the host as it starts the runner
(``launch.spawn_runner``), or a ``--token-file`` it unlinks; before reading it the runner makes
itself non-dumpable, so the agent it spawns (same user, no capabilities) cannot read it from
``/proc`` or ``ptrace`` (``hardening``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from .hardening import RunnerTokenError, read_token, read_token_file, set_non_dumpable

    parser = argparse.ArgumentParser(
        prog="boxwright runner", description="the in-container runner (its token: the first line of stdin)"
    )
    # The container's own address on its bridge by default is chosen by the host (it passes --host):
    # loopback alone would be unreachable from the host, and 0.0.0.0 is more than the runner needs.
    parser.add_argument("--host", default=os.environ.get("RUNNER_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RUNNER_PORT", "8080")))
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the token from PATH and unlink it (a provider whose exec has no writable stdin)",
    )
    args = parser.parse_args(argv)
    try:
        # First: the token must never be in memory the agent may read.
        reason = set_non_dumpable()
        if reason is not None:
            print(f"boxwright runner: {reason}", file=sys.stderr)
        token = read_token_file(args.token_file) if args.token_file else read_token()
    except RunnerTokenError as exc:
        print(f"boxwright runner: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from .server import create_runner_app

    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_runner_app(token, on_shutdown=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False))
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
