"""The setup plan and the one persistent ``sh`` that runs it, so ``cd`` and ``export`` carry over.

A plan is a list of ``Serial`` steps and ``Parallel`` groups (R3). Serial steps
run in the shell; a parallel group forks the shell's ``pwd`` and exports and
runs each command at once through ``process.exec`` (R17).

Each step goes to the shell's stdin as ``{ <step> } 2>&1`` followed by a line
``__BSSH_<n>__ <exit>``; everything printed before that sentinel is the step's
merged output. A step is ``eval``-ed after a ``sh -n`` syntax check: a typo
then fails that step (exit 2) instead of killing the shell, and an unbalanced
quote cannot swallow the sentinel. Steps read ``/dev/null``, never our pipe.

Two terminators besides the sentinel: the shell's stdout ending (the shell
died, or a step closed it) raises at once, and a per-step deadline catches a
shell that lives but never answers. Providers without writable stdin get
``ExecShell``, which runs each step as its own ``exec`` and threads the
resulting ``pwd`` and ``export -p`` into the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import msgspec

from .abort import AbortController, AbortSignal
from .errors import AbortError, BootstrapShellError, SetupStepError
from .sandbox import WORKSPACE, ExecResult, ProcessOptions, SandboxHandle, SandboxProcesses, SpawnHandle
from .secrets import redact
from .shell import quote

STEP_TIMEOUT = 30 * 60.0
TAIL_CHARS = 1500
# Past this much unanswered output the front is dropped: only the tail is ever reported.
_BUFFER_CAP = 1 << 20
# How long a dead shell's last bytes may take to arrive before its death is reported.
_EXIT_GRACE = 0.5
_STATE_MARKER = "__BSSH_STATE__"


class StepResult(NamedTuple):
    exit_code: int
    output: str


class ShellState(NamedTuple):
    cwd: str
    env: dict[str, str]


class SetupShell(Protocol):
    async def run(self, command: str) -> StepResult: ...
    async def fork_state(self) -> ShellState: ...
    async def dispose(self) -> None: ...


# -- setup plan --------------------------------------------------------------------------------------


class Serial(msgspec.Struct, frozen=True, tag="serial", tag_field="kind"):
    command: str


class Parallel(msgspec.Struct, frozen=True, tag="parallel", tag_field="kind"):
    commands: tuple[str, ...]


SetupGroup = Serial | Parallel


class SetupBuilder:
    """What a setup callback receives: ``serial(cmd)`` and ``parallel([cmds])`` append groups in call order."""

    def __init__(self) -> None:
        self.groups: list[SetupGroup] = []

    def serial(self, command: str) -> None:
        self.groups.append(Serial(_command(command)))

    def parallel(self, commands: Sequence[str]) -> None:
        if isinstance(commands, str) or not isinstance(commands, Iterable):
            raise TypeError(f"parallel() takes a list of commands, got {type(commands).__name__}")
        group = tuple(_command(c) for c in commands)
        if not group:
            raise ValueError("parallel() needs at least one command")
        self.groups.append(Parallel(group))


SetupCallback = Callable[[SetupBuilder], None]


def _command(command: object) -> str:
    if not isinstance(command, str) or not command.strip():
        raise TypeError(f"a setup command must be a non-empty string, got {command!r}")
    if "\x00" in command:
        raise ValueError(f"a setup command cannot contain a NUL byte: {command!r}")
    return command


def build_setup_plan(setup: Sequence[str] | SetupCallback | None) -> list[SetupGroup]:
    """``None`` -> ``[]``; a list -> one ``Serial`` each; a callback runs once and records its groups (R3)."""
    if setup is None:
        return []
    if callable(setup):
        builder = SetupBuilder()
        result: object = setup(builder)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("the setup callback must be a plain function; it only records steps")
        return builder.groups
    if isinstance(setup, str):
        raise TypeError("setup takes a list of commands (or a callback), not one string")
    return [Serial(_command(c)) for c in setup]


def tail(text: str) -> str:
    """The last ``TAIL_CHARS`` of ``text``, secret values masked first so no fragment of one survives the cut."""
    return redact(text).strip()[-TAIL_CHARS:]


def sandbox_path(workspace_root: str, path: str) -> str:
    """A path ``pwd`` printed, as the sandbox names it: local-process prints its host dir for ``/workspace``."""
    root = workspace_root.rstrip("/")
    if root and root != WORKSPACE and (path == root or path.startswith(root + "/")):
        return WORKSPACE + path[len(root) :]
    return path


def step_script(command: str) -> str:
    q = quote(command)
    return (
        f"if __bssh_err=$(command -p sh -n -c {q} 2>&1 </dev/null); then {{ eval {q}\n}} 2>&1 </dev/null; "
        "else printf '%s\\n' \"$__bssh_err\"; (exit 2); fi"
    )


async def open_setup_shell(
    handle: SandboxHandle, cwd: str, *, signal: AbortSignal | None = None, step_timeout: float = STEP_TIMEOUT
) -> SetupShell:
    """A persistent shell at ``cwd``; exec-backed where the provider cannot feed a process's stdin."""
    if signal is not None:
        signal.throw_if_aborted()
    if not handle.capabilities.writable_stdin:
        return ExecShell(handle, cwd, signal, step_timeout)
    proc = await handle.process.spawn("exec sh", ProcessOptions(cwd=cwd, signal=signal))
    return StdinShell(proc, handle.workspace_root, signal, step_timeout)


async def run_setup(
    handle: SandboxHandle,
    plan: Sequence[SetupGroup],
    root: str,
    *,
    signal: AbortSignal | None = None,
    step_timeout: float = STEP_TIMEOUT,
) -> list[str]:
    """Run ``plan`` over one persistent shell at ``root`` (R17); the first failure raises (R18)."""
    ran: list[str] = []
    if not plan:
        return ran
    shell = await open_setup_shell(handle, root, signal=signal, step_timeout=step_timeout)
    try:
        for group in plan:
            if signal is not None:
                signal.throw_if_aborted()
            if isinstance(group, Serial):
                result = await shell.run(group.command)
                if result.exit_code != 0:
                    raise SetupStepError(redact(group.command), result.exit_code, tail(result.output))
                ran.append(group.command)
                continue
            cwd, env = await shell.fork_state()
            outcomes = await asyncio.gather(
                *(
                    exec_with_deadline(handle.process, c, ProcessOptions(cwd=cwd, env=env), signal, step_timeout, c)
                    for c in group.commands
                ),
                return_exceptions=True,
            )
            for command, outcome in zip(group.commands, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    raise outcome
                if outcome.exit_code != 0:
                    output = tail(f"{outcome.stdout}\n{outcome.stderr}")
                    raise SetupStepError(redact(command), outcome.exit_code, output)
            ran.extend(group.commands)
    finally:
        await shell.dispose()
    return ran


class StdinShell:
    def __init__(self, proc: SpawnHandle, workspace_root: str, signal: AbortSignal | None, step_timeout: float) -> None:
        self._proc = proc
        self._root = workspace_root
        self._signal = signal
        self._timeout = step_timeout
        self._next = 0
        self._out = ""
        self._err = ""
        self._eof = False
        self._exit_code: int | None = None
        self._disposed = False
        self._wake = asyncio.Event()
        self._pumps = [asyncio.ensure_future(self._pump_stdout()), asyncio.ensure_future(self._pump_stderr())]
        self._exit = asyncio.ensure_future(proc.wait())
        self._exit.add_done_callback(self._on_exit)
        self._unlisten = signal.add_listener(lambda _: self._wake.set()) if signal is not None else None

    async def _pump_stdout(self) -> None:
        try:
            async for chunk in self._proc.stdout:
                self._out += chunk
                self._wake.set()
        except Exception:
            pass  # a broken stream ends like a closed one: the step cannot finish either way
        finally:
            self._eof = True
            self._wake.set()

    async def _pump_stderr(self) -> None:
        # Kept for the error text when the shell dies (a syntax error of ours, a kill notice).
        with contextlib.suppress(Exception):
            async for chunk in self._proc.stderr:
                self._err = (self._err + chunk)[-TAIL_CHARS:]

    def _on_exit(self, task: asyncio.Future[int]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._exit_code = task.result()
        self._wake.set()

    def _died(self, command: str, reason: str) -> BootstrapShellError:
        if self._exit_code is not None:
            reason += f" (shell exit code {self._exit_code})"
        return BootstrapShellError(command, reason, tail(self._out + ("\n" + self._err if self._err else "")))

    async def run(self, command: str) -> StepResult:
        if self._disposed:
            raise BootstrapShellError(command, "the setup shell was already disposed")
        sentinel = f"__BSSH_{self._next}__"
        self._next += 1
        if self._eof or self._exit_code is not None:
            raise self._died(command, "the setup shell is no longer running")
        try:
            await self._proc.stdin.write(f"{step_script(command)}\nprintf '\\n%s %s\\n' '{sentinel}' \"$?\"\n")
        except Exception as exc:
            raise self._died(command, f"could not write to the setup shell: {type(exc).__name__}") from None
        found = re.compile("\n" + re.escape(sentinel) + r" (-?\d+)\n")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        exited_at: float | None = None
        scan_from = 0
        while True:
            match = found.search(self._out, scan_from)
            if match is not None:
                output, self._out = self._out[: match.start()], self._out[match.end() :]
                return StepResult(int(match[1]), output)
            if len(self._out) > _BUFFER_CAP:
                self._out = self._out[-_BUFFER_CAP // 2 :]
            scan_from = max(0, len(self._out) - len(sentinel) - 32)
            if self._signal is not None and self._signal.aborted:
                raise AbortError(self._signal.reason)
            if self._eof:
                raise self._died(command, "the shell's output closed before the step finished")
            now = loop.time()
            if self._exit_code is not None:
                # Something else (a backgrounded child) still holds stdout open; the shell is gone anyway.
                exited_at = now if exited_at is None else exited_at
                if now - exited_at >= _EXIT_GRACE:
                    raise self._died(command, "the shell exited before the step finished")
            if now >= deadline:
                raise self._died(command, f"no answer within {self._timeout:g}s")
            self._wake.clear()
            wait = deadline - now if exited_at is None else _EXIT_GRACE
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def fork_state(self) -> ShellState:
        command = f"pwd; printf '%s\\n' '{_STATE_MARKER}'; export -p"
        result = await self.run(command)
        cwd, found, exports = result.output.partition(f"\n{_STATE_MARKER}\n")
        if result.exit_code != 0 or not found:
            raise BootstrapShellError(command, f"could not read the shell state (exit {result.exit_code})")
        return ShellState(sandbox_path(self._root, cwd.strip("\n")), parse_exports(exports))

    async def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        if self._unlisten is not None:
            self._unlisten()
        with contextlib.suppress(Exception):
            await self._proc.stdin.end()
        with contextlib.suppress(Exception):
            await self._proc.kill()
        # A provider whose kill leaves the pipes open must not hang bootstrap here.
        pending = [*self._pumps, self._exit]
        _, still = await asyncio.wait(pending, timeout=5.0)
        for task in still:
            task.cancel()


class ExecShell:
    """The persistent-shell contract over one ``exec`` per step, carrying ``pwd`` and exports forward."""

    def __init__(self, handle: SandboxHandle, cwd: str, signal: AbortSignal | None, step_timeout: float) -> None:
        self._handle = handle
        self._cwd = cwd
        self._env: dict[str, str] | None = None
        self._signal = signal
        self._timeout = step_timeout
        self._next = 0

    async def run(self, command: str) -> StepResult:
        sentinel = f"__BSSH_{self._next}__"
        self._next += 1
        script = (
            f"{step_script(command)}\n__bssh_rc=$?\n"
            f"printf '\\n%s %s\\n' '{sentinel}' \"$__bssh_rc\"\npwd\nprintf '%s\\n' '{sentinel}ENV'\nexport -p\n"
            'exit "$__bssh_rc"\n'
        )
        opts = ProcessOptions(cwd=self._cwd, env=self._env)
        result = await exec_with_deadline(self._handle.process, script, opts, self._signal, self._timeout, command)
        match = re.search("\n" + re.escape(sentinel) + r" (-?\d+)\n", result.stdout)
        if match is None:
            # The step ended the shell itself (`exit 3`): the process's code is the step's.
            return StepResult(result.exit_code, result.stdout + result.stderr)
        rest = result.stdout[match.end() :]
        cwd, found, exports = rest.partition(f"{sentinel}ENV\n")
        if found:
            if cwd.strip("\n"):
                self._cwd = sandbox_path(self._handle.workspace_root, cwd.strip("\n"))
            self._env = parse_exports(exports) or self._env
        return StepResult(int(match[1]), result.stdout[: match.start()] + result.stderr)

    async def fork_state(self) -> ShellState:
        return ShellState(self._cwd, dict(self._env or {}))

    async def dispose(self) -> None:
        return None


async def exec_with_deadline(
    process: SandboxProcesses,
    command: str,
    opts: ProcessOptions,
    signal: AbortSignal | None,
    timeout: float,
    label: str,
) -> ExecResult:
    """``process.exec`` bounded by ``timeout``; the command is killed (through its signal) when it runs over."""
    controller = AbortController()
    unlisten = signal.add_listener(controller.abort) if signal is not None else None
    opts.signal = controller.signal
    try:
        result = await asyncio.wait_for(process.exec(command, opts), timeout)
    except TimeoutError:
        controller.abort(TimeoutError(f"setup step timed out after {timeout:g}s"))
        raise BootstrapShellError(label, f"no answer within {timeout:g}s") from None
    finally:
        if unlisten is not None:
            unlisten()
    if signal is not None and signal.aborted:
        raise AbortError(signal.reason)
    return result


# -- `export -p` ---------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b", "E": "\x1b"}


def parse_exports(text: str) -> dict[str, str]:
    """Exported names and values from ``export -p`` of dash, bash (``declare -x``), busybox or zsh.

    Values may be single-, double- or ``$'...'``-quoted and span lines; an
    exported name without a value is skipped.
    """
    env: dict[str, str] = {}
    for words in _commands(text):
        if words[0] not in ("export", "declare", "typeset"):
            continue
        for word in words[1:]:
            name, eq, value = word.partition("=")
            if eq and _NAME.match(name):
                env[name] = value
    return env


def _commands(text: str) -> Iterator[list[str]]:
    """Split shell text into commands of words, honouring quotes; enough of sh for ``export -p``."""
    words: list[str] = []
    word: list[str] = []
    in_word = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            word.append(text[i + 1 : end])
            in_word, i = True, end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    word.append("" if text[i + 1] == "\n" else text[i + 1])
                    i += 2
                else:
                    word.append(text[i])
                    i += 1
            in_word, i = True, i + 1
        elif text.startswith("$'", i):
            i, value = _ansi_c(text, i + 2)
            word.append(value)
            in_word = True
        elif c == "\\" and i + 1 < n:
            word.append("" if text[i + 1] == "\n" else text[i + 1])
            in_word, i = True, i + 2
        elif c in " \t\n;":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            if c in "\n;" and words:
                yield words
                words = []
            i += 1
        else:
            word.append(c)
            in_word, i = True, i + 1
    if in_word:
        words.append("".join(word))
    if words:
        yield words


def _ansi_c(text: str, i: int) -> tuple[int, str]:
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != "'":
        if text[i] != "\\" or i + 1 >= n:
            out.append(text[i])
            i += 1
            continue
        e = text[i + 1]
        digits = {"x": (16, 2), "u": (16, 4), "U": (16, 8)}.get(e)
        if e in _C_ESCAPES:
            out.append(_C_ESCAPES[e])
            i += 2
        elif digits is not None or e in "01234567":
            base, width = digits or (8, 3)
            start = i + (2 if digits else 1)
            allowed = "0123456789abcdefABCDEF" if base == 16 else "01234567"
            end = start
            while end < n and end - start < width and text[end] in allowed:
                end += 1
            out.append(chr(int(text[start:end], base)) if end > start else "\\" + e)
            i = max(end, i + 2)
        else:
            out.append(e)
            i += 2
    return i + 1, "".join(out)


__all__ = [
    "STEP_TIMEOUT",
    "TAIL_CHARS",
    "ExecShell",
    "Parallel",
    "Serial",
    "SetupBuilder",
    "SetupCallback",
    "SetupGroup",
    "SetupShell",
    "ShellState",
    "StdinShell",
    "StepResult",
    "build_setup_plan",
    "exec_with_deadline",
    "open_setup_shell",
    "parse_exports",
    "run_setup",
    "sandbox_path",
    "step_script",
]
