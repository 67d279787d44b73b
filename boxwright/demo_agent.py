"""A small scripted agent that speaks AG-UI NDJSON, for `boxwright demo` and for trying the pipeline offline.

It is not a model: it reads the prompt on stdin, "thinks" out loud, runs one real
shell command in its working directory (appending the prompt to NOTES.md), and
reports what changed. Standard library only, so any python3 can run it as a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def emit(event: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> int:
    prompt = sys.stdin.read().strip() or "(no prompt)"
    emit({"type": "REASONING_START", "messageId": "demo-think"})
    emit({"type": "REASONING_MESSAGE_START", "messageId": "demo-think", "role": "reasoning"})
    for word in ["I will note the request ", "in NOTES.md ", "and show the diff."]:
        emit({"type": "REASONING_MESSAGE_CONTENT", "messageId": "demo-think", "delta": word})
        time.sleep(0.05)
    emit({"type": "REASONING_MESSAGE_END", "messageId": "demo-think"})
    emit({"type": "REASONING_END", "messageId": "demo-think"})

    command = "printf '%s\\n' \"- $BOXWRIGHT_DEMO_NOTE\" >> NOTES.md && tail -n 3 NOTES.md"
    args = json.dumps({"command": command})
    emit({"type": "TOOL_CALL_START", "toolCallId": "demo-call-1", "toolCallName": "Bash", "toolName": "Bash"})
    emit({"type": "TOOL_CALL_ARGS", "toolCallId": "demo-call-1", "delta": args})
    emit({"type": "TOOL_CALL_END", "toolCallId": "demo-call-1", "input": {"command": command}})
    done = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        env={"BOXWRIGHT_DEMO_NOTE": prompt, "PATH": "/usr/bin:/bin"},
    )
    emit(
        {
            "type": "TOOL_CALL_RESULT",
            "toolCallId": "demo-call-1",
            "messageId": "demo-result-1",
            "role": "tool",
            "content": done.stdout + done.stderr,
            **({"state": "output-error"} if done.returncode else {}),
        }
    )
    emit({"type": "TEXT_MESSAGE_START", "messageId": "demo-answer", "role": "assistant"})
    for piece in ["Noted ", "your request ", "in NOTES.md."]:
        emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": "demo-answer", "delta": piece})
        time.sleep(0.05)
    emit({"type": "TEXT_MESSAGE_END", "messageId": "demo-answer"})
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
