"""An agent that prints every secret it can reach, against a real ``boxwright serve`` on a password Redis.

The agent (the command harness in a local-process sandbox) prints its env (its bridge token among
it), then walks its parent processes and prints their command lines and ``BOXWRIGHT_*`` env: the
coordinator's ``--store redis://:PASSWORD@...``, its client and admin tokens. None of those values
may reach the event log (the Redis AOF, read as bytes), the run record, the SSE tail, or the
coordinator's log, whether the run completes or a callback is refused.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import httpx

from tests.support.coordinator import ADMIN_TOKEN, CLIENT_TOKEN, CoordinatorProcess, sse_events, trigger
from tests.support.redis_server import RedisServer

PASSWORD = "redis-pw-" + secrets.token_hex(12)

AGENT = r"""
echo "bridge token: $BOXWRIGHT_BRIDGE_TOKEN"
printf %s "$BOXWRIGHT_BRIDGE_TOKEN" > {leak}
env
p=$$
while [ "$p" -gt 1 ]; do
  tr '\0' ' ' < /proc/$p/cmdline; echo
  tr '\0' '\n' < /proc/$p/environ | grep BOXWRIGHT_
  p=$(awk '{{print $4}}' /proc/$p/stat)
done
curl -s -X POST -H "Authorization: Bearer $BOXWRIGHT_BRIDGE_TOKEN" -H 'Content-Type: application/json' \
  --data '{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"nope","arguments":{{}}}}}}' \
  "$BOXWRIGHT_BRIDGE_URL" || true
echo done
"""


def _require_password(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        value = PASSWORD.encode()
        sock.sendall(b"*4\r\n$6\r\nCONFIG\r\n$3\r\nSET\r\n$11\r\nrequirepass\r\n$%d\r\n%s\r\n" % (len(value), value))
        assert sock.recv(64).startswith(b"+OK")


def test_no_secret_the_agent_prints_reaches_the_log_the_record_the_tail_or_the_coordinators_log(
    tmp_path: Path,
) -> None:
    redis = RedisServer().start()
    try:
        _require_password(redis.port)
        store = f"redis://:{PASSWORD}@127.0.0.1:{redis.port}/0?prefix=attack:"
        leak = tmp_path / "bridge-token"
        agent = AGENT.format(leak=leak)
        process = CoordinatorProcess("secrets", tmp_path, agent, store=store)
        try:
            body = trigger("t-leak", "print everything", "r-leak", harness="bridge-env")
            assert process.post("/runs", body).status_code == 202
            frames = sse_events(process.url, "r-leak", "t-leak")
            assert frames[-1][0] == "status" and "completed" in frames[-1][2], frames[-3:]
            tail = "\n".join(data for _, _, data in frames)
            record = process.get("/runs/r-leak?threadId=t-leak").text
            refused = httpx.get(f"{process.url}/runs/r-leak", params={"threadId": "t-leak", "ticket": PASSWORD})
            assert refused.status_code == 403
            assert "done" in tail and "BOXWRIGHT_CLIENT_TOKEN" in tail, "the agent did print its findings"
            bridge_token = leak.read_text()
            assert len(bridge_token) >= 32
            stderr = process.stderr()
        finally:
            process.close()
        stored = b"".join(p.read_bytes() for p in redis.dir.rglob("*") if p.is_file() and "aof" in p.name)
        assert b"r-leak" in stored, "the AOF holds the run"
        leaked: dict[str, list[str]] = {}
        for name, value in [
            ("bridge token", bridge_token),
            ("redis password", PASSWORD),
            ("client token", CLIENT_TOKEN),
            ("admin token", ADMIN_TOKEN),
        ]:
            where = [
                place
                for place, text in [("tail", tail), ("record", record), ("coordinator log", stderr)]
                if value in text
            ]
            if value.encode() in stored:
                where.append("redis")
            if where:
                leaked[name] = where
        assert not leaked, f"secrets reached: {leaked}"
    finally:
        redis.stop()
