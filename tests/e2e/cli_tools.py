"""Tools for the CLI test: `boxwright run --tools tests.e2e.cli_tools:TOOLS`."""

from __future__ import annotations

import os

from boxwright.tool_bridge import tool


@tool(read_only=True)
def get_todos(status: str = "open") -> str:
    """The app's todos; leaves a trace on the host so the test sees the call happened here."""
    marker = os.environ.get("BOXWRIGHT_TEST_TOOL_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"called {status}\n")
    return "- buy milk\n- ship boxwright"


TOOLS = [get_todos]
