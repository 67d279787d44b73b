"""How a harness authenticates: an API key from the host env (``api-key``) or the CLI's own login (``host``).

In ``host`` mode no key is passed, and on a provider that inherits the host env
(local process) the keys must also be scrubbed, or a key exported on the host
would still override the CLI login. OpenCode has no mode: its server reads
``OPENAI_API_KEY`` whatever the mode says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from .errors import InvalidPolicyError

AuthMode = Literal["api-key", "host"]
DEFAULT_AUTH_MODE: AuthMode = "api-key"

# The env names each harness CLI reads a key from, in the order it prefers them.
HARNESS_KEY_ENV: dict[str, tuple[str, ...]] = {
    "claude-code": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
    "codex": ("CODEX_API_KEY",),
    "grok-build": ("XAI_API_KEY", "GROK_API_KEY"),
}
OPENCODE_KEY_ENV = ("OPENAI_API_KEY",)
GROK_API_KEY_AUTH_METHOD = "xai.api_key"


def _mode(value: object, field: str) -> AuthMode | None:
    if value is None:
        return None
    if value not in get_args(AuthMode):
        raise InvalidPolicyError(field, value, "'api-key', 'host' or None")
    return value  # type: ignore[return-value]


def resolve_auth_mode(per_call: AuthMode | None, adapter_config: AuthMode | None) -> AuthMode:
    """Per-call option > adapter config > ``api-key``."""
    return _mode(per_call, "auth_mode") or _mode(adapter_config, "auth_mode") or DEFAULT_AUTH_MODE


def harness_auth_env(harness: str, mode: AuthMode, host_env: Mapping[str, str]) -> dict[str, str]:
    """The key env to pass into the agent. Unknown harnesses (ACP, command) get nothing: their env is their config.

    An empty host value is not passed: it is no credential, and it would hide a CLI login.
    """
    _mode(mode, "auth_mode")
    names: tuple[str, ...]
    if harness == "opencode":
        names = OPENCODE_KEY_ENV
    elif mode == "host":
        return {}
    else:
        names = HARNESS_KEY_ENV.get(harness, ())
    return {name: host_env[name] for name in names if host_env.get(name)}


def scrub_env_for(harness: str, mode: AuthMode) -> list[str]:
    """The names a local-process sandbox should delete so the CLI login wins (``host`` mode only)."""
    if _mode(mode, "auth_mode") != "host":
        return []
    return list(HARNESS_KEY_ENV.get(harness, ()))


def grok_auth_method(mode: AuthMode, explicit: str | None = None) -> str | None:
    """The ACP auth method grok is asked to use: explicit > ``xai.api_key`` (api-key) > none (host)."""
    if explicit:
        return explicit
    return GROK_API_KEY_AUTH_METHOD if _mode(mode, "auth_mode") == "api-key" else None
