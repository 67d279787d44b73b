"""1,000 concurrent SSE tailers of one live run on one coordinator process (``boxwright serve`` over Redis).

Every tailer must get every line of the run exactly once and its status; the bench reports the
coordinator's memory per tailer (RSS with the tails connected minus before, over the count) and
the delivery latency percentiles (a line's arrival at a tailer minus the agent's stamp). Loopback
only; the run is bounded in lines and the whole bench in time. Redis: a redis-server this bench
starts (appendonly), or ``--store redis://...``.

Run: .venv/bin/python bench/coordinator_tailers.py [--tailers 1000] [--lines 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.coordinator import CoordinatorProcess
from tests.support.redis_server import redis_server
from tests.support.sse_tailers import tail_one_run, timed_agent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tailers", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between the agent's lines")
    parser.add_argument("--store", help="redis://... (default: a redis-server this bench starts)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--lease-ms", type=int, default=30_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tailers-") as scratch, contextlib.ExitStack() as stack:
        tmp = Path(scratch)
        store = args.store or stack.enter_context(redis_server(fsync="everysec")).url(prefix="bench:")
        # The default lease (30 s): the tests' 1.5 s one is lost to a loop busy with a thousand connects.
        coordinator = CoordinatorProcess("bench", tmp, timed_agent(tmp), store=store, lease_ms=args.lease_ms)
        stack.callback(coordinator.close)
        result = asyncio.run(
            tail_one_run(
                coordinator.url,
                pid=coordinator.proc.pid,
                headers=coordinator.headers(),
                go_file=tmp / "go",
                tailers=args.tailers,
                lines=args.lines,
                gap=args.gap,
                timeout=args.timeout,
            )
        )
        print(result.summary())
        for failure in result.failures[:5]:
            print("  failure:", failure)
        if result.failures:
            print("coordinator said:", coordinator.stderr()[-3000:])
        return 0 if result.complete == args.tailers else 1


if __name__ == "__main__":
    raise SystemExit(main())
