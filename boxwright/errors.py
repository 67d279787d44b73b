"""Every public exception of boxwright, in one place.

Each error carries the values it names as attributes, so callers can branch on
them without parsing messages, and its message says what was wrong.
"""

from __future__ import annotations


class BoxwrightError(Exception):
    """Base class of every error boxwright raises on purpose."""


class EventDecodeError(BoxwrightError, ValueError):
    """An event (or an NDJSON line of events) could not be decoded."""


class UnsupportedCapabilityError(BoxwrightError):
    """A provider was asked for something its capabilities do not include."""

    def __init__(self, provider: str, capability: str, hint: str | None = None) -> None:
        self.provider = provider
        self.capability = capability
        self.hint = hint
        message = f"sandbox provider {provider!r} does not support {capability!r}"
        if hint:
            message += f": {hint}"
        super().__init__(message)


class MissingSandboxError(BoxwrightError):
    """A harness that needs a sandbox was run without one."""

    def __init__(self, adapter_name: str) -> None:
        self.adapter_name = adapter_name
        super().__init__(
            f"harness {adapter_name!r} runs inside a sandbox, but none was given; pass sandbox=define_sandbox(...)"
        )


class SandboxCommandError(BoxwrightError):
    """A command that backs an fs or git operation exited non-zero."""

    def __init__(self, op: str, exit_code: int, stderr: str) -> None:
        self.op = op
        self.exit_code = exit_code
        self.stderr = stderr
        tail = stderr.strip()[-500:]
        super().__init__(f"{op} failed with exit code {exit_code}" + (f": {tail}" if tail else ""))


class SandboxPathError(BoxwrightError, ValueError):
    """A path resolves outside the sandbox's workspace root."""

    def __init__(self, path: str, root: str, reason: str = "escapes the workspace root") -> None:
        self.path = path
        self.root = root
        super().__init__(f"path {path!r} {reason} {root!r}")


class ProviderUnavailableError(BoxwrightError):
    """The provider cannot run on this machine (no binary, daemon, login or credential)."""

    def __init__(self, provider: str, reason: str, help: str | None = None) -> None:
        self.provider = provider
        self.reason = reason
        self.help = help
        super().__init__(f"sandbox provider {provider!r} is unavailable: {reason}" + (f" ({help})" if help else ""))


class SandboxNotFoundError(BoxwrightError):
    """A sandbox id or workspace root does not exist."""

    def __init__(self, provider: str, sandbox_id: str, reason: str = "does not exist") -> None:
        self.provider = provider
        self.sandbox_id = sandbox_id
        super().__init__(f"{provider} sandbox {sandbox_id!r} {reason}")


class ProcessExitedError(BoxwrightError):
    """Input was written to a process whose stdin is already closed (it exited or end() was called)."""

    def __init__(self, pid: int, reason: str) -> None:
        self.pid = pid
        super().__init__(f"cannot write to stdin of process {pid}: {reason}")


class AbortError(BoxwrightError):
    """An operation was started with, or stopped by, an aborted signal."""

    def __init__(self, reason: object = None) -> None:
        self.reason = reason
        super().__init__(f"aborted: {reason}" if reason is not None else "aborted")
