"""The viewer's built-in demo agent: no model, no network beyond the host's tool bridge.

It speaks AG-UI NDJSON on stdout (the command harness passes each line through) and really works
in its sandbox's workspace: it thinks out loud, asks the host app's tool over the MCP bridge for
the house style, edits ``greet.py`` to follow it, notes the prompt in ``NOTES.md``, asks the
sandbox policy (and, for an ``ask``, a person on the page) before it runs the tests, runs them,
and says what it did. Standard library only, so any python3 runs it as a file.

Its environment (set by ``demo_harness``): ``BOXWRIGHT_BRIDGE_URL`` / ``BOXWRIGHT_BRIDGE_TOKEN``
(this run's bridge), ``BOXWRIGHT_DEMO_TOOL`` / ``BOXWRIGHT_DEMO_TOOL_ARGS`` (the host tool to
call), ``BOXWRIGHT_DEMO_ASK_TOOL``, ``BOXWRIGHT_DEMO_PACE`` (seconds between steps).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

PACE = float(os.environ.get("BOXWRIGHT_DEMO_PACE", "0.3"))
TEST_COMMAND = "python3 -m unittest -q"
_ids = itertools.count(1)


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def pause(factor: float = 1.0) -> None:
    time.sleep(PACE * factor)


def say(message_id: str, words: list[str], *, reasoning: bool = False) -> None:
    kind = "REASONING_MESSAGE" if reasoning else "TEXT_MESSAGE"
    if reasoning:
        emit({"type": "REASONING_START", "messageId": message_id})
        emit({"type": f"{kind}_START", "messageId": message_id, "role": "reasoning"})
    else:
        emit({"type": f"{kind}_START", "messageId": message_id, "role": "assistant"})
    for word in words:
        emit({"type": f"{kind}_CONTENT", "messageId": message_id, "delta": word})
        pause(0.25)
    emit({"type": f"{kind}_END", "messageId": message_id})
    if reasoning:
        emit({"type": "REASONING_END", "messageId": message_id})


def tool_call(name: str, args: dict[str, Any]) -> str:
    call_id = f"demo-call-{next(_ids)}"
    emit({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name, "toolName": name})
    emit({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": json.dumps(args)})
    emit({"type": "TOOL_CALL_END", "toolCallId": call_id, "input": args})
    return call_id


def tool_result(call_id: str, content: str, *, failed: bool = False) -> None:
    event: dict[str, Any] = {
        "type": "TOOL_CALL_RESULT",
        "toolCallId": call_id,
        "messageId": f"{call_id}-result",
        "role": "tool",
        "content": content,
    }
    if failed:
        event["state"] = "output-error"
    emit(event)


def bridge_call(name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """``tools/call`` on the host bridge: (the result's text, whether it is an error)."""
    url = os.environ.get("BOXWRIGHT_BRIDGE_URL")
    token = os.environ.get("BOXWRIGHT_BRIDGE_TOKEN")
    if not url or not token:
        return "no tool bridge for this run", True
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        method="POST",
    )
    try:
        # No timeout of our own: an approval waits for a person (the host bounds that wait).
        with urllib.request.urlopen(request) as response:
            reply = json.loads(response.read())
    except OSError as exc:
        return f"the bridge did not answer: {exc}", True
    if "error" in reply:
        return str(reply["error"].get("message", reply["error"])), True
    result = reply.get("result", {})
    text = "".join(part.get("text", "") for part in result.get("content", []) if isinstance(part, dict))
    return text, bool(result.get("isError"))


def host_tool(name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    call_id = tool_call(f"mcp__boxwright__{name}", arguments)
    text, failed = bridge_call(name, arguments)
    tool_result(call_id, text, failed=failed)
    return text, failed


def edit(path: str, old: str, new: str) -> None:
    call_id = tool_call("Edit", {"file_path": path, "old_string": old, "new_string": new})
    pause()
    try:
        with open(path) as f:
            text = f.read()
        if old not in text:
            raise ValueError(f"{old!r} is not in {path}")
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))
    except (OSError, ValueError) as exc:
        tool_result(call_id, str(exc), failed=True)
        return
    tool_result(call_id, f"edited {path}")


def bash(command: str) -> int:
    call_id = tool_call("Bash", {"command": command})
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    tool_result(call_id, (done.stdout + done.stderr).strip() or f"exit {done.returncode}", failed=done.returncode != 0)
    return done.returncode


def main() -> int:
    prompt = sys.stdin.read().strip() or "(no prompt)"
    say(
        "demo-think",
        [
            "The request: ",
            f"{prompt!r}. ",
            "I will ask the host app for its house style, ",
            "follow it in greet.py, ",
            "note the request in NOTES.md, ",
            "then run the tests if the policy lets me.",
        ],
        reasoning=True,
    )
    pause()
    tool = os.environ.get("BOXWRIGHT_DEMO_TOOL", "house_style")
    tool_args = json.loads(os.environ.get("BOXWRIGHT_DEMO_TOOL_ARGS", '{"topic": "greetings"}'))
    style, failed = host_tool(tool, tool_args)
    pause()
    suffix = "!" if not failed and "!" in style else "."
    edit("greet.py", 'return "Hello, " + name', f'return "Hello, " + name + "{suffix}"')
    pause()
    with open("NOTES.md", "a") as f:
        f.write(f"- {prompt}\n")
    bash("tail -n 3 NOTES.md")
    pause()
    ask = os.environ.get("BOXWRIGHT_DEMO_ASK_TOOL", "ask_person")
    answer, failed = host_tool(ask, {"kind": "command", "target": TEST_COMMAND, "reason": "check the edit"})
    decision = "deny" if failed else str(json.loads(answer).get("decision", "deny"))
    if decision == "allow":
        code = bash(TEST_COMMAND)
        verdict = ["and the tests ", "pass." if code == 0 else f"fail (exit {code})."]
    else:
        code = 0
        verdict = ["but I did not run the tests: ", "running them was not allowed."]
    pause()
    say("demo-answer", ["Done: ", "greet.py now follows ", "the house style ", f"({style.strip()!r}), ", *verdict])
    return code


if __name__ == "__main__":
    raise SystemExit(main())
