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
    exec(compile(_python_block("## In an ASGI app"), "README.md", "exec"), namespace)
    app = namespace["app"]
    paths = {getattr(r, "path", "") for mount in app.routes for r in getattr(mount, "routes", [])}  # type: ignore[attr-defined]
    assert {"/runs", "/runs/{run_id}/events", "/runs/{run_id}/cancel"} <= paths


SOURCE = Path(__file__).resolve().parents[2] / "boxwright"
# `_error(404, "...", "unknown_run")`, `DeliveryRefusal(400, 4400, "...", "invalid_offset")`,
# `json_response(409, {..., "code": "thread_busy", ...})`: every refusal the HTTP side can answer.
_REFUSAL = re.compile(
    r'(?:_error|DeliveryRefusal|json_response)\(\s*(\d{3}),(?:\s*\d{4},)?[^\n]*?"code":\s*"([a-z_]+)"'
    r'|(?:_error|DeliveryRefusal)\(\s*(\d{3}),(?:\s*\d{4},)?.*?,\s*(f?"[a-z_{}]+"|exc\.code)\s*\)',
    re.S,
)


def _refusals() -> set[tuple[str, str]]:
    from boxwright.errors import InvalidRunIdError, InvalidThreadIdError

    text = "\n".join(p.read_text() for p in (SOURCE / "middleware").glob("*.py"))
    found: set[tuple[str, str]] = set()
    for match in _REFUSAL.finditer(text):
        status = match.group(1) or match.group(3)
        code = match.group(2) or match.group(4)
        if code == "exc.code":
            found |= {(status, InvalidRunIdError.code), (status, InvalidThreadIdError.code)}
        elif "{name}" in code:  # f"invalid_{name}" of the long-poll's integer parameters
            found |= {(status, code.strip('f"').replace("{name}", name)) for name in ("wait", "limit")}
        else:
            found.add((status, code.strip('"')))
    return found


def test_readme_stands_alone_for_a_user_of_the_package() -> None:
    text = README.read_text()
    assert "../shared" not in text and "ARCHITECTURE.md" not in text
    assert "make demo" in text and "make test" in text


def test_every_route_is_documented_with_its_parameters(tmp_path, monkeypatch) -> None:
    from boxwright.middleware import SandboxService, sandbox_routes
    from boxwright.stores.memory import MemoryEventLog, MemoryRunStore

    text = README.read_text()
    for route in sandbox_routes(SandboxService(MemoryRunStore(), MemoryEventLog())):
        path = getattr(route, "path", "").replace("{run_id}", "{id}")
        methods = sorted(getattr(route, "methods", None) or {"WS"})
        method = "POST" if "POST" in methods else "GET" if "GET" in methods else "WS"
        assert f"`{method} {path}`" in text, f"{method} {path} is not documented"
    for parameter in ("Last-Event-ID", "?offset=", "`wait`", "`limit`", "nextOffset", "closed", "activeRunId"):
        assert parameter in text, parameter
    assert '{"offset", "event"}' in text and '"closed": true' in text, "the WebSocket frames"


def test_every_error_code_is_in_the_table_with_its_http_status() -> None:
    rows = [line for line in README.read_text().splitlines() if re.match(r"\| \d{3} \|", line)]
    refusals = _refusals()
    assert ("409", "thread_busy") in refusals and ("404", "unknown_run") in refusals, "the scan finds codes"
    for status, code in sorted(refusals):
        assert any(row.startswith(f"| {status} |") and f"`{code}`" in row for row in rows), (status, code)


def test_the_tools_example_declares_tools_from_plain_functions() -> None:
    from boxwright.tool_bridge import as_tools

    namespace: dict[str, object] = {}
    exec(compile(_python_block("## Tools"), "README.md", "exec"), namespace)
    tools = as_tools(namespace["TOOLS"])
    assert [t.name for t in tools] == ["get_todos", "add_todo"]
    assert tools[0].description == "The user's todos with this status."
    add = tools[1].input_schema
    assert add["properties"]["title"]["description"] == "what to do" and "ctx" not in add["properties"]
    assert add["required"] == ["title"] and tools[1].read_only
    assert callable(namespace["add_todo"]), "@tool keeps the function callable"
