"""``boxwright run --harness NAME``: the registry builds each harness by name, with ``--model``."""

from __future__ import annotations

import pytest

from boxwright.cli import HARNESSES, _harness
from boxwright.harnesses.claude_code import ClaudeCodeHarness
from boxwright.harnesses.codex import CodexHarness
from boxwright.harnesses.command import CommandHarness
from boxwright.harnesses.opencode import OpenCodeHarness


def test_each_name_builds_its_harness_with_the_model() -> None:
    assert {"claude-code", "codex", "opencode"} <= set(HARNESSES)
    claude = _harness("claude-code", "claude-sonnet-4-5")
    assert isinstance(claude, ClaudeCodeHarness) and claude.model == "claude-sonnet-4-5"
    codex = _harness("codex", "gpt-5.5")
    assert isinstance(codex, CodexHarness) and codex.model == "gpt-5.5" and codex.name == "codex"
    opencode = _harness("opencode", "openai/gpt-5")
    assert isinstance(opencode, OpenCodeHarness) and opencode.model == "openai/gpt-5" and opencode.name == "opencode"
    assert isinstance(_harness("command:echo hi", None), CommandHarness)


def test_a_bad_model_or_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad_model:
        _harness("opencode", "gpt-5")  # OpenCode needs provider/model
    assert bad_model.value.code == 2 and "provider/model" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="codex, opencode"):
        _harness("nope", None)
