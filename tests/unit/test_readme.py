"""The README's code blocks are the first thing a user runs: they must stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_asgi_app_example_builds_an_app_with_the_documented_routes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BOXWRIGHT_DB", str(tmp_path / "readme.db"))
    namespace: dict[str, object] = {}
    exec(compile(_python_block("### In an ASGI app"), "README.md", "exec"), namespace)
    app = namespace["app"]
    paths = {getattr(r, "path", "") for mount in app.routes for r in getattr(mount, "routes", [])}  # type: ignore[attr-defined]
    assert {"/runs", "/runs/{run_id}/events", "/runs/{run_id}/cancel"} <= paths
