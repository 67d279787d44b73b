"""Harness auth (R29-R30): which key env each harness gets, and scrubbing keys on a real local process."""

import asyncio
import os

import pytest

from boxwright.auth import grok_auth_method, harness_auth_env, resolve_auth_mode, scrub_env_for
from boxwright.errors import InvalidPolicyError
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import ProcessOptions

HOST = {
    "ANTHROPIC_API_KEY": "sk-ant",
    "ANTHROPIC_AUTH_TOKEN": "ant-token",
    "CODEX_API_KEY": "codex-key",
    "OPENAI_API_KEY": "openai-key",
    "XAI_API_KEY": "xai-key",
    "GROK_API_KEY": "grok-key",
    "PATH": "/usr/bin",
}


def test_a26_per_call_beats_adapter_config_beats_api_key():
    assert resolve_auth_mode(None, None) == "api-key"
    assert resolve_auth_mode(None, "host") == "host"
    assert resolve_auth_mode("api-key", "host") == "api-key"
    assert resolve_auth_mode("host", "api-key") == "host"
    with pytest.raises(InvalidPolicyError, match="auth_mode"):
        resolve_auth_mode("oauth", None)  # type: ignore[arg-type]


def test_a26_api_key_injects_the_host_key_and_host_injects_none():
    assert harness_auth_env("claude-code", "api-key", HOST) == {
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_AUTH_TOKEN": "ant-token",
    }
    assert harness_auth_env("claude-code", "api-key", {"ANTHROPIC_AUTH_TOKEN": "t"}) == {"ANTHROPIC_AUTH_TOKEN": "t"}
    assert harness_auth_env("codex", "api-key", HOST) == {"CODEX_API_KEY": "codex-key"}
    assert harness_auth_env("codex", "api-key", {"OPENAI_API_KEY": "o"}) == {}  # codex reads CODEX_API_KEY only
    assert harness_auth_env("grok-build", "api-key", HOST) == {"XAI_API_KEY": "xai-key", "GROK_API_KEY": "grok-key"}
    assert harness_auth_env("grok-build", "api-key", {"GROK_API_KEY": "g"}) == {"GROK_API_KEY": "g"}
    for harness in ("claude-code", "codex", "grok-build"):
        assert harness_auth_env(harness, "host", HOST) == {}
    # opencode has no mode: its server always reads OPENAI_API_KEY.
    assert harness_auth_env("opencode", "host", HOST) == {"OPENAI_API_KEY": "openai-key"}
    assert harness_auth_env("opencode", "api-key", HOST) == {"OPENAI_API_KEY": "openai-key"}
    # An empty value is no credential and would hide a CLI login.
    assert harness_auth_env("claude-code", "api-key", {"ANTHROPIC_API_KEY": ""}) == {}
    assert harness_auth_env("acp", "api-key", HOST) == {}


def test_grok_auth_method_explicit_then_mode():
    assert grok_auth_method("api-key") == "xai.api_key"
    assert grok_auth_method("host") is None
    assert grok_auth_method("host", "grok.login") == "grok.login"
    assert grok_auth_method("api-key", "grok.login") == "grok.login"


def test_scrub_env_for_names_the_keys_only_in_host_mode():
    assert scrub_env_for("claude-code", "host") == ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"]
    assert scrub_env_for("codex", "host") == ["CODEX_API_KEY"]
    assert scrub_env_for("grok-build", "host") == ["XAI_API_KEY", "GROK_API_KEY"]
    assert scrub_env_for("opencode", "host") == []
    assert scrub_env_for("grok-build", "api-key") == []


def _env_of(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def test_a27_scrub_env_deletes_names_from_host_handle_and_per_command_env(tmp_path, monkeypatch):
    monkeypatch.setenv("XAI_API_KEY", "from-host")
    monkeypatch.setenv("BOXWRIGHT_TEST_KEPT", "kept")
    mode = resolve_auth_mode(None, "host")

    async def main() -> tuple[dict[str, str], dict[str, str]]:
        provider = local_process_sandbox(base_dir=tmp_path, scrub_env=scrub_env_for("grok-build", mode))
        handle = await provider.create()
        try:
            handle.env.set({"GROK_API_KEY": "from-handle"})
            opts = ProcessOptions(env={"GROK_API_KEY": "per-command", "XAI_API_KEY": "per-command", "EXTRA": "1"})
            scrubbed = await handle.process.exec("env", opts)
            assert scrubbed.exit_code == 0
            # Without scrubbing, the same process sees the keys: the absence above is the scrub, not chance.
            plain = await local_process_sandbox(base_dir=tmp_path).create()
            try:
                unscrubbed = await plain.process.exec("env", ProcessOptions(env={"GROK_API_KEY": "per-command"}))
            finally:
                await plain.destroy()
            return _env_of(scrubbed.stdout), _env_of(unscrubbed.stdout)
        finally:
            await handle.destroy()

    scrubbed, unscrubbed = asyncio.run(main())
    assert "XAI_API_KEY" not in scrubbed and "GROK_API_KEY" not in scrubbed  # deleted, not blanked
    assert scrubbed["EXTRA"] == "1" and scrubbed["BOXWRIGHT_TEST_KEPT"] == "kept"
    assert unscrubbed["XAI_API_KEY"] == "from-host" and unscrubbed["GROK_API_KEY"] == "per-command"


def test_api_key_mode_reaches_the_child_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-host")
    mode = resolve_auth_mode("api-key", "host")
    env = harness_auth_env("claude-code", mode, os.environ)

    async def main() -> dict[str, str]:
        handle = await local_process_sandbox(base_dir=tmp_path, scrub_env=scrub_env_for("claude-code", mode)).create()
        try:
            return _env_of((await handle.process.exec("env", ProcessOptions(env=env))).stdout)
        finally:
            await handle.destroy()

    assert asyncio.run(main())["ANTHROPIC_API_KEY"] == "sk-from-host"
