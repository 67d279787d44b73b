"""Docker provider bench: create-to-first-exec and exec round trip, side by side in one run.

    .venv/bin/python bench/docker.py [--image IMAGE] [--rounds N]

Peers, each measured here on the same engine and image:
  - the Docker CLI: `docker run --rm IMAGE true` (create) and `docker exec CID true` (exec);
  - SWE-ReX 1.4.0's DockerDeployment (PyPI `swe-rex`), start to first command and its command round trip,
    served by its in-container HTTP server. Its server is installed into an image FROM the runner image
    (`boxwright-bench-swerex:1.4.0`, built here from wheels: never pulled) and its client into a venv of its own
    (/tmp/boxwright-bench-swerex-venv), so the project's venv is untouched.
Goals (issue 12): create <= 1.0x the CLI run and ahead of SWE-ReX's start; exec <= 0.25x the CLI exec and ahead
of SWE-ReX's round trip. Prints medians and ratios; exits 0 whatever they are (a bench, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# This file is named like the SDK: without its own directory on sys.path, `import docker` finds the SDK.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

SWEREX = "swe-rex==1.4.0"
SWEREX_IMAGE = "boxwright-bench-swerex:1.4.0"
SWEREX_VENV = "/tmp/boxwright-bench-swerex-venv"
LABEL = "boxwright.bench=1"


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def cli_figures(image: str, rounds: int) -> tuple[float, float]:
    runs = [_timed(["docker", "run", "--rm", "--label", LABEL, image, "true"]) for _ in range(rounds)]
    cid = subprocess.run(
        ["docker", "run", "-d", "--label", LABEL, image, "sleep", "infinity"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        execs = [_timed(["docker", "exec", cid, "true"]) for _ in range(rounds * 3)]
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return _median_ms(runs), _median_ms(execs)


async def boxwright_figures(image: str, rounds: int) -> tuple[float, float]:
    from boxwright.providers.docker import docker_sandbox

    provider = docker_sandbox(image, labels={"boxwright.bench": "1"})
    creates: list[float] = []
    execs: list[float] = []
    for i in range(rounds):
        started = time.perf_counter()
        handle = await provider.create()
        await handle.process.exec("true")
        creates.append(time.perf_counter() - started)
        try:
            if i == 0:
                for _ in range(rounds * 3):
                    t = time.perf_counter()
                    await handle.process.exec("true")
                    execs.append(time.perf_counter() - t)
        finally:
            await handle.destroy()
    return _median_ms(creates), _median_ms(execs)


def ensure_swerex(base_image: str) -> str | None:
    """Build the SWE-ReX image and client venv when missing; None when ready, else why not."""
    if not os.path.exists(f"{SWEREX_VENV}/bin/python"):
        subprocess.run([sys.executable, "-m", "venv", SWEREX_VENV], check=True)
        # aiohttp: the client's RemoteRuntime imports it, and swe-rex 1.4.0 does not declare it.
        pip = subprocess.run(
            [f"{SWEREX_VENV}/bin/pip", "install", "-q", SWEREX, "aiohttp"], capture_output=True, text=True
        )
        if pip.returncode != 0:
            shutil.rmtree(SWEREX_VENV, ignore_errors=True)
            return f"could not install {SWEREX} into {SWEREX_VENV}: {pip.stderr[-300:]}"
    if subprocess.run(["docker", "image", "inspect", SWEREX_IMAGE], capture_output=True).returncode == 0:
        return None
    with tempfile.TemporaryDirectory() as ctx:
        wheels = subprocess.run(
            [f"{SWEREX_VENV}/bin/pip", "wheel", "-q", SWEREX, "-w", f"{ctx}/wheels"], capture_output=True, text=True
        )
        if wheels.returncode != 0:
            return f"could not build wheels of {SWEREX}: {wheels.stderr[-300:]}"
        with open(f"{ctx}/Dockerfile", "w") as f:
            f.write(
                f"FROM {base_image}\nUSER root\nCOPY wheels/ /tmp/wheels/\n"
                "RUN python3 -m venv /opt/swerex && /opt/swerex/bin/pip install -q --no-index --find-links /tmp/wheels"
                " swe-rex && ln -s /opt/swerex/bin/swerex-remote /usr/local/bin/swerex-remote && rm -rf /tmp/wheels\n"
                "USER agent\n"
            )
        build = subprocess.run(["docker", "build", "-q", "-t", SWEREX_IMAGE, ctx], capture_output=True, text=True)
        if build.returncode != 0:
            return f"could not build {SWEREX_IMAGE}: {build.stderr[-300:]}"
    return None


_SWEREX_SCRIPT = r"""
import asyncio, json, statistics, sys, time
from swerex.deployment.docker import DockerDeployment
from swerex.runtime.abstract import Command

async def main(image, rounds):
    starts, trips = [], []
    for i in range(rounds):
        t = time.perf_counter()
        d = DockerDeployment(image=image, pull="never", docker_args=["--label", "boxwright.bench=1"])
        await d.start()
        await d.runtime.execute(Command(command=["true"]))
        starts.append(time.perf_counter() - t)
        try:
            if i == 0:
                for _ in range(rounds * 3):
                    t = time.perf_counter()
                    await d.runtime.execute(Command(command=["true"]))
                    trips.append(time.perf_counter() - t)
        finally:
            await d.stop()
    result = {"start": statistics.median(starts) * 1000, "exec": statistics.median(trips) * 1000}
    print("BENCH-RESULT " + json.dumps(result))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def swerex_figures(rounds: int) -> tuple[float, float]:
    run = subprocess.run(
        [f"{SWEREX_VENV}/bin/python", "-c", _SWEREX_SCRIPT, SWEREX_IMAGE, str(rounds)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if run.returncode != 0:
        raise RuntimeError(f"SWE-ReX bench failed: {run.stderr[-500:]}")
    # SWE-ReX logs to stdout too: the result is the marked line.
    marked = [line for line in run.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    if not marked:
        raise RuntimeError(f"SWE-ReX bench printed no result: {run.stdout[-300:]} {run.stderr[-300:]}")
    figures = json.loads(marked[-1].removeprefix("BENCH-RESULT "))
    return float(figures["start"]), float(figures["exec"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=os.environ.get("BOXWRIGHT_RUNNER_IMAGE", "boxwright-runner:latest"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-swerex", action="store_true", help="skip the SWE-ReX peer")
    args = parser.parse_args()
    try:
        cli_run, cli_exec = cli_figures(args.image, args.rounds)
        bw_create, bw_exec = asyncio.run(boxwright_figures(args.image, args.rounds))
        rex: tuple[float, float] | None = None
        why = "skipped (--no-swerex)"
        if not args.no_swerex:
            problem = ensure_swerex(args.image)
            if problem is None:
                try:
                    rex = swerex_figures(args.rounds)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    why = str(exc)
            else:
                why = problem
    finally:
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True
        ).stdout.split()
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    print(f"image {args.image}, {args.rounds} rounds (exec: {args.rounds * 3}), medians")
    print(
        f"  create->first exec  boxwright {bw_create:8.1f} ms   docker run --rm true {cli_run:8.1f} ms"
        f"   ratio {bw_create / cli_run:.2f}x (goal <= 1.0x)"
    )
    print(
        f"  exec round trip     boxwright {bw_exec:8.1f} ms   docker exec true     {cli_exec:8.1f} ms"
        f"   ratio {bw_exec / cli_exec:.2f}x (goal <= 0.25x)"
    )
    if rex is not None:
        print(
            f"  SWE-ReX 1.4.0       start+first {rex[0]:8.1f} ms (boxwright/SWE-ReX {bw_create / rex[0]:.2f}x,"
            f" goal < 1)   round trip {rex[1]:6.1f} ms (boxwright/SWE-ReX {bw_exec / rex[1]:.2f}x, goal < 1)"
        )
    else:
        print(f"  SWE-ReX: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
