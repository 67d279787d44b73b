"""The real Codex and OpenCode harnesses pointed at a fake model, with a private HOME: for tests that run them
in another process too (the takeover test's host A and host B build the same harness from these)."""

from __future__ import annotations

import os
from typing import Any

from boxwright.harnesses.codex import codex
from boxwright.harnesses.opencode import opencode
from tests.support.require import AGENT_BIN


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


HARNESS_FOR = {"codex": codex_for, "opencode": opencode_for}
