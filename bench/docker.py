"""Docker provider bench: create-to-first-exec and exec round trip, side by side in one run.

    .venv/bin/python bench/docker.py [--image IMAGE] [--rounds N] [--execs N] [--no-swerex]
    .venv/bin/python bench/docker.py --profile [--rounds N]   # where create's ms go, per engine call

Peers, each measured here on the same engine and image:
  - the Docker CLI: `docker run --rm IMAGE true` (create) and `docker exec CID true` (exec);
  - SWE-ReX 1.4.0's DockerDeployment (PyPI `swe-rex`), start to first command and its command round trip,
    served by its in-container HTTP server. Its server is installed into an image FROM the runner image
    (`boxwright-bench-swerex:1.4.0`, built here from wheels: never pulled) and its client into a venv of its own
    (/tmp/boxwright-bench-swerex-venv), so the project's venv is untouched.
Goals (issue 12): create <= 1.0x the CLI run and ahead of SWE-ReX's start; exec <= 0.25x the CLI exec and ahead
of SWE-ReX's round trip. The peers run round by round in one process, interleaved in a rotating order, so a
machine whose load swings (other jobs) weighs on each alike; ratios are medians of round-by-round ratios.
boxwright's exec is measured in the steady state, once the handle's exec server answers (it starts in the
background after create; until then commands take docker exec). Prints medians and ratios; exits 0 whatever
they are (a bench, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

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


class Cli:
    """The Docker CLI peer: `docker run --rm IMAGE true`, and `docker exec CID true` on a kept container."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.cid = subprocess.run(
            ["docker", "run", "-d", "--label", LABEL, image, "sleep", "infinity"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    async def create(self) -> float:
        return await asyncio.to_thread(_timed, ["docker", "run", "--rm", "--label", LABEL, self.image, "true"])

    async def exec(self) -> float:
        return await asyncio.to_thread(_timed, ["docker", "exec", self.cid, "true"])

    async def close(self) -> None:
        await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", self.cid], capture_output=True)


class Boxwright:
    """boxwright's provider: create to first exec; exec round trips on a handle past its start (the fast path)."""

    def __init__(self, image: str) -> None:
        from boxwright.providers.docker import docker_sandbox

        self.provider = docker_sandbox(image, labels={"boxwright.bench": "1"})
        self.handle: Any = None

    async def create(self) -> float:
        started = time.perf_counter()
        handle = await self.provider.create()
        await handle.process.exec("true")
        took = time.perf_counter() - started
        await handle.destroy()
        return took

    async def exec(self) -> float:
        if self.handle is None:
            self.handle = await self.provider.create()
            # Steady state: the exec server starts in the background after create; until it answers
            # (a few hundred ms), commands take docker exec.
            deadline = time.monotonic() + 10
            while self.handle._fast is None and time.monotonic() < deadline:
                await self.handle.process.exec("true")
                await asyncio.sleep(0.05)
        started = time.perf_counter()
        await self.handle.process.exec("true")
        return time.perf_counter() - started

    async def close(self) -> None:
        if self.handle is not None:
            await self.handle.destroy()


async def profile(image: str, rounds: int) -> None:
    """Create to first exec per engine call, A/B interleaved with the CLI: the keep-alive's own setup (default)
    against the host's (a non-default keep-alive: put_archive + a root chmod exec, then docker exec)."""
    from boxwright.providers.docker import DockerProvider

    label = {"boxwright.bench": "1"}
    peers = {
        "keep-alive setup": DockerProvider(image, labels=label),
        "host setup": DockerProvider(image, labels=label, keep_alive_command=("sh", "-c", "exec sleep infinity")),
    }
    steps: dict[str, dict[str, list[float]]] = {name: {} for name in peers}
    totals: dict[str, list[float]] = {name: [] for name in [*peers, "cli"]}
    for name, provider in peers.items():
        api = await provider._connected()
        call = api.call

        async def timed(fn: Any, *args: Any, _call: Any = call, _steps: Any = steps[name], **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await _call(fn, *args, **kwargs)
            finally:
                _steps.setdefault(getattr(fn, "__name__", "?"), []).append(time.perf_counter() - started)

        api.call = timed  # type: ignore[method-assign]
    cli = Cli(image)
    try:
        for i in range(rounds):
            names = [*peers, "cli"]
            for name in names[i % 3 :] + names[: i % 3]:
                if name == "cli":
                    totals[name].append(await cli.create())
                    continue
                started = time.perf_counter()
                handle = await peers[name].create()
                made = time.perf_counter()
                await handle.process.exec("true")
                done = time.perf_counter()
                totals[name].append(done - started)
                steps[name].setdefault("= create()", []).append(made - started)
                steps[name].setdefault("= first exec", []).append(done - made)
                await handle.destroy()
    finally:
        await cli.close()
    print(f"image {image}, {rounds} interleaved rounds, medians (engine calls on the create path and after it)")
    for name in peers:
        print(
            f"  {name}: create->first exec {_median_ms(totals[name]):7.1f} ms, {_paired(totals[name], totals['cli'])}"
        )
        for step, values in steps[name].items():
            print(f"    {step:20s} x{len(values) / rounds:4.1f} per round  {_median_ms(values):7.1f} ms")
    print(f"  docker run --rm true: {_median_ms(totals['cli']):7.1f} ms")


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


# A worker in SWE-ReX's own venv, driven line by line so its rounds interleave with the others':
# "start" -> start a deployment and run its first command; "exec" -> one round trip; "stop".
_SWEREX_WORKER = r"""
import asyncio, json, sys, time
from swerex.deployment.docker import DockerDeployment
from swerex.runtime.abstract import Command

async def main(image):
    loop = asyncio.get_running_loop()
    kept = None
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line or line == "quit":
            break
        if line == "start":
            t = time.perf_counter()
            d = DockerDeployment(image=image, pull="never", docker_args=["--label", "boxwright.bench=1"])
            await d.start()
            await d.runtime.execute(Command(command=["true"]))
            took = time.perf_counter() - t
            await d.stop()
        elif line == "exec":
            if kept is None:
                kept = DockerDeployment(image=image, pull="never", docker_args=["--label", "boxwright.bench=1"])
                await kept.start()
                await kept.runtime.execute(Command(command=["true"]))
            t = time.perf_counter()
            await kept.runtime.execute(Command(command=["true"]))
            took = time.perf_counter() - t
        print("BENCH-RESULT " + json.dumps(took), flush=True)
    if kept is not None:
        await kept.stop()

asyncio.run(main(sys.argv[1]))
"""


class SweRex:
    """SWE-ReX 1.4.0's DockerDeployment, through the worker above."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [f"{SWEREX_VENV}/bin/python", "-c", _SWEREX_WORKER, SWEREX_IMAGE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def _ask(self, what: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        # SWE-ReX logs to stdout too: the answer is the marked line.
        for line in self.proc.stdout:
            if line.startswith("BENCH-RESULT "):
                return float(json.loads(line.removeprefix("BENCH-RESULT ")))
        raise RuntimeError(f"the SWE-ReX worker ended (exit {self.proc.wait()})")

    async def create(self) -> float:
        return await asyncio.to_thread(self._ask, "start")

    async def exec(self) -> float:
        return await asyncio.to_thread(self._ask, "exec")

    async def close(self) -> None:
        def quit() -> None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

        await asyncio.to_thread(quit)


async def interleaved(peers: dict[str, Any], rounds: int, execs: int) -> dict[str, dict[str, list[float]]]:
    """Round by round, each peer once (in a rotating order): the machine's load swings hit all alike."""
    names = list(peers)
    found: dict[str, dict[str, list[float]]] = {name: {"create": [], "exec": []} for name in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            found[name]["create"].append(await peers[name].create())
        for _ in range(execs):
            for name in order:
                found[name]["exec"].append(await peers[name].exec())
    return found


def _paired(mine: list[float], theirs: list[float]) -> str:
    """The median of round-by-round ratios, with their spread (min..max)."""
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}..{max(ratios):.2f})"


def _remove_left() -> None:
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True
    ).stdout.split()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=os.environ.get("BOXWRIGHT_RUNNER_IMAGE", "boxwright-runner:latest"))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--execs", type=int, default=5, help="exec round trips per peer per round")
    parser.add_argument("--no-swerex", action="store_true", help="skip the SWE-ReX peer")
    parser.add_argument("--profile", action="store_true", help="create's engine calls, keep-alive vs host setup")
    args = parser.parse_args()
    if args.profile:
        try:
            asyncio.run(profile(args.image, args.rounds))
        finally:
            _remove_left()
        return 0
    why = "skipped (--no-swerex)" if args.no_swerex else ensure_swerex(args.image)

    async def run() -> dict[str, dict[str, list[float]]]:
        peers: dict[str, Any] = {"cli": Cli(args.image), "boxwright": Boxwright(args.image)}
        if why is None:
            peers["swerex"] = SweRex()
        try:
            return await interleaved(peers, args.rounds, args.execs)
        finally:
            for peer in peers.values():
                with contextlib.suppress(Exception):
                    await peer.close()

    try:
        found = asyncio.run(run())
    finally:
        _remove_left()
    cli, bw, rex = found["cli"], found["boxwright"], found.get("swerex")
    print(f"image {args.image}, {args.rounds} interleaved rounds ({args.execs} execs each), medians")
    print(
        f"  create->first exec  boxwright {_median_ms(bw['create']):8.1f} ms   docker run --rm true"
        f" {_median_ms(cli['create']):8.1f} ms   ratio {_paired(bw['create'], cli['create'])} (goal <= 1.0x)"
    )
    print(
        f"  exec round trip     boxwright {_median_ms(bw['exec']):8.1f} ms   docker exec true    "
        f" {_median_ms(cli['exec']):8.1f} ms   ratio {_paired(bw['exec'], cli['exec'])} (goal <= 0.25x)"
    )
    if rex is not None:
        print(
            f"  SWE-ReX 1.4.0       start+first {_median_ms(rex['create']):8.1f} ms"
            f" (boxwright/SWE-ReX {_paired(bw['create'], rex['create'])}, goal < 1)"
            f"   round trip {_median_ms(rex['exec']):6.1f} ms (boxwright/SWE-ReX {_paired(bw['exec'], rex['exec'])},"
            " goal < 1)"
        )
    else:
        print(f"  SWE-ReX: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
