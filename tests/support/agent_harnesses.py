"""Every real agent harness pointed at a fake model, with a private HOME: for tests that run them in another
process too (the takeover test's host A and host B build the same harness from these), and the bench.

``HARNESS_FOR[name](model_url, home, executable)`` builds one; ``SHELL_CALL[name](command)`` is the fake
model's step that makes that agent run a shell command. Every process an agent starts inherits ``HOME=home``:
how ``tests/support/agent_procs.agent_left`` finds anything left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from boxwright.harnesses.acp import acp
from boxwright.harnesses.claude_code import claude_code
from boxwright.harnesses.codex import codex
from boxwright.harnesses.gemini_cli import gemini_cli
from boxwright.harnesses.opencode import opencode
from tests.fixtures.fake_model import ToolCall
from tests.support.require import AGENT_BIN

# codex-acp finds its platform binary, claude-agent-acp finds node, through PATH.
_PATH = f"{AGENT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def claude_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/claude") -> Any:
    env = {
        "HOME": home,
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "IS_SANDBOX": "1",  # measured: as root, bypassPermissions needs it
    }
    return claude_code("claude-sonnet-4-5", executable=executable, env=env)


def codex_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/codex") -> Any:
    # CODEX_HOME outside TMPDIR: codex's own sandbox refuses to set up its helper under $TMPDIR (measured).
    tmp = os.path.join(os.path.dirname(home), "codex-tmp")
    env = {"HOME": home, "CODEX_HOME": home, "TMPDIR": tmp, "CODEX_API_KEY": "sk-test"}
    return codex("gpt-5.5", executable=executable, base_url=model_url + "/v1", max_retries=0, env=env)


def opencode_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/opencode") -> Any:
    config = {
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": model_url + "/v1", "apiKey": "sk-test"},
                "models": {"fake-model": {"name": "Fake Model", "tool_call": True}},
            }
        }
    }
    env = {
        "HOME": home,
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "XDG_DATA_HOME": os.path.join(home, ".local/share"),
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "XDG_STATE_HOME": os.path.join(home, ".local/state"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "npm_config_registry": "http://127.0.0.1:9/",  # offline: its plugin lookups fail at once
    }
    return opencode("fake/fake-model", executable=executable, config=config, env=env)


def claude_agent_acp_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/claude-agent-acp") -> Any:
    env = {
        "PATH": _PATH,
        "HOME": home,
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "IS_SANDBOX": "1",  # measured: as root the adapter's bundled CLI refuses to start without it
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return acp([executable], name="claude-agent-acp", env=env)


def codex_acp_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/codex-acp", ask: bool = False) -> Any:
    # All config by -c, so CODEX_HOME may be any fresh directory (made by the wrapper, in the sandbox).
    config = {
        "model": '"gpt-5.5"',
        "model_provider": '"fake"',
        "model_providers.fake.name": '"Fake"',
        "model_providers.fake.base_url": f'"{model_url}/v1"',
        "model_providers.fake.env_key": '"FAKE_API_KEY"',
        "model_providers.fake.wire_api": '"responses"',
        "model_providers.fake.request_max_retries": "0",
        "model_providers.fake.stream_max_retries": "0",
        # Our sandbox is the layer that holds: codex's own bwrap is off; ``untrusted`` makes it ask us.
        "sandbox_mode": '"danger-full-access"',
        "approval_policy": '"untrusted"' if ask else '"never"',
    }
    argv = ["sh", "-c", 'mkdir -p "$CODEX_HOME" "$TMPDIR" && exec "$0" "$@"', executable]
    for key, value in config.items():
        argv += ["-c", f"{key}={value}"]
    env = {
        "PATH": _PATH,
        "HOME": home,
        "CODEX_HOME": f"{home}/codex",
        "FAKE_API_KEY": "sk-test",
        "TMPDIR": f"{home}/tmp",
    }
    return acp(argv, name="codex-acp", env=env)


def gemini_for(model_url: str, home: str, executable: str = f"{AGENT_BIN}/gemini") -> Any:
    env = {"PATH": _PATH, "HOME": home, "GEMINI_API_KEY": "sk-test", "GOOGLE_GEMINI_BASE_URL": model_url}
    return gemini_cli("gemini-2.5-flash", executable=executable, env=env)


HARNESS_FOR: dict[str, Callable[..., Any]] = {
    "claude": claude_for,
    "codex": codex_for,
    "opencode": opencode_for,
    "claude-agent-acp": claude_agent_acp_for,
    "codex-acp": codex_acp_for,
    "gemini": gemini_for,
}
# The CLI each harness runs (found with tests/support/require.agent_cli).
BINARY = {name: name for name in HARNESS_FOR}


def _bash(command: str) -> ToolCall:
    return ToolCall("Bash", {"command": command, "description": "run it"})


SHELL_CALL: dict[str, Callable[[str], ToolCall]] = {
    "claude": _bash,
    "codex": lambda command: ToolCall("exec_command", {"cmd": command}),
    "opencode": lambda command: ToolCall("bash", {"command": command, "description": "run it"}),
    "claude-agent-acp": _bash,
    "codex-acp": lambda command: ToolCall("exec_command", {"cmd": command}),
    "gemini": lambda command: ToolCall("run_shell_command", {"command": command, "description": "run it"}),
}
