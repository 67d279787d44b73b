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
import base64
import contextlib
import json
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .agent import SOURCE as AGENT

FAKE_LABEL = "boxwright.fake-cloud"
# The test process that made a machine: a machine whose process is gone (killed before its atexit) is swept.
PID_LABEL = "boxwright.fake-cloud.pid"
_T = TypeVar("_T")


@dataclass
class Received:
    """One command as the vendor received it: argv, env and user (tests scan these for secrets)."""

    argv: list[str]
    env: dict[str, str]
    user: str
    cwd: str


class Process:
    """One process the machine's agent started: pid, streaming output, writable stdin, exit code."""

    def __init__(self, machine: Machine, ident: int, stdin: bool) -> None:
        self.machine = machine
        self.ident = ident
        self.stdin_open = stdin
        self.pid = 0
        self.signal_death = False  # the agent saw a signal end it (its true wait status)
        self.output: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self.begun: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["ev"]
        if kind == "started":
            self.pid = int(event["pid"])
            self.begun.set_result(self.pid)
        elif kind == "error":
            self.begun.set_exception(OSError(event["message"]))
            self.output.put_nowait(None)
        elif kind == "out":
            self.output.put_nowait(("stderr" if event["fd"] == 2 else "stdout", base64.b64decode(event["data"])))
        elif kind == "exit":
            self.signal_death = bool(event["signal"])
            self.output.put_nowait(None)
            if not self.exit_code.done():
                self.exit_code.set_result(int(event["code"]))

    def lost(self) -> None:
        """The machine went away under the process."""
        if not self.begun.done():
            self.begun.set_exception(OSError("the machine is gone"))
        if not self.exit_code.done():
            self.output.put_nowait(None)
            self.exit_code.set_result(-1)

    async def write(self, data: bytes) -> None:
        if not self.stdin_open:
            raise OSError("stdin is closed")
        await self.machine.ask({"op": "stdin", "id": self.ident, "data": base64.b64encode(data).decode()})

    def close_stdin(self) -> None:
        if self.stdin_open:
            self.stdin_open = False
            task = asyncio.ensure_future(self.machine.ask({"op": "close", "id": self.ident}, check=False))
            self.machine.pending.add(task)
            task.add_done_callback(self.machine.pending.discard)

    async def signal(self, signo: int) -> bool:
        """Signal the process itself (its pid, not its group): what the vendors' agents do."""
        if self.exit_code.done() or not self.pid:
            return False
        return await self.machine.ask({"op": "signal", "pid": self.pid, "sig": signo}, check=False)


@dataclass
class Machine:
    """A fake sandbox's VM: one container, its agent, user, home and env."""

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
    _agent: Any = None
    _sock: Any = None
    _by_ident: dict[int, Process] = field(default_factory=dict)
    _acks: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    _next: int = 0
    pending: set[asyncio.Future[bool]] = field(default_factory=set)

    async def boot(self) -> None:
        """Start the agent (one long exec) and read its events."""
        api = self.cloud
        created = await api.call(
            api.api.exec_create,
            self.container,
            ["python3", "-c", AGENT],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            user="0:0",
        )
        self._agent = await api.call(api.api.exec_start, created["Id"], socket=True)
        self._sock = self._agent._sock
        self._sock.settimeout(None)
        self._sock.setblocking(False)
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())
        # Nothing is sent before the agent said it reads: a docker exec may drop stdin written before its process runs.
        await asyncio.wait_for(asyncio.shield(self._ready), 20)

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        buffer, lines = bytearray(), bytearray()
        try:
            while True:
                try:
                    data = await loop.sock_recv(self._sock, 65536)
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
                    if kind != 1:
                        continue  # the agent's own stderr (a crash): nothing a client sees
                    lines += payload
                    while b"\n" in lines:
                        line, _, rest = bytes(lines).partition(b"\n")
                        lines = bytearray(rest)
                        self._dispatch(json.loads(line))
        finally:
            self.running = False
            with contextlib.suppress(Exception):
                self._sock.close()
            with contextlib.suppress(Exception):
                self._agent.close()
            if not self._ready.done():
                self._ready.set_exception(OSError("the agent ended before it was ready"))
            for process in list(self._by_ident.values()):
                process.lost()
            for ack in self._acks.values():
                if not ack.done():
                    ack.set_result(False)

    def _dispatch(self, event: dict[str, Any]) -> None:
        if event["ev"] == "ready":
            if not self._ready.done():
                self._ready.set_result(None)
            return
        if event["ev"] == "ack":
            ack = self._acks.pop(int(event["ref"]), None)
            if ack is not None and not ack.done():
                ack.set_result(bool(event["ok"]))
            return
        process = self._by_ident.get(int(event["id"]))
        if process is None:
            return
        process.on_event(event)
        if event["ev"] == "started":
            self.processes[process.pid] = process
        elif event["ev"] in ("exit", "error"):
            self._by_ident.pop(process.ident, None)
            self.processes.pop(process.pid, None)

    async def _send(self, message: dict[str, Any]) -> None:
        if not self.running:
            raise OSError("the machine is gone")
        data = (json.dumps(message) + "\n").encode()
        await asyncio.get_running_loop().sock_sendall(self._sock, data)

    async def ask(self, message: dict[str, Any], check: bool = True) -> bool:
        self._next += 1
        ref = self._next
        ack: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._acks[ref] = ack
        try:
            await self._send({**message, "ref": ref})
        except OSError:
            self._acks.pop(ref, None)
            if check:
                raise
            return False
        ok = await ack
        if check and not ok:
            raise OSError("the agent refused")
        return ok

    async def start(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        record: bool = True,
    ) -> Process:
        who = user or self.user
        if record:
            self.commands.append(Received(list(argv), dict(env or {}), who, cwd or ""))
        self._next += 1
        process = Process(self, self._next, stdin)
        self._by_ident[process.ident] = process
        message = {
            "op": "start",
            "id": process.ident,
            "argv": list(argv),
            "user": who,
            "cwd": cwd or "",
            "env": {**self.env, **(env or {})},
            "stdin": stdin,
        }
        try:
            await self._send(message)
            await process.begun
        except OSError:
            self._by_ident.pop(process.ident, None)
            raise
        return process

    async def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        record: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        process = await self.start(argv, user=user, stdin=stdin is not None, record=record, env=env, cwd=cwd)
        if stdin is not None:
            await process.write(stdin)
            process.close_stdin()
        out, err = bytearray(), bytearray()
        while (item := await process.output.get()) is not None:
            (err if item[0] == "stderr" else out).extend(item[1])
        return await process.exit_code, bytes(out), bytes(err)

    def close(self) -> None:
        # Cancel the read (its finally closes the socket): closing an fd under a pending sock_recv
        # leaves a stale selector entry that a new socket with the same fd number would inherit.
        self.running = False
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.cancel()


class FakeCloud:
    """Creates, commits and removes the machines of one fake vendor; tracks what it made for cleanup."""

    def __init__(
        self, image: str, user: str, home: str, uid: int = 1000, warm_size: int = 2, recycle: bool = False
    ) -> None:
        import docker  # type: ignore[import-untyped]

        self.api = docker.APIClient(version="auto", timeout=120)
        self.errors = docker.errors
        self.image = image
        self.user = user
        self.home = home
        self.uid = uid
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-cloud")
        self.machines: dict[str, Machine] = {}  # by sandbox id: the machines a client was given
        self._all: dict[str, Machine] = {}  # by container id: every machine made, warm ones too
        self._warm: list[Machine] = []
        self._filling: set[asyncio.Future[None]] = set()
        self.warm_size = warm_size
        self._sweep_orphans()
        self.recycle = recycle  # wipe and pool a destroyed template machine instead of removing its container
        self.images: set[str] = set()
        self._lock = threading.Lock()

    def _sweep_orphans(self) -> None:
        """Remove machines of test processes on this host that died without cleaning up (a SIGTERM skips atexit)."""
        with contextlib.suppress(Exception):
            for found in self.api.containers(all=True, filters={"label": PID_LABEL}):
                pid = int((found.get("Labels") or {}).get(PID_LABEL, "0") or 0)
                if pid <= 0 or pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
                    continue
                with contextlib.suppress(Exception):
                    self.api.remove_container(found["Id"], force=True, v=True)

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def create(
        self,
        *,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        network: bool = True,
        sandbox_id: str | None = None,
    ) -> Machine:
        """A running machine: a warm one of the template when there is one (as vendors boot from pools)."""
        image = image or self.image
        machine = self._warm.pop() if image == self.image and network and self._warm else None
        if machine is None:
            machine = await self._make(image, network)
        if image == self.image and network and self.warm_size:
            self._refill()
        machine.id = sandbox_id or machine.id
        machine.env = dict(env or {})
        with self._lock:
            self.machines[machine.id] = machine
        return machine

    def _refill(self) -> None:
        async def one() -> None:
            with contextlib.suppress(Exception):
                self._warm.append(await self._make(self.image, True))

        while len(self._warm) + len(self._filling) < self.warm_size:
            task = asyncio.ensure_future(one())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)

    async def _make(self, image: str, network: bool) -> Machine:
        host_config = self.api.create_host_config(
            init=True,
            network_mode="none" if not network else None,
            pids_limit=512,
            mem_limit="1g",
            extra_hosts={"host.docker.internal": "host-gateway"} if network else None,
        )
        created = await self.call(
            self.api.create_container,
            image,
            command=["sleep", "infinity"],
            user="0:0",
            labels={FAKE_LABEL: "1", PID_LABEL: str(os.getpid())},
            host_config=host_config,
            tty=False,
        )
        cid = str(created["Id"])
        machine = Machine(self, uuid.uuid4().hex[:20], cid, self.user, self.home, {}, image, network)
        self._all[cid] = machine
        try:
            await self.call(self.api.start, cid)
            await machine.boot()
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
            machine.close()
            self._all.pop(cid, None)
            with contextlib.suppress(Exception):
                await self.call(self.api.remove_container, cid, force=True, v=True)
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
        machine.close()
        await self.call(self.api.stop, machine.container, timeout=1)

    async def restart(self, machine: Machine) -> None:
        await self.call(self.api.start, machine.container)
        machine.running = True
        await machine.boot()

    async def remove(self, machine_id: str) -> bool:
        with self._lock:
            machine = self.machines.pop(machine_id, None)
        if machine is None:
            return False
        if await self._recycle(machine):
            return True
        machine.close()
        self._all.pop(machine.container, None)
        with contextlib.suppress(self.errors.NotFound):
            await self.call(self.api.remove_container, machine.container, force=True, v=True)
        return True

    async def _recycle(self, machine: Machine) -> bool:
        """Wipe a template machine back to fresh and pool it: the user's processes killed, every place it can
        write emptied, its home as ``useradd -m`` made it. Saves a container create and remove per sandbox."""
        if not self.recycle or machine.image != self.image or not machine.network or not machine.running:
            return False
        if len(self._warm) >= self.warm_size + 2:
            return False
        user, home, uid = self.user, self.home, self.uid
        reset = (
            f"pkill -KILL -u {user}; i=0; while pgrep -u {user} >/dev/null && [ $i -lt 60 ]; do sleep 0.05; "
            f"i=$((i+1)); done; pgrep -u {user} >/dev/null && exit 1; "
            f"rm -rf {home} /tmp/* /tmp/.[!.]* /var/tmp/* /var/tmp/.[!.]* /dev/shm/* /dev/shm/.[!.]*; "
            f"mkdir -p {home} && {{ [ ! -d /etc/skel ] || cp -a /etc/skel/. {home}; }} && chown -R {uid}:{uid} {home}"
        )
        try:
            code, _, _ = await asyncio.wait_for(machine.run(["sh", "-c", reset], user="root", record=False), 15)
        except (OSError, TimeoutError):
            return False
        if code != 0:
            return False
        machine.id = uuid.uuid4().hex[:20]
        machine.env = {}
        self._warm.append(machine)
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
            machines, images = list(self._all.values()), list(self.images)
            self.machines.clear()
            self._all.clear()
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
