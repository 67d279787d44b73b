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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from ..docker import session_labels
from .agent import SOURCE as AGENT

FAKE_LABEL = "boxwright.fake-cloud"
# The test process that made a machine: a machine whose process is gone (killed before its atexit) is swept.
PID_LABEL = "boxwright.fake-cloud.pid"
# The one FakeCloud that made a machine: its cleanup finds by this label what a cancelled make never recorded.
INSTANCE_LABEL = "boxwright.fake-cloud.instance"
# How long a drain or a cleanup waits for the warm machines being made (a container create and boot).
DRAIN_WITHIN = 60.0
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
        self.instance = uuid.uuid4().hex
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, where machines are made and pooled
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
        self._loop = asyncio.get_running_loop()
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
            # The test and session labels: the session-end leak check (tests/conftest.py) sees a machine
            # this fake failed to remove, and a dead worker's machines are swept by its session's label.
            labels={FAKE_LABEL: "1", PID_LABEL: str(os.getpid()), INSTANCE_LABEL: self.instance, **session_labels()},
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

    def drain(self) -> None:
        """Remove the idle warm machines (blocking; from the test thread), once those being made are made.

        A test module's end: no machine idles in the pool while other modules run (the next create
        boots one again). Runs on the server's loop, which owns the pool.
        """
        loop = self._loop
        if loop is None or not loop.is_running():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._drain(), loop).result(DRAIN_WITHIN + 30)

    async def _drain(self) -> None:
        if self._filling:
            await asyncio.wait(set(self._filling), timeout=DRAIN_WITHIN)
        warm, self._warm = self._warm, []
        for machine in warm:
            machine.close()
            self._all.pop(machine.container, None)

        async def remove(machine: Machine) -> None:
            with contextlib.suppress(Exception):
                await self.call(self.api.remove_container, machine.container, force=True, v=True)

        await asyncio.gather(*(remove(m) for m in warm))

    def cleanup(self) -> list[str]:
        """Remove every container and image this fake made (blocking; from the test thread, its server stopped).

        Returns the sandboxes a client was given and never destroyed: a test's leak, for the leak check.
        """
        # A Docker call still running (a warm machine's create, whose task the server's end cancelled)
        # ends first; no new one starts. What it made is found by this fake's label below.
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            containers = {machine.container for machine in self._all.values()}
            images = list(self.images)
            given = [f"{sandbox} (container {machine.container[:12]})" for sandbox, machine in self.machines.items()]
            self.machines.clear()
            self._all.clear()
            self._warm.clear()
            self.images.clear()
        with contextlib.suppress(Exception):
            found = self.api.containers(all=True, quiet=True, filters={"label": f"{INSTANCE_LABEL}={self.instance}"})
            containers |= {str(row["Id"]) for row in found}
        for container in containers:
            with contextlib.suppress(Exception):
                self.api.remove_container(container, force=True, v=True)
        for ref in images:
            with contextlib.suppress(Exception):
                self.api.remove_image(ref, force=True)
        return given


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


class FakeService:
    """What every fake cloud shares: its server's start and stop, and the command log tests scan.

    A fake sets ``cloud``, ``server`` and ``_gone`` (the destroyed machines, whose commands are
    still scanned for secrets) and, where the cloud's own list is not the live one, ``machines()``.
    """

    cloud: FakeCloud
    server: ServerThread
    _gone: list[Machine]

    def start(self) -> Self:
        self.server.start()
        return self

    def close(self) -> list[str]:
        """Stop the server, remove all the fake made; the sandboxes never destroyed (``FakeCloud.cleanup``)."""
        self.server.stop()
        return self.cloud.cleanup()

    def machines(self) -> list[Machine]:
        return list(self.cloud.machines.values())

    def commands(self) -> list[str]:
        """Every command line the sandboxes were asked to run, across all of them (gone ones too)."""
        return [" ".join(c.argv) for m in self.machines() + self._gone for c in m.commands]


Proxy = Callable[[dict[str, Any], Any, Any, str, dict[str, str]], Awaitable[None]]


def vendor_front(
    api: Any, domain: str, proxy: Proxy, requests: list[tuple[str, str]], *, query: bool = True
) -> Callable[[dict[str, Any], Any, Any], Awaitable[None]]:
    """The ASGI app in front of a fake's API: ``Host: <x>.<domain>`` (port dropped) goes to ``proxy``
    (preview traffic), the rest is recorded in ``requests`` (method, path and, with ``query``,
    its query: tests scan these for secrets) and served by ``api``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        host = headers.get("host", "").split(":")[0]
        if scope["type"] == "http" and host.endswith("." + domain):
            await proxy(scope, receive, send, host, headers)
            return
        if scope["type"] in ("http", "websocket"):
            text = scope.get("query_string", b"").decode() if query else ""
            requests.append((scope.get("method", "WS"), scope["path"] + ("?" + text if text else "")))
        await api(scope, receive, send)

    return app


# Not forwarded either way: they describe one hop, not the request (RFC 9110 §7.6.1), and the
# fake's Host is the vendor's public name, not the machine's.
_HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"content-length"}


async def forward(scope: dict[str, Any], receive: Any, send: Any, url: str) -> None:
    """Proxy one HTTP request to ``url`` (a machine's port) as a vendor's edge does: method, path, query,
    headers and body go through; the response streams back as it comes (an NDJSON run stream, a long poll)
    and the upstream request ends when the client hangs up."""
    import httpx

    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    query = scope.get("query_string", b"").decode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), trust_env=False) as client:
        request = client.build_request(
            scope["method"], url + (f"?{query}" if query else ""), headers=headers, content=bytes(body)
        )
        try:
            upstream = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            payload = json.dumps({"message": f"the port is not open: {type(exc).__name__}: {exc}"}).encode()
            await send(
                {"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": payload})
            return

        async def pump() -> None:
            out = [(k, v) for k, v in upstream.headers.raw if k.lower() not in _HOP]
            await send({"type": "http.response.start", "status": upstream.status_code, "headers": out})
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async def hung_up() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(hung_up())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await upstream.aclose()


async def machine_address(machine: Machine) -> str:
    """The machine's address on the Docker bridge: where the vendor's edge dials its ports."""
    info = await machine.cloud.call(machine.cloud.api.inspect_container, machine.container)
    return str((info.get("NetworkSettings") or {}).get("IPAddress") or "")


class VendorEdge:
    """The vendors' public edge for the host: HTTPS on their domains, without public DNS.

    A client that reaches a vendor's preview URL (``https://8080-<id>.e2b.fake``) as a real one
    would, over TLS with the name checked, points ``HTTPS_PROXY`` here and trusts ``ca_file``
    (``SSL_CERT_FILE``): this CONNECT proxy terminates TLS for every domain in ``routes`` (a
    certificate its own CA signed) and pipes the plain HTTP inside to that vendor's fake server,
    which routes it by its ``Host`` as the vendor's proxy does. Nothing of the fakes' own API goes
    through here (those are ``http://127.0.0.1``).
    """

    def __init__(self, routes: Mapping[str, int], directory: str) -> None:
        self.routes = dict(routes)  # domain -> the port of the fake server on 127.0.0.1 that serves it
        self.ca_file, cert, key = _certificates(list(self.routes), directory)
        import ssl

        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.tunnels: list[str] = []  # the names clients asked to CONNECT to, in order
        self.thread = threading.Thread(target=self._loop.run_forever, name="vendor-edge", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VendorEdge:
        self.thread.start()

        async def serve() -> None:
            self._server = await asyncio.start_server(self._connection, sock=self._sock)

        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            name = target.rpartition(":")[0]
            port = next((p for domain, p in self.routes.items() if name.endswith("." + domain)), None)
            if method != "CONNECT" or port is None:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                return
            self.tunnels.append(name)
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._tls)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._conns.discard(task)
            for end in (writer, upstream):
                if end is not None:
                    with contextlib.suppress(Exception):
                        end.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:
        with contextlib.suppress(Exception):
            if sink.can_write_eof():
                sink.write_eof()
            else:
                sink.close()


def _certificates(domains: Sequence[str], directory: str) -> tuple[str, str, str]:
    """(CA file, leaf cert file, leaf key file): a throwaway CA and a leaf for ``*.<domain>`` of each domain."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "boxwright fake vendor edge CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domains[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{d}") for d in domains]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(directory, name) for name in ("edge-ca.pem", "edge-cert.pem", "edge-key.pem"))
    pem = serialization.Encoding.PEM
    with open(paths[0], "wb") as out:
        out.write(ca.public_bytes(pem))
    with open(paths[1], "wb") as out:
        out.write(leaf.public_bytes(pem))
    with open(paths[2], "wb") as out:
        out.write(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths[0], paths[1], paths[2]
