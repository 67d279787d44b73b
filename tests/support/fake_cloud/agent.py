"""The in-VM agent of a fake machine (what envd or Daytona's daemon is on the vendor's VM).

Runs as root inside the container (``python3 -c``, one long ``docker exec``) and speaks
JSON lines on its stdin/stdout: ``start`` (argv, env, cwd, user, stdin) answers ``started``
with the real pid, then ``out`` chunks (fd 1/2, base64) and one ``exit`` (code, and whether
a signal ended it: the agent sees the true wait status); ``stdin``/``close`` feed the
process; ``signal`` signals one pid (not its group), as the vendors' agents do. A process
starts as a session leader, as ``docker exec`` (and envd's process runner) start theirs.

Starting a process costs a fork here instead of a ``docker exec`` round trip: the
conformance suites run hundreds of commands per provider.
"""

SOURCE = r"""
import base64, json, os, pwd, subprocess, sys, threading
out_lock = threading.Lock()
procs = {}
def send(msg):
    data = (json.dumps(msg) + "\n").encode()
    with out_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
def pump(pid_id, stream, fd, done):
    try:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            send({"ev": "out", "id": pid_id, "fd": fd, "data": base64.b64encode(chunk).decode()})
    finally:
        done.release()
def watch(pid_id, proc, done):
    code = proc.wait()
    done.acquire(); done.acquire()
    procs.pop(pid_id, None)
    send({"ev": "exit", "id": pid_id, "code": 128 - code if code < 0 else code, "signal": code < 0})
def start(msg):
    who = pwd.getpwnam(msg["user"])
    cwd = msg["cwd"] or who.pw_dir
    if not os.path.isdir(cwd):
        send({"ev": "error", "id": msg["id"], "message": "chdir " + cwd + ": no such file or directory"})
        return
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": who.pw_dir,
           "USER": who.pw_name, "LOGNAME": who.pw_name, **msg["env"]}
    try:
        proc = subprocess.Popen(msg["argv"], cwd=cwd, env=env, user=who.pw_uid, group=who.pw_gid, extra_groups=[],
                                stdin=subprocess.PIPE if msg["stdin"] else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        send({"ev": "error", "id": msg["id"], "message": str(exc)})
        return
    procs[msg["id"]] = proc
    send({"ev": "started", "id": msg["id"], "pid": proc.pid})
    done = threading.Semaphore(0)
    for stream, fd in ((proc.stdout, 1), (proc.stderr, 2)):
        threading.Thread(target=pump, args=(msg["id"], stream, fd, done), daemon=True).start()
    threading.Thread(target=watch, args=(msg["id"], proc, done), daemon=True).start()
send({"ev": "ready"})
for line in sys.stdin.buffer:
    msg = json.loads(line)
    op = msg["op"]
    if op == "start":
        start(msg)
    elif op in ("stdin", "close"):
        proc = procs.get(msg["id"])
        try:
            if proc is None or proc.stdin is None:
                raise OSError("stdin is closed")
            if op == "stdin":
                proc.stdin.write(base64.b64decode(msg["data"]))
                proc.stdin.flush()
            else:
                proc.stdin.close()
            send({"ev": "ack", "ref": msg["ref"], "ok": True})
        except (OSError, ValueError) as exc:
            send({"ev": "ack", "ref": msg["ref"], "ok": False, "message": str(exc)})
    elif op == "signal":
        try:
            os.kill(msg["pid"], msg["sig"])
            ok = True
        except OSError:
            ok = False
        send({"ev": "ack", "ref": msg["ref"], "ok": ok})
"""
