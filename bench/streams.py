"""Durable Streams: `boxwright serve --streams` (SQLite) side by side with the reference server.

The reference is npm @durable-streams/server, file-backed (LMDB + log files), started as spec
durable-streams.md §2.3 says. Both meet the same Node load script (bench/streams_load.mjs, plain
fetch, no client batching): unbatched appends from 16 writers (100-byte octet and JSON event
bodies), catch-up of a 10,000-event JSON log, SSE fan-out to 50 readers, long-poll round trip.
Each figure is the median of --runs runs (servers alternate who goes first); a ratio above 1 means
boxwright is better (more per second, or less time).

    .venv/bin/python bench/streams.py [--runs 3] [--json]

Needs node and the npm pieces of tests/streams/package.json ($BOXWRIGHT_STREAMS_NPM, default
/opt/boxwright-streams, which .ci/run installs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NPM = Path(os.environ.get("BOXWRIGHT_STREAMS_NPM", "/opt/boxwright-streams")) / "node_modules"

# (label, path into the load script's result, higher is better, the goal as a ratio)
METRICS: list[tuple[str, tuple[str, str], bool, float]] = [
    ("unbatched octet appends/s, 16 writers", ("octetAppends", "perSecond"), True, 3.0),
    ("unbatched JSON appends/s, 16 writers", ("jsonAppends", "perSecond"), True, 3.0),
    ("catch-up 10k JSON events, p50 ms", ("catchUp", "p50"), False, 1.0),
    ("SSE fan-out 50 readers, p50 ms", ("fanOut", "p50"), False, 1.0),
    ("SSE fan-out 50 readers, p99 ms", ("fanOut", "p99"), False, 1.0),
    ("long-poll round trip, p50 ms", ("longPoll", "p50"), False, 1.0),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server for {url} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=1.0)
            return
        time.sleep(0.05)
    raise SystemExit(f"nothing answered at {url} within {timeout} s")


@contextlib.contextmanager
def _server(argv: list[str], url: str, cwd: Path, env: dict[str, str]) -> Iterator[str]:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _load(project: Path, url: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", "streams_load.mjs", url], cwd=project, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the load script failed against {url}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _figure(result: dict[str, Any], path: tuple[str, str]) -> float:
    return float(result[path[0]][path[1]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per server; medians are compared (default 3)")
    parser.add_argument("--json", action="store_true", help="print the medians and ratios as JSON")
    args = parser.parse_args()
    if shutil.which("node") is None or not (NPM / "@durable-streams" / "server").is_dir():
        raise SystemExit(f"needs node and the npm pieces of tests/streams/package.json in {NPM.parent}")

    with tempfile.TemporaryDirectory(prefix="boxwright-bench-streams-") as scratch:
        root = Path(scratch)
        project = root / "npm"
        project.mkdir()
        for name in ("streams_load.mjs", "streams_ref_server.mjs"):
            shutil.copy(HERE / name, project / name)
        (project / "node_modules").symlink_to(NPM, target_is_directory=True)
        results: dict[str, list[dict[str, Any]]] = {"reference": [], "boxwright": []}
        for run in range(args.runs):
            ref_port, bw_port = _free_port(), _free_port()
            ref_env = {**os.environ, "DS_PORT": str(ref_port), "DS_DATA_DIR": str(root / f"ref-{run}")}
            ref_env["DS_LONGPOLL_MS"] = "20000"
            reference = (["node", "streams_ref_server.mjs"], f"http://127.0.0.1:{ref_port}", project, ref_env)
            bw_argv = [sys.executable, "-m", "boxwright", "serve", "--streams", "--port", str(bw_port)]
            bw_argv += ["--db", str(root / f"boxwright-{run}.db"), "--long-poll-timeout", "20"]
            boxwright = (bw_argv, f"http://127.0.0.1:{bw_port}", REPO, dict(os.environ))
            order = [("reference", reference), ("boxwright", boxwright)]
            for name, (argv, url, cwd, env) in order if run % 2 == 0 else order[::-1]:
                with _server(argv, url, cwd, env):
                    results[name].append(_load(project, url))
                print(f"run {run + 1}/{args.runs}: {name} done", file=sys.stderr)

    rows = []
    for label, path, higher, goal in METRICS:
        ref = statistics.median(_figure(r, path) for r in results["reference"])
        bw = statistics.median(_figure(r, path) for r in results["boxwright"])
        ratio = bw / ref if higher else ref / bw
        rows.append({"metric": label, "reference": ref, "boxwright": bw, "ratio": ratio, "goal": goal})
    delivered = [r["fanOut"]["delivered"] for r in results["boxwright"]]
    if args.json:
        print(json.dumps({"runs": args.runs, "rows": rows, "boxwrightFanOutDelivered": delivered}, indent=2))
        return 0
    print(f"Durable Streams, median of {args.runs} runs (ratio > 1: boxwright better)")
    print(f"{'metric':<42} {'reference':>11} {'boxwright':>11} {'ratio':>7} {'goal':>6}")
    for row in rows:
        met = "ok" if row["ratio"] >= row["goal"] else "short"
        print(
            f"{row['metric']:<42} {row['reference']:>11.1f} {row['boxwright']:>11.1f} "
            f"{row['ratio']:>6.2f}x {row['goal']:>5.1f}x {met}"
        )
    print(f"fan-out deliveries (boxwright, of 10000 each run): {delivered}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
