"""The rendered view in a real terminal (tmux, 80x40): what the agent said stays on the screen and in the
scrollback, a diff is whole, a file change never splits a sentence, an error is said once.

A pipe never showed the bug these tests cover: a live spinner erased the streamed line next to it,
which only happens where the output is a terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.fixtures.fake_model import FakeModelServer, HttpError, Text
from tests.support.require import agent_cli
from tests.support.tmux import run_in_terminal, squeeze

ROOT = Path(__file__).resolve().parents[2]
BOXWRIGHT = [sys.executable, "-m", "boxwright"]
LONG = "Water the plants on the balcony and then the ones in the kitchen, the fern included, before noon today."


def _env(**extra: str) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    return {**keep, "PYTHONPATH": str(ROOT), **extra}


def _lines(screen: str) -> list[str]:
    return [line.rstrip() for line in screen.splitlines()]


def test_demo_leaves_the_agents_words_and_the_whole_diff_on_the_screen(tmp_path: Path) -> None:
    code, screen = run_in_terminal([*BOXWRIGHT, "demo", LONG], tmp_path, _env())
    assert code == 0, screen
    lines = _lines(screen)
    # The demo agent's own words, thinking and answer, each a whole line.
    assert "thinking: I will note the request in NOTES.md and show the diff." in lines, screen
    assert "Noted your request in NOTES.md." in lines, screen
    assert any(line.startswith("▶ Bash printf") for line in lines), screen
    # The diff's added line is longer than the terminal: it is all there, not cut at 80 columns.
    assert squeeze(f"+- {LONG}") in squeeze(screen), screen
    assert "diff --git a/NOTES.md b/NOTES.md" in lines and "✓ finished (stop)" in lines, screen


AGENT = textwrap.dedent(
    """
    import json, sys, time

    def emit(event):
        sys.stdout.write(json.dumps(event) + "\\n")
        sys.stdout.flush()

    sys.stdin.read()
    emit({"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"})
    emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "I am changing the notes "})
    with open("NOTES.md", "a") as f:
        f.write("- " + "a line far wider than any terminal, " * 4 + "end\\n")
    time.sleep(2.5)  # the watcher reports the change while the sentence is still open
    emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "and the sentence goes on after it."})
    emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "\\nA second line, said at once."})
    emit({"type": "TEXT_MESSAGE_END", "messageId": "m1"})
    emit({"type": "CUSTOM", "name": "tool_bridge.started",
          "value": {"callId": "c1", "toolName": "get_todos", "args": {"status": "open"}}})
    emit({"type": "CUSTOM", "name": "tool_bridge.finished",
          "value": {"callId": "c1", "toolName": "get_todos", "durationMs": 12.0}})
    """
)


def _git_repo(path: Path) -> Path:
    path.mkdir()
    (path / "NOTES.md").write_text("# Notes\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q", "-b", "main"], [*ident, "add", "."], [*ident, "commit", "-q", "-m", "notes"]):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


def test_run_with_a_command_agent_keeps_a_sentence_whole_around_a_file_change(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    repo = _git_repo(tmp_path / "repo")
    harness = f"command:{sys.executable} {agent}"
    code, screen = run_in_terminal(
        [*BOXWRIGHT, "run", "note it", "--repo", str(repo), "--harness", harness], tmp_path, _env()
    )
    assert code == 0, screen
    lines = _lines(screen)
    sentence = "I am changing the notes and the sentence goes on after it."
    assert sentence in lines, screen
    assert "A second line, said at once." in lines, screen
    # The file change the watcher saw mid-sentence is a line of its own, above the sentence.
    assert "  change NOTES.md" in lines, screen
    assert lines.index("  change NOTES.md") < lines.index(sentence), screen
    # Host tool events read as words, not as Python dicts.
    assert '  ⚙ host tool get_todos({"status":"open"})' in lines, screen
    assert "  ⚙ host tool get_todos done in 12 ms" in lines, screen
    assert "{'" not in screen, screen
    added = "+- " + "a line far wider than any terminal, " * 4 + "end"
    assert squeeze(added) in squeeze(screen), screen


def test_claudes_words_stay_on_the_screen_and_its_error_is_said_once(tmp_path: Path) -> None:
    claude = agent_cli("claude")
    home = tmp_path / "home"
    home.mkdir()
    said = "The answer is forty-two, and these words stay in the scrollback."
    refusal = "the fake model refuses this prompt"
    scripts = {"hello": [Text(said)], "refuse": [HttpError(400, refusal)]}
    with FakeModelServer(scripts) as model:
        env = _env(
            PATH=f"{os.path.dirname(claude)}:{os.environ['PATH']}",
            HOME=str(home),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
            CLAUDE_CODE_MAX_RETRIES="0",
        )
        code, screen = run_in_terminal([*BOXWRIGHT, "run", "[[script:hello]] hi"], tmp_path, env)
        assert code == 0, screen
        assert said in _lines(screen), screen
        code, screen = run_in_terminal([*BOXWRIGHT, "run", "[[script:refuse]] hi"], tmp_path, env)
    assert code == 1, screen
    assert screen.count(refusal) == 1, screen
    assert any(line.startswith("✗ ") for line in _lines(screen)), screen
