"""A real `redis-server` a test module owns: its own port and data dir, appendonly on, stopped at the end.

``RedisServer.start()`` runs ``redis-server`` on a free 127.0.0.1 port with ``appendonly yes``
in a temporary directory (nothing of the machine's shared server is touched); ``kill()`` and
``start()`` again restart it on the same port and data, as the durability tests need;
``stop()`` ends it and removes the directory. ``fresh_prefix()`` gives each case its own key
prefix on the server, so cases never see each other's keys.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.require import missing

START_TIMEOUT_S = 20.0
_prefixes = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 (see the module doc); ``fsync`` is its ``appendfsync``."""

    def __init__(self, *, fsync: str = "always") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing("`redis-server` is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
        self.binary = binary
        self.fsync = fsync
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="boxwright-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0, prefix: str | None = None) -> str:
        base = f"redis://127.0.0.1:{self.port}/{db}"
        return base if prefix is None else f"{base}?prefix={prefix}"

    def fresh_prefix(self) -> str:
        return f"t{os.getpid()}-{next(_prefixes)}:"

    def start(self) -> RedisServer:
        # appendfsync always: an acknowledged write is on disk before the reply (the module doc of
        # boxwright.stores.redis says why everysec is weaker); no RDB snapshots, the AOF is the data.
        argv = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (
                    (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    if (self.dir / "redis.log").exists()
                    else ""
                )
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not start: {log}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown save, only what the AOF already holds survives."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every key under ``prefix`` (a case's own keys)."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)
        try:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()


@contextlib.contextmanager
def redis_server(*, fsync: str = "always") -> Iterator[RedisServer]:
    server = RedisServer(fsync=fsync).start()
    try:
        yield server
    finally:
        server.stop()
