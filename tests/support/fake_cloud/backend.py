"""The machines behind the fake clouds: one Docker container per fake sandbox, commands run for real.

A vendor fake (``e2b.py``, ``daytona.py``) speaks its vendor's HTTP API and hands
the work to a ``Machine`` here: a container of ``boxwright-base:bookworm`` with the
vendor's user and home, so paths like ``/home/user/workspace``, ``setsid``, process
groups and signals behave as on the vendor's VM. Every command runs through
``docker exec`` as the vendor's agent would run it (pid reported, stdin writable,
stdout/stderr split, signals sent to the pid only), and is recorded in
``Machine.commands`` so tests can scan what the vendor received.

Everything here runs on the fake server's own event loop (a thread of its own): the
Docker SDK's blocking calls go to a small pool, exec streams are read non-blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

FAKE_LABEL = "boxwright.fake-cloud"
_T = TypeVar("_T")
# The first stderr line of every exec is its pid, written by this wrapper before it execs the command.
_PID_WRAPPER = 'echo "$$" >&2; cd "$1" 2>/dev/null || { echo "chdir $1: no such file or directory" >&2; exit 1; }; shift; exec "$@"'


@dataclass
class Received:
    """One command as the vendor received it: argv, env and user (tests scan these for secrets)."""

    argv: list[str]
    env: dict[str, str]
    user: str
    cwd: str


class Process:
    """One ``docker exec`` inside a machine: pid, streaming output, writable stdin, exit code."""

    def __init__(self, machine: Machine, exec_id: str, raw: Any, stdin: bool) -> None:
        self.machine = machine
        self._exec_id = exec_id
        self._raw = raw
        self.sock: socket.socket = raw._sock
        self.sock.settimeout(None)
        self.sock.setblocking(False)
        self.stdin_open = stdin
        self.pid = 0
        self.signalled = False  # whether the agent itself signalled this pid (how a signal death is told)
        self.output: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self._pid_known = asyncio.Event()
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())

    async def started(self) -> int:
        await asyncio.wait_for(self._pid_known.wait(), 30)
        return self.pid

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        err_head = bytearray()
        try:
            while True:
                try:
                    data = await loop.sock_recv(self.sock, 65536)
                except OSError:
                    break
                if not data:
                    break
                buffer += data
                while len(buffer) >= 8:
                    (size,) = struct.unpack(">I", bytes(buffer[4:8]))
                    if len(buffer) < 8 + size:
                        break
                    kind, payload = buffer[0], bytes(buffer[8 : 8 + size])
                    del buffer[: 8 + size]
                    if kind == 2 and not self._pid_known.is_set():
                        err_head += payload
                        if b"\n" not in err_head:
                            continue
                        line, _, payload = bytes(err_head).partition(b"\n")
                        self.pid = int(line.strip() or b"0")
                        self._pid_known.set()
                        if not payload:
                            continue
                    self.output.put_nowait(("stderr" if kind == 2 else "stdout", payload))
        finally:
            self._pid_known.set()
            with contextlib.suppress(Exception):
                self.sock.close()
            with contextlib.suppress(Exception):
                self._raw.close()
            code = await self._exit()
            self.output.put_nowait(None)
            if not self.exit_code.done():
                self.exit_code.set_result(code)

    async def _exit(self) -> int:
        api = self.machine.cloud
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = await api.call(api.api.exec_inspect, self._exec_id)
            except Exception:
                return -1
            if not state.get("Running"):
                return int(state.get("ExitCode") or 0)
            await asyncio.sleep(0.02)
        return -1

    async def write(self, data: bytes) -> None:
        if not self.stdin_open:
            raise OSError("stdin is closed")
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def close_stdin(self) -> None:
        if self.stdin_open:
            self.stdin_open = False
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    async def signal(self, signo: int) -> bool:
        """Signal the process itself (its pid, not its group): what the vendors' agents do."""
        if self.exit_code.done() or not self.pid:
            return False
        self.signalled = True
        result = await self.machine.run(["kill", f"-{signo}", str(self.pid)], user="root", record=False)
        return result[0] == 0


@dataclass
class Machine:
    """A fake sandbox's VM: one container, its user, home and env."""

    cloud: FakeCloud
    id: str
    container: str
    user: str
    home: str
    env: dict[str, str]
    image: str
    network: bool
    commands: list[Received] = field(default_factory=list)
    processes: dict[int, Process] = field(default_factory=dict)
    running: bool = True

    async def start(
        self, argv: Sequence[str], *, user: str | None = None, env: Mapping[str, str] | None = None,
        cwd: str | None = None, stdin: bool = False, record: bool = True,
    ) -> Process:
        who = user or self.user
        merged = {"HOME": self.home if who != "root" else "/root", "USER": who, **self.env, **(env or {})}
        where = cwd or (self.home if who != "root" else "/root")
        if record:
            self.commands.append(Received(list(argv), dict(env or {}), who, where))
        api = self.cloud
        wrapped = ["sh", "-c", _PID_WRAPPER, "fake-agent", where, *argv]
        created = await api.call(
            api.api.exec_create, self.container, wrapped, stdin=True, stdout=True, stderr=True, tty=False,
            environment=[f"{k}={v}" for k, v in merged.items()], user=who,
        )
        raw = await api.call(api.api.exec_start, created["Id"], socket=True)
        process = Process(self, created["Id"], raw, stdin)
        if not stdin:
            process.close_stdin()
        await process.started()
        self.processes[process.pid] = process
        process.exit_code.add_done_callback(lambda _: self.processes.pop(process.pid, None))
        return process

    async def run(
        self, argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None, record: bool = True,
        env: Mapping[str, str] | None = None, cwd: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        process = await self.start(argv, user=user, stdin=stdin is not None, record=record, env=env, cwd=cwd)
        if stdin is not None:
            await process.write(stdin)
            process.close_stdin()
        out, err = bytearray(), bytearray()
        while (item := await process.output.get()) is not None:
            (err if item[0] == "stderr" else out).extend(item[1])
        return await process.exit_code, bytes(out), bytes(err)


class FakeCloud:
    """Creates, commits and removes the machines of one fake vendor; tracks what it made for cleanup."""

    def __init__(self, image: str, user: str, home: str, uid: int = 1000) -> None:
        import docker  # type: ignore[import-untyped]

        self.api = docker.APIClient(version="auto", timeout=120)
        self.errors = docker.errors
        self.image = image
        self.user = user
        self.home = home
        self.uid = uid
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-cloud")
        self.machines: dict[str, Machine] = {}
        self.images: set[str] = set()
        self._lock = threading.Lock()

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def create(
        self, *, image: str | None = None, env: Mapping[str, str] | None = None, network: bool = True,
        labels: Mapping[str, str] | None = None, sandbox_id: str | None = None,
    ) -> Machine:
        image = image or self.image
        host_config = self.api.create_host_config(
            init=True, network_mode="none" if not network else None, pids_limit=512, mem_limit="1g",
            extra_hosts={"host.docker.internal": "host-gateway"} if network else None,
        )
        created = await self.call(
            self.api.create_container, image, command=["sleep", "infinity"], user="0:0",
            labels={FAKE_LABEL: "1", **(labels or {})}, host_config=host_config, tty=False,
        )
        cid = str(created["Id"])
        machine = Machine(self, sandbox_id or uuid.uuid4().hex[:20], cid, self.user, self.home, dict(env or {}),
                          image, network)
        with self._lock:
            self.machines[machine.id] = machine
        try:
            await self.call(self.api.start, cid)
            if image == self.image:
                # The vendor's template: its user (uid 1000) with a writable home; / itself is root's.
                script = (
                    f"id -u {self.user} >/dev/null 2>&1 || useradd -m -u {self.uid} -d {self.home} -s /bin/bash "
                    f"{self.user} 2>/dev/null || {{ mkdir -p {self.home}; echo '{self.user}:x:{self.uid}:{self.uid}"
                    f"::{self.home}:/bin/bash' >> /etc/passwd; echo '{self.user}:x:{self.uid}:' >> /etc/group; }}; "
                    f"mkdir -p {self.home} && chown {self.uid}:{self.uid} {self.home}"
                )
                code, _, err = await machine.run(["sh", "-c", script], user="root", record=False)
                if code != 0:
                    raise RuntimeError(f"fake machine setup failed: {err!r}")
        except BaseException:
            await self.remove(machine.id)
            raise
        return machine

    async def commit(self, machine: Machine, repository: str) -> str:
        tag = uuid.uuid4().hex[:12]
        await self.call(self.api.commit, machine.container, repository=repository, tag=tag, pause=False)
        ref = f"{repository}:{tag}"
        with self._lock:
            self.images.add(ref)
        return ref

    async def stop(self, machine: Machine) -> None:
        machine.running = False
        await self.call(self.api.stop, machine.container, timeout=1)

    async def restart(self, machine: Machine) -> None:
        await self.call(self.api.start, machine.container)
        machine.running = True

    async def remove(self, machine_id: str) -> bool:
        with self._lock:
            machine = self.machines.pop(machine_id, None)
        if machine is None:
            return False
        machine.running = False
        with contextlib.suppress(self.errors.NotFound):
            await self.call(self.api.remove_container, machine.container, force=True, v=True)
        return True

    async def remove_image(self, ref: str) -> bool:
        with self._lock:
            if ref not in self.images:
                return False
            self.images.discard(ref)
        with contextlib.suppress(self.errors.NotFound, self.errors.APIError):
            await self.call(self.api.remove_image, ref, force=True)
        return True

    def cleanup(self) -> None:
        """Remove every container and image this fake made (blocking; from the test thread)."""
        with self._lock:
            machines, images = list(self.machines.values()), list(self.images)
            self.machines.clear()
            self.images.clear()
        for machine in machines:
            with contextlib.suppress(Exception):
                self.api.remove_container(machine.container, force=True, v=True)
        for ref in images:
            with contextlib.suppress(Exception):
                self.api.remove_image(ref, force=True)
        self.pool.shutdown(wait=False)


class ServerThread:
    """An ASGI app under uvicorn on 127.0.0.1 (an ephemeral port), on a thread with its own loop."""

    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        import uvicorn

        sock = socket.socket()
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        self.host = host
        self._sock = sock
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="fake-cloud-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self._sock]))

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake cloud server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
