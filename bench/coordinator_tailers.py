"""1,000 concurrent SSE tailers of one live run on one coordinator process (``boxwright serve`` over Redis).

Every tailer must get every line of the run exactly once and its status; the bench reports the
coordinator's memory per tailer (RSS with the tails connected minus before, over the count), the
delivery latency percentiles (a line's arrival at a tailer minus the agent's stamp) and whether
the run's driver kept its lease through the connect burst (the run's epoch stays 1). Loopback
only; the run is bounded in lines and the whole bench in time. Redis: a redis-server this bench
starts (appendonly), or ``--store redis://...``.

``--baseline REV`` measures a coordinator served from a checkout of REV too (a temporary git
worktree, removed after), on the same Redis and the same machine, one after the other, and
prints both and the ratios (baseline / this tree).

Run: .venv/bin/python bench/coordinator_tailers.py [--tailers 1000] [--lines 50] [--baseline REV] [--lease-ms 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.support.coordinator import CoordinatorProcess
from tests.support.redis_server import redis_server
from tests.support.replicas import ROOT
from tests.support.sse_tailers import TailResult, allow_open_files, tail_one_run, timed_agent


@dataclass
class Side:
    label: str
    result: TailResult
    epoch: int | None
    status: str | None

    def line(self) -> str:
        return f"{self.label}: {self.result.summary()}; run {self.status} at epoch {self.epoch}"


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A detached worktree of ``rev`` (removed on exit): the baseline's coordinator runs from it."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def measure(label: str, root: Path, store: str, tmp: Path, args: argparse.Namespace) -> Side:
    tmp.mkdir()
    coordinator = CoordinatorProcess(label, tmp, timed_agent(tmp), store=store, lease_ms=args.lease_ms, root=root)
    try:
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
        answer = httpx.get(
            f"{coordinator.url}/runs/{result.run_id}?threadId={result.thread_id}",
            headers=coordinator.headers(),
            timeout=30,
        )
        record = answer.json() if answer.status_code == 200 else {}
        side = Side(label, result, record.get("driverEpoch"), record.get("status"))
        for failure in result.failures[:5]:
            print(f"  {label} failure:", failure)
        if result.failures:
            print(f"  {label} coordinator said:", coordinator.stderr()[-3000:])
        return side
    finally:
        coordinator.close()


def ratio(before: float, after: float) -> str:
    return f"{before / after:.2f}x" if after > 0 and before == before and after == after else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tailers", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between the agent's lines")
    parser.add_argument("--store", help="redis://... (default: a redis-server this bench starts)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--lease-ms", type=int, default=30_000)
    parser.add_argument("--baseline", metavar="REV", help="also measure a coordinator from this git revision")
    args = parser.parse_args()
    allow_open_files(args.tailers)
    with tempfile.TemporaryDirectory(prefix="bench-tailers-") as scratch, contextlib.ExitStack() as stack:
        tmp = Path(scratch)
        server = None if args.store else stack.enter_context(redis_server(fsync="everysec"))

        def store_for(prefix: str) -> str:
            return str(args.store) if server is None else server.url(prefix=prefix)

        sides: list[Side] = []
        if args.baseline:
            tree = stack.enter_context(checkout(args.baseline))
            sides.append(measure(f"baseline {args.baseline}", tree, store_for("bench-baseline:"), tmp / "base", args))
        sides.append(measure("this tree", ROOT, store_for("bench:"), tmp / "current", args))
        for side in sides:
            print(side.line())
        if len(sides) == 2:
            before, after = sides[0].result, sides[1].result
            print(
                "baseline / this tree: "
                + ", ".join(
                    f"{name} {ratio(before.percentile(q), after.percentile(q))}"
                    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
                )
                + f", memory per tailer {ratio(before.per_tailer_bytes, after.per_tailer_bytes)}"
            )
        current = sides[-1]
        return 0 if current.result.complete == args.tailers and current.epoch == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
