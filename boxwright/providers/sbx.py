"""Docker Sandboxes: one hypervisor microVM per sandbox, driven through the ``sbx`` CLI (spec §2.3).

Point by point:

- S1 Needs ``sbx`` on PATH (``binary``), ``sbx login`` and a hypervisor. A missing binary is a
  ``ProviderUnavailableError`` with install help; login text on the stderr of a host command
  (``ls``, ``create``, ``policy``, ``rm``, ``ports``; never ``exec``, whose stderr is the
  command's) becomes login help (``sbx login``, ``--password-stdin`` in CI).
- S2 Capabilities: fs, exec, env, ports, background, durable_filesystem, network_policy true;
  stdin, killable, snapshots, fork false. ``kill()`` runs the recorded-pid script, but nothing has
  measured it against a real microVM, so ``killable_processes`` stays false (seed).
- S3 The name is ``input.id`` or a uuid and must be one path segment. The workspace must be git:
  ``workspace_dir`` containing ``.git``, or a git URL (``git_source``) the provider clones into an
  owned directory under ``clone_root`` (a ``<dir>.owned`` marker beside it); no repo raises; no
  bind-mount fallback.
- S4 ``sbx create --name N --clone --quiet [--cpus] [--memory] [--publish P]... shell <dir>``, then
  the per-sandbox policy, root = ``sbx exec N pwd``, env. On failure the owned clone is removed;
  "already exists" re-raises without ``rm``; else ``sbx rm --force N`` and the original error.
- S5 Policy plan: before create ``sbx policy ls --json``: an Open preset next to a real allowlist
  fails closed; no rows ⇒ ``sbx policy init deny-all``. Nothing set ⇒ the machine preset, except a
  known adapter adds its model host and ``localhost``; ``allow`` ⇒ ``**``; ``deny`` ⇒ model host,
  ``localhost``, ``allow_network`` and the policy's hosts (empty ⇒ raise). JSON may follow a
  banner: it is parsed from the first ``{``/``[`` that decodes.
- S6 exec: ``sbx exec [-w cwd] [-e K=V]... -- N sh -c <cmd>``. The CLI has no other way in for env,
  so env values are on the **host** argv of the ``sbx`` process (visible to local ``ps``); they
  never enter the sandbox command string. spawn streams, pid -1, stdin raises. resume: ``sbx ls
  --json`` by name (a stopped one restarts on the next exec) else ``None``. destroy: ``sbx rm
  --force N`` plus the owned clone. ports: ``sbx ports N --publish P``, then ``--json`` ⇒
  ``http://localhost:<host>``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import (
    AbortError,
    ProviderUnavailableError,
    SandboxCommandError,
    UnsupportedCapabilityError,
)
from ..git_exec import ExecGit
from ..sandbox import (
    Capabilities,
    CreateInput,
    DestroyInput,
    ExecResult,
    NetworkPolicy,
    ProcessOptions,
    ResumeInput,
    SandboxChannel,
    SnapshotRef,
)
from ._posix import HandleEnv, Logger, StdlibLogger
from ._remote import (
    WRAPPER,
    GroupProcess,
    NoStdin,
    RemoteHandle,
    ShellFs,
    SpawnSet,
    TextChannel,
    check_port,
    map_path,
)

NAME = "sbx"
INSTALL_HELP = "install Docker Sandboxes (https://docs.docker.com/ai/sandboxes/) so that `sbx` is on PATH"
LOGIN_HELP = "run `sbx login` (in CI: pipe a token to `sbx login --password-stdin`)"
ADAPTER_HOSTS = {"grok-build": "api.x.ai", "claude-code": "api.anthropic.com", "codex": "api.openai.com"}
_LOGIN = re.compile(r"not (signed|logged) in|sbx login|unauthori[sz]ed|authentication required", re.I)
# D6: the exec process is a session leader in the VM, so the pid it records is its group.


def _capabilities() -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=True,
        background_processes=True,
        writable_stdin=False,  # the CLI's exec does not forward a half-closable stdin
        killable_processes=False,  # the kill script is unmeasured against a real microVM (seed)
        snapshots=False,
        network_policy=True,
        durable_filesystem=True,
        fork=False,
    )


def check_name(name: str) -> str:
    if not name or name in (".", "..") or any(c in name for c in "/\\\x00"):
        raise ValueError(f"an sbx sandbox name must be one path segment, got {name!r}")
    return name


def parse_json(text: str) -> Any:
    """The first JSON value in ``text``: the CLI may print a banner before it."""
    decoder = json.JSONDecoder()
    for index, char in enumerate(text):
        if char in "{[":
            with contextlib.suppress(ValueError):
                return decoder.raw_decode(text[index:])[0]
    raise ValueError(f"no JSON in the sbx output: {text[:200]!r}")


def _rows(value: Any, key: str) -> list[dict[str, Any]]:
    rows = value.get(key, []) if isinstance(value, dict) else value
    return [r for r in rows or [] if isinstance(r, dict)]


class SbxProcess(GroupProcess):
    """``SpawnHandle`` over one ``sbx exec`` child on the host."""

    def __init__(self, handle: SbxHandle, child: asyncio.subprocess.Process, pid_file: str) -> None:
        super().__init__(handle, pid_file)
        self._child = child
        self.stdout = TextChannel()
        self.stderr = TextChannel()
        self.stdin = NoStdin(NAME)
        self.watch(self._pump())

    async def _read(self, stream: asyncio.StreamReader | None, into: TextChannel) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while stream is not None and (chunk := await stream.read(65536)):
                into.feed(decoder.decode(chunk))
            into.feed(decoder.decode(b"", final=True))
        finally:
            into.close()

    async def _pump(self) -> int:
        await asyncio.gather(self._read(self._child.stdout, self.stdout), self._read(self._child.stderr, self.stderr))
        code = await self._child.wait()
        return 128 - code if code < 0 else code

    async def after_kill(self) -> None:
        # The host CLI only detaches when it dies; end it anyway.
        with contextlib.suppress(ProcessLookupError):
            self._child.kill()


class SbxProcesses(SpawnSet[SbxProcess]):
    _handle: SbxHandle

    async def spawn(self, command: str, opts: ProcessOptions | None = None) -> SbxProcess:
        opts = self.started(opts)
        handle = self._handle
        pid_file = (
            f"/dev/shm/.boxwright-spawn-{uuid.uuid4().hex}.pid"  # not in /tmp: a listing of /tmp is not its own record
        )
        env = {**handle.env.get(), **(opts.env or {})}
        cwd = map_path(opts.cwd or "", handle.workspace_root)
        inner = ["sh", "-c", WRAPPER, "boxwright", pid_file, command]
        child = await handle._provider.start_exec(handle.id, inner, env, cwd)
        return self.track(SbxProcess(handle, child, pid_file), opts.signal)


class SbxPorts:
    def __init__(self, handle: SbxHandle) -> None:
        self._handle = handle

    async def connect(self, port: int) -> SandboxChannel:
        check_port(port)
        provider = self._handle._provider
        await provider.host(["ports", self._handle.id, "--publish", str(port)], "ports")
        listed = parse_json((await provider.host(["ports", self._handle.id, "--json"], "ports")).stdout)
        for row in _rows(listed, "ports"):
            if int(row.get("sandbox_port") or row.get("sandboxPort") or 0) == port:
                host_port = row.get("host_port") or row.get("hostPort")
                return SandboxChannel(url=f"http://localhost:{int(host_port or 0)}")
        raise SandboxCommandError("ports", -1, f"sbx did not publish port {port} of {self._handle.id}")


class SbxHandle(RemoteHandle):
    provider = NAME
    _provider: SbxProvider

    def __init__(self, provider: SbxProvider, name: str, root: str, env: Mapping[str, str] | None) -> None:
        self._provider = provider
        self.id = name
        self.workspace_root = root
        self.capabilities = provider.capabilities()
        self.env = HandleEnv(env)
        self.process = SbxProcesses(self)
        self.fs = ShellFs(self.plain, root)
        self.git = ExecGit(self.process)
        self.ports = SbxPorts(self)
        self.destroyed = False

    async def plain(self, line: str) -> ExecResult:
        """A helper command (fs op, kill script): no wrapper, no handle env, from ``/``."""
        child = await self._provider.start_exec(self.id, ["sh", "-c", line], {}, "/")
        out, err = await child.communicate()
        code = child.returncode if child.returncode is not None else -1
        return ExecResult(out.decode(errors="replace"), err.decode(errors="replace"), 128 - code if code < 0 else code)

    async def snapshot(self, label: str | None = None) -> SnapshotRef:
        raise UnsupportedCapabilityError(NAME, "snapshots", "Docker Sandboxes have no snapshots")

    async def fork(self) -> SbxHandle:
        raise UnsupportedCapabilityError(NAME, "fork", "Docker Sandboxes have no fork")


class SbxProvider:
    name = NAME

    def __init__(
        self,
        *,
        binary: str = "sbx",
        workspace_dir: str | None = None,
        clone_root: str | None = None,
        cpus: int | None = None,
        memory: str | None = None,
        publish: Sequence[int] = (),
        allow_network: Sequence[str] = (),
        cli_env: Mapping[str, str] | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.binary = binary
        self.workspace_dir = workspace_dir
        self.clone_root = clone_root or os.path.join(tempfile.gettempdir(), "boxwright-sbx-clones")
        self.cpus = cpus
        self.memory = memory
        self.publish = tuple(publish)
        self.allow_network = tuple(allow_network)
        self.cli_env = dict(cli_env or {})
        self.logger: Logger = logger if logger is not None else StdlibLogger("boxwright.providers.sbx")
        self.restore_snapshot = None

    def capabilities(self) -> Capabilities:
        return _capabilities()

    def instance_identity(self) -> dict[str, object]:
        return {"cpus": self.cpus, "memory": self.memory, "workspace_dir": self.workspace_dir}

    # -- the CLI ---------------------------------------------------------------------------------

    def _argv(self, args: Sequence[str]) -> list[str]:
        found = shutil.which(self.binary)
        if found is None:
            raise ProviderUnavailableError(NAME, f"`{self.binary}` is not on PATH", INSTALL_HELP)
        return [found, *args]

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.cli_env}

    async def host(self, args: Sequence[str], op: str, check: bool = True) -> ExecResult:
        """A host command (never ``exec``): login text on its stderr becomes login help."""
        child = await asyncio.create_subprocess_exec(
            *self._argv(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env()
        )
        out, err = await child.communicate()
        result = ExecResult(out.decode(errors="replace"), err.decode(errors="replace"), child.returncode or 0)
        if result.exit_code != 0 and _LOGIN.search(result.stderr):
            raise ProviderUnavailableError(NAME, f"`sbx {op}` needs a login: {result.stderr.strip()}", LOGIN_HELP)
        if check and result.exit_code != 0:
            raise SandboxCommandError(f"sbx {op}", result.exit_code, result.stderr.strip())
        return result

    async def start_exec(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> asyncio.subprocess.Process:
        args = ["exec"]
        if cwd:
            args += ["-w", cwd]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]  # host argv only (documented): the CLI has no other way in
        args += ["--", name, *argv]
        return await asyncio.create_subprocess_exec(
            *self._argv(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(),
            start_new_session=True,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def _workspace(self, input: CreateInput, name: str) -> tuple[str, bool]:
        """The host git repo to clone into the VM, and whether we made it (an owned clone)."""
        source = getattr(input.workspace, "source", None)
        url = getattr(source, "url", None)
        local = getattr(source, "path", None)
        if isinstance(url, str):
            os.makedirs(self.clone_root, exist_ok=True)
            target = os.path.join(self.clone_root, check_name(name))
            done = subprocess.run(
                ["git", "clone", "--quiet", "--", url, target], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SandboxCommandError("git clone", done.returncode, done.stderr.strip())
            with open(target + ".owned", "w") as marker:
                marker.write("boxwright\n")
            return target, True
        directory = local if isinstance(local, str) else self.workspace_dir
        if not directory or not os.path.isdir(os.path.join(directory, ".git")):
            raise ProviderUnavailableError(
                NAME,
                f"Docker Sandboxes clone a git repository into the VM, and {directory or 'no workspace'!r} is not one",
                "pass sbx_sandbox(workspace_dir=<a directory with .git>) or a git_source(...) workspace",
            )
        return directory, False

    def _remove_clone(self, directory: str, owned: bool) -> None:
        if owned and os.path.exists(directory + ".owned"):
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(directory + ".owned")

    def _rules(self, network: NetworkPolicy | None, adapter: str | None) -> list[tuple[str, str]]:
        model = ADAPTER_HOSTS.get(adapter or "")
        if network is None:
            return [("allow", model), ("allow", "localhost")] if model else []
        if network.mode == "allow":
            return [("allow", "**")]
        hosts = [h for h in (model, "localhost", *self.allow_network, *network.allow_hosts) if h]
        if not [h for h in hosts if h != "localhost"]:
            raise UnsupportedCapabilityError(
                NAME, "network_policy", "a deny policy needs at least one allowed host (allow_network=...)"
            )
        return [("allow", h) for h in dict.fromkeys(hosts)]

    async def _check_policy(self) -> None:
        listed = parse_json((await self.host(["policy", "ls", "--json"], "policy")).stdout)
        rows = _rows(listed, "policies")
        if not rows:
            init = await self.host(["policy", "init", "deny-all"], "policy", check=False)
            if init.exit_code != 0 and "already initialized" not in init.stderr:
                raise SandboxCommandError("sbx policy init", init.exit_code, init.stderr.strip())
            return
        presets = {str(r.get("preset", "")).lower() for r in rows}
        allows = [r for r in rows if r.get("action") == "allow" and r.get("resource")]
        if "open" in presets and allows:
            raise ProviderUnavailableError(
                NAME,
                "the machine policy is the Open preset next to an allowlist: which one wins is unclear, so boxwright "
                "fails closed",
                "run `sbx policy reset` and choose a preset",
            )

    async def create(self, input: CreateInput | None = None) -> SbxHandle:
        input = input or CreateInput()
        signal = input.signal
        if signal is not None:
            signal.throw_if_aborted()
        name = check_name(input.id or f"bw-{uuid.uuid4().hex[:12]}")
        rules = self._rules(input.network, input.adapter_name)
        directory, owned = self._workspace(input, name)
        made = False
        try:
            await self._check_policy()
            args = ["create", "--name", name, "--clone", "--quiet"]
            if self.cpus:
                args += ["--cpus", str(self.cpus)]
            if self.memory:
                args += ["--memory", self.memory]
            for port in self.publish:
                args += ["--publish", str(port)]
            # S4: once `sbx create` ran, its VM may exist even when it failed (a boot timeout) or when we
            # were cancelled (the CLI child keeps running): remove it, unless the name was another's.
            creating = asyncio.ensure_future(self.host([*args, "shell", directory], "create", check=False))
            made = True
            try:
                result = await asyncio.shield(creating)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await creating  # let the CLI end, so the rm below finds what it made
                raise
            if result.exit_code != 0:
                if "already exists" in result.stderr:
                    made = False  # a sandbox of that name that is not ours: never remove it
                raise SandboxCommandError("sbx create", result.exit_code, result.stderr.strip())
            for action, host in rules:
                await self.host(["policy", action, "network", "--sandbox", name, host], "policy")
            if signal is not None:
                signal.throw_if_aborted()
            probe = await self.start_exec(name, ["pwd"], {}, None)
            out, err = await probe.communicate()
            if probe.returncode != 0:
                raise SandboxCommandError("sbx exec pwd", probe.returncode or -1, err.decode(errors="replace"))
            handle = SbxHandle(self, name, out.decode().strip() or "/", input.env)
            if signal is not None and signal.aborted:
                raise AbortError(signal.reason)
            return handle
        except BaseException:
            self._remove_clone(directory, owned)
            if made:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.destroy(DestroyInput(id=name)))
            raise

    async def resume(self, input: ResumeInput) -> SbxHandle | None:
        listed = parse_json((await self.host(["ls", "--json"], "ls")).stdout)
        if not any(r.get("name") == input.id for r in _rows(listed, "sandboxes")):
            return None
        probe = await self.start_exec(input.id, ["pwd"], {}, None)  # a stopped one starts on exec
        out, _err = await probe.communicate()
        if probe.returncode != 0:
            return None
        return SbxHandle(self, input.id, out.decode().strip() or "/", None)

    async def destroy(self, input: DestroyInput) -> None:
        name = check_name(input.id)
        result = await self.host(["rm", "--force", name], "rm", check=False)
        if result.exit_code != 0 and not re.search(r"not found|no such sandbox", result.stderr, re.I):
            raise SandboxCommandError("sbx rm", result.exit_code, result.stderr.strip())
        self._remove_clone(os.path.join(self.clone_root, name), True)


def sbx_sandbox(
    *,
    binary: str = "sbx",
    workspace_dir: str | None = None,
    clone_root: str | None = None,
    cpus: int | None = None,
    memory: str | None = None,
    publish: Sequence[int] = (),
    allow_network: Sequence[str] = (),
    cli_env: Mapping[str, str] | None = None,
    logger: Logger | None = None,
) -> SbxProvider:
    """A provider whose sandboxes are Docker Sandboxes microVMs (``sbx create --clone``).

    ``workspace_dir`` is the host git repository each sandbox clones (a ``git_source``
    workspace is cloned by the provider instead); ``allow_network`` adds hosts to a
    deny policy's allowlist. Env values reach the ``sbx`` CLI as ``-e K=V`` arguments.
    """
    return SbxProvider(
        binary=binary,
        workspace_dir=workspace_dir,
        clone_root=clone_root,
        cpus=cpus,
        memory=memory,
        publish=publish,
        allow_network=allow_network,
        cli_env=cli_env,
        logger=logger,
    )
