"""A fake Docker Sandboxes daemon behind the fake ``sbx`` CLI (tests/support/fake_cloud/sbx).

Follows the ``sbx`` CLI reference (docs.docker.com/reference/cli/sbx, v0.42): the commands
and flags are the documented ones; the JSON shapes are this fake's reading of them (the
reference gives no schema), and the provider parses them leniently:

- ``create --name N --clone --quiet [--cpus C] [--memory M] [--publish P]... shell <dir>``: a
  microVM (here a container of the base image, user ``agent``) with a copy of the host git repo
  ``<dir>`` at the same path; "already exists" for a name in use; no ``.git`` is refused.
- ``exec [-w DIR] [-e K=V]... -- N <argv>``: runs ``argv`` as ``agent`` (default cwd the workspace),
  a stopped sandbox starts first; output streams; the exit code is the command's.
- ``ls --json`` -> ``{"sandboxes": [{name, agent, status, ports, workspace}]}``; ``rm --force N``
  ("not found" for a missing one); ``stop N``; ``ports N --publish P`` (an ephemeral 127.0.0.1
  port forwarded to the VM's port) and ``ports N --json`` -> ``{"ports": [{host_ip, host_port,
  sandbox_port, protocol}]}``; ``policy ls --json`` -> ``{"policies": [...]}``, ``policy init
  deny-all`` ("already initialized"), ``policy allow|deny network --sandbox N <host>``.
- Not signed in (``logged_in = False``): host commands (not ``exec``) fail with login text.
- ``create_fails_after_making`` / ``create_delay``: a create whose VM exists but that fails or answers late.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import sys
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from .backend import FakeCloud, FakeService, Machine, ServerThread

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.path.join(HERE, "sbx")
URL_ENV = "BOXWRIGHT_FAKE_SBX_URL"
HOST_COMMANDS = ("ls", "create", "policy", "rm", "ports", "stop")


@dataclass
class Vm:
    name: str
    machine: Machine
    workspace: str
    status: str = "running"
    ports: dict[int, int] = field(default_factory=dict)
    servers: list[asyncio.AbstractServer] = field(default_factory=list)
    rules: list[tuple[str, str]] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)


class FakeSbxDaemon(FakeService):
    def __init__(self, image: str) -> None:
        self.cloud = FakeCloud(image, "agent", "/home/agent")
        self.vms: dict[str, Vm] = {}
        self.policies: list[dict[str, str]] = []
        self.logged_in = True
        # A create that made its VM and then fails (the VM's boot timed out) or takes this long to answer:
        # the VM is there either way, as with sbx's daemon, which a dropped or killed CLI does not stop.
        self.create_fails_after_making = False
        self.create_delay = 0.0
        self.invocations: list[list[str]] = []  # every argv the CLI was run with (host side)
        self._gone: list[Machine] = []
        self.server = ServerThread(Starlette(routes=[Route("/run", self.run, methods=["POST"])]))

    @property
    def env(self) -> dict[str, str]:
        return {URL_ENV: self.server.url, "BOXWRIGHT_FAKE_SBX_PYTHON": sys.executable}

    def machines(self) -> list[Machine]:
        return [v.machine for v in list(self.vms.values())]

    async def run(self, request: Request) -> StreamingResponse:
        argv = [str(a) for a in (await request.json())["argv"]]
        self.invocations.append(argv)

        async def answer() -> AsyncIterator[str]:
            verb = argv[0] if argv else ""
            if verb in HOST_COMMANDS and not self.logged_in:
                yield _out(2, b"Error: you are not signed in. Run 'sbx login' to sign in.\n")
                yield json.dumps({"exit": 1}) + "\n"
                return
            if verb == "exec":
                async for line in self._exec(argv[1:]):
                    yield line
                return
            try:
                code, out, err = await self._host(verb, argv[1:])
            except Exception as exc:  # a fake bug shows as a CLI error
                code, out, err = 1, b"", f"Error: {exc!r}\n".encode()
            if out:
                yield _out(1, out)
            if err:
                yield _out(2, err)
            yield json.dumps({"exit": code}) + "\n"

        return StreamingResponse(answer(), media_type="application/x-ndjson")

    async def _host(self, verb: str, args: list[str]) -> tuple[int, bytes, bytes]:
        if verb == "create":
            return await self._create(args)
        if verb == "ls":
            rows = [
                {"name": v.name, "agent": "shell", "status": v.status, "ports": list(v.ports), "workspace": v.workspace}
                for v in self.vms.values()
            ]
            return 0, ("sbx v0.42.0-fake\n" + json.dumps({"sandboxes": rows})).encode(), b""
        if verb == "rm":
            names = [a for a in args if not a.startswith("-")]
            for name in names:
                vm = self.vms.pop(name, None)
                if vm is None:
                    return 1, b"", f"Error: sandbox {name!r} not found\n".encode()
                for server in vm.servers:
                    server.close()
                self._gone.append(vm.machine)
                await self.cloud.remove(vm.machine.id)
            return 0, b"", b""
        if verb == "stop":
            for name in args:
                vm = self.vms[name]
                await self.cloud.stop(vm.machine)
                vm.status = "stopped"
            return 0, b"", b""
        if verb == "ports":
            return await self._ports(args)
        if verb == "policy":
            return self._policy(args)
        return 1, b"", f"Error: unknown command {verb!r}\n".encode()

    async def _create(self, args: list[str]) -> tuple[int, bytes, bytes]:
        name, publish, rest = "", [], []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg in ("--name", "--cpus", "--memory", "--publish"):
                if arg == "--name":
                    name = args[i + 1]
                elif arg == "--publish":
                    publish.append(int(args[i + 1]))
                i += 2
                continue
            if not arg.startswith("-"):
                rest.append(arg)
            i += 1
        if "--clone" not in args or len(rest) != 2 or rest[0] != "shell":
            return 1, b"", b"Error: usage: sbx create --name NAME --clone shell PATH\n"
        directory = rest[1]
        if name in self.vms:
            return 1, b"", f"Error: sandbox {name!r} already exists\n".encode()
        if not os.path.isdir(os.path.join(directory, ".git")):
            return 1, b"", f"Error: --clone needs a git repository: {directory}\n".encode()
        machine = await self.cloud.create(sandbox_id=name)
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as archive:
            archive.add(directory, arcname=os.path.basename(directory.rstrip("/")))
        parent = os.path.dirname(directory.rstrip("/")) or "/"
        code, _, err = await machine.run(["mkdir", "-p", parent], user="root", record=False)
        ok = await self.cloud.call(self.cloud.api.put_archive, machine.container, parent, tar.getvalue())
        # The workspace (and the directory it sits in) belongs to the sandbox's user, as on sbx.
        code, _, err = await machine.run(["chown", "-R", "agent:agent", parent], user="root", record=False)
        if not ok or code != 0:
            return 1, b"", b"Error: could not clone the workspace: " + err
        vm = Vm(name, machine, directory)
        self.vms[name] = vm
        for port in publish:
            await self._publish(vm, port)
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        if self.create_fails_after_making:
            return 1, b"", f"Error: timed out waiting for sandbox {name!r} to start\n".encode()
        return 0, b"", b""

    async def _publish(self, vm: Vm, port: int) -> int:
        if port in vm.ports:
            return vm.ports[port]
        info = await self.cloud.call(self.cloud.api.inspect_container, vm.machine.container)
        address = (info.get("NetworkSettings") or {}).get("IPAddress")

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(address, port)
            except OSError:
                writer.close()
                return

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(Exception):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                with contextlib.suppress(Exception):
                    dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        server = await asyncio.start_server(forward, "127.0.0.1", 0)
        vm.servers.append(server)
        vm.ports[port] = server.sockets[0].getsockname()[1]
        return vm.ports[port]

    async def _ports(self, args: list[str]) -> tuple[int, bytes, bytes]:
        vm = self.vms.get(args[0]) if args else None
        if vm is None:
            return 1, b"", b"Error: sandbox not found\n"
        if "--publish" in args:
            spec = args[args.index("--publish") + 1]
            await self._publish(vm, int(spec.rpartition(":")[2].partition("/")[0]))
            return 0, b"", b""
        rows = [
            {"host_ip": "127.0.0.1", "host_port": host, "sandbox_port": inner, "protocol": "tcp4"}
            for inner, host in vm.ports.items()
        ]
        return 0, json.dumps({"ports": rows}).encode(), b""

    def _policy(self, args: list[str]) -> tuple[int, bytes, bytes]:
        if args[:1] == ["ls"]:
            return 0, json.dumps({"policies": self.policies}).encode(), b""
        if args[:1] == ["init"]:
            if self.policies:
                return 1, b"", b"Error: policy already initialized\n"
            self.policies.append({"preset": args[1], "action": "", "resource": ""})
            return 0, b"", b""
        if args[:1] in (["allow"], ["deny"]) and args[1:2] == ["network"] and "--sandbox" in args:
            name = args[args.index("--sandbox") + 1]
            host = args[-1]
            self.vms[name].rules.append((args[0], host))
            return 0, b"", b""
        return 1, b"", b"Error: unknown policy command\n"

    async def _exec(self, args: list[str]) -> AsyncIterator[str]:
        cwd, env = "", {}
        i = 0
        while i < len(args) and args[i] != "--":
            if args[i] == "-w":
                cwd = args[i + 1]
            elif args[i] == "-e":
                key, _, value = args[i + 1].partition("=")
                env[key] = value
            i += 2
        name, argv = args[i + 1], args[i + 2 :]
        vm = self.vms.get(name)
        if vm is None:
            yield _out(2, f"Error: sandbox {name!r} not found\n".encode())
            yield json.dumps({"exit": 1}) + "\n"
            return
        if vm.status == "stopped":  # a stopped sandbox starts again on the next exec
            await self.cloud.restart(vm.machine)
            vm.status = "running"
        vm.argv = argv
        try:
            process = await vm.machine.start(argv, env=env, cwd=cwd or vm.workspace)
        except OSError as exc:
            yield _out(2, f"Error: {exc}\n".encode())
            yield json.dumps({"exit": 126}) + "\n"
            return
        while (item := await process.output.get()) is not None:
            yield _out(2 if item[0] == "stderr" else 1, item[1])
        yield json.dumps({"exit": await process.exit_code}) + "\n"


def _out(fd: int, data: bytes) -> str:
    return json.dumps({"fd": fd, "data": base64.b64encode(data).decode()}) + "\n"


def fake_repo(root: str) -> str:
    """A small host git repository for ``sbx create --clone``."""
    import subprocess

    path = os.path.join(root, "repo")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("fake sbx workspace\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=path, env=env, check=True, capture_output=True)
    return path
