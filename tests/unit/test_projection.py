"""Projection per harness (R20-R23, A16-A20) on the real local-process provider, plus the TOML writer."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import math
import os
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxwright.errors import SecretResolutionError
from boxwright.projection import (
    TARGETS,
    InlineTable,
    McpServer,
    discover_skill_folders,
    marker_path_for,
    project_workspace,
    projection_for,
    render_mcp_config,
    toml_dumps,
)
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import ProcessOptions
from boxwright.secrets import SecretRef, bearer, create_secrets
from boxwright.workspace import (
    agent_skill,
    define_workspace,
    git_skill,
    git_skill_dir,
    mcp_skill,
    workspace_hash,
)

LOGGER = "boxwright.projection"
HARNESSES = ("claude-code", "codex", "opencode", "grok-build")
MCP_FILES = {h: t.mcp_file for h, t in TARGETS.items()}


def unique(prefix: str) -> str:
    # Resolved values are masked process-wide in boxwright logs; unique values keep other tests' logs intact.
    return f"{prefix}-{uuid.uuid4().hex}"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def make_repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "skills")
    return f"file://{path}"


def fake_program(bindir: Path, name: str, script: str) -> None:
    """A stand-in for a program the sandbox shell finds first on PATH (the real one is absent or must fail)."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


@pytest.fixture
def provider(tmp_path):
    return local_process_sandbox(base_dir=tmp_path / "sandboxes")


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def mcp_workspace(secrets, url="https://mcp.example.com/mcp", **kw):
    skills = [
        mcp_skill(
            "issues",
            {
                "url": url,
                "headers": {
                    "Authorization": bearer(secrets["TOKEN"]),
                    "X-Api-Key": secrets["KEY"],
                    "X-Plain": "literal",
                },
            },
        ),
        *kw.pop("skills", []),
    ]
    return define_workspace(skills=skills, secrets=secrets, **kw)


# -- A16: resolved headers, rewritten after rotation despite the marker -----------------------------


def test_mcp_json_holds_resolved_and_bearer_headers_and_is_rewritten_after_rotation(provider, caplog):
    caplog.set_level(logging.DEBUG)
    token, key, new_token = unique("tok"), unique("key"), unique("rotated")

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = mcp_workspace(create_secrets(TOKEN=token, KEY=key))
            digest = workspace_hash(ws)
            await project_workspace(handle, projection_for(ws, digest), "claude-code")
            path = Path(handle.workspace_root, ".mcp.json")
            assert json.loads(path.read_text()) == {
                "mcpServers": {
                    "issues": {
                        "type": "http",
                        "url": "https://mcp.example.com/mcp",
                        "headers": {"Authorization": f"Bearer {token}", "X-Api-Key": key, "X-Plain": "literal"},
                    }
                }
            }
            marker = Path(handle.workspace_root, f".boxwright-projected-{digest}")
            assert marker.read_bytes() == b""

            # Rotation: a new Secrets with a new value for the same name; the hash ignores values.
            rotated = mcp_workspace(create_secrets(TOKEN=new_token, KEY=key))
            assert workspace_hash(rotated) == digest
            await project_workspace(handle, projection_for(rotated, digest), "claude-code")
            text = path.read_text()
            assert json.loads(text)["mcpServers"]["issues"]["headers"]["Authorization"] == f"Bearer {new_token}"
            assert token not in text
            assert marker.exists()
        finally:
            await handle.destroy()

    asyncio.run(main())
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("harness", HARNESSES)
def test_every_harness_rewrites_its_mcp_config_with_the_current_secret(provider, harness):
    old, new, key = unique("old"), unique("new"), unique("key")

    async def main() -> None:
        handle = await provider.create()
        try:
            first = mcp_workspace(create_secrets(TOKEN=old, KEY=key))
            projection = projection_for(first, workspace_hash(first))
            await project_workspace(handle, projection, harness)
            path = Path(handle.workspace_root, MCP_FILES[harness])
            assert f"Bearer {old}" in path.read_text()
            assert Path(projection.marker_path.replace("/workspace", handle.workspace_root, 1)).exists()

            second = mcp_workspace(create_secrets(TOKEN=new, KEY=key))
            await project_workspace(handle, projection_for(second, workspace_hash(second)), harness)
            text = path.read_text()
            assert f"Bearer {new}" in text and key in text
            assert old not in text
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_projection_for_fills_the_virtual_paths_and_scripts():
    ws = define_workspace(scripts={"test": "pytest -q"}, plugins=["p"])
    projection = projection_for(ws, "abc123")
    assert projection.marker_path == "/workspace/.boxwright-projected-abc123"
    assert projection.root == "/workspace"
    assert dict(projection.scripts) == {"test": "pytest -q"}
    assert list(projection.plugins) == ["p"]
    assert marker_path_for("/", "h") == "/.boxwright-projected-h"


def test_a_secret_header_without_workspace_secrets_raises_naming_the_ref(provider):
    ws = define_workspace(
        skills=[mcp_skill("issues", {"url": "https://x", "headers": {"Authorization": bearer(SecretRef("GH"))}})]
    )
    projection = projection_for(ws, "h")
    with pytest.raises(SecretResolutionError, match="'GH'") as info:
        projection.resolve_secret(SecretRef("GH"))
    assert info.value.secret_name == "GH"

    async def main() -> None:
        handle = await provider.create()
        try:
            with pytest.raises(SecretResolutionError, match="'GH'"):
                await project_workspace(handle, projection, "codex")
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_an_unknown_secret_name_raises_quoting_it():
    ws = define_workspace(secrets=create_secrets(TOKEN=unique("t")))
    with pytest.raises(SecretResolutionError, match="'KEY'"):
        projection_for(ws, "h").resolve_secret(bearer(SecretRef("KEY")))


def test_a_resolved_header_value_never_reaches_any_log_record(provider, tmp_path):
    token = unique("leak")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    # A logger outside `boxwright`, so no redaction filter of secrets.py can hide a leak of ours.
    own = logging.getLogger(f"tests.projection.{uuid.uuid4().hex}")
    bindir = tmp_path / "bin"
    fake_program(bindir, "claude", f'echo "install failed for $1 $2 $3 with {token}" >&2; exit 3')

    async def main() -> None:
        handle = await provider.create()
        handle.env.set({"PATH": f"{bindir}:{os.environ['PATH']}"})
        try:
            ws = mcp_workspace(
                create_secrets(TOKEN=token, KEY=unique("key")),
                plugins=["@acme/plugin"],
                skills=[agent_skill("tanstack")],
            )
            for harness in HARNESSES:
                await project_workspace(handle, projection_for(ws, workspace_hash(ws)), harness, logger=own)
                Path(handle.workspace_root, f".boxwright-projected-{workspace_hash(ws)}").unlink()
            assert token in Path(handle.workspace_root, ".mcp.json").read_text()
        finally:
            await handle.destroy()

    try:
        asyncio.run(main())
    finally:
        root.removeHandler(keep)
        root.setLevel(old_level)
    warned = [r for r in records if r.name == own.name]
    assert any("exited 3" in r.getMessage() and "***" in r.getMessage() for r in warned)
    for record in records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        assert token not in text, record.name


# -- A17: marker present ----------------------------------------------------------------------------


def test_marker_present_means_no_links_no_installs_no_warnings(provider, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    url = make_repo(tmp_path / "pack", {"skills/alpha/SKILL.md": "# alpha\n"})
    bindir = tmp_path / "bin"
    calls = tmp_path / "claude-calls"
    fake_program(bindir, "claude", f'echo "$@" >> {calls}')

    async def main() -> None:
        handle = await provider.create()
        handle.env.set({"PATH": f"{bindir}:{os.environ['PATH']}"})
        try:
            skill = git_skill(url)
            ws = mcp_workspace(
                create_secrets(TOKEN=unique("t"), KEY=unique("k")),
                skills=[skill, agent_skill("tanstack")],
                plugins=["@acme/plugin"],
            )
            await handle.git.clone(url, git_skill_dir(ws.root, skill))
            projection = projection_for(ws, workspace_hash(ws))
            await handle.fs.write(projection.marker_path, "")
            for harness in HARNESSES:
                await project_workspace(handle, projection, harness)
            root = Path(handle.workspace_root)
            for skills_dir in (".claude/skills", ".codex/skills", ".grok/skills"):
                assert not (root / skills_dir).exists()
            # The MCP configs are still written: they never wait on the marker.
            for harness in HARNESSES:
                assert (root / MCP_FILES[harness]).exists()
        finally:
            await handle.destroy()

    asyncio.run(main())
    assert not calls.exists()
    assert warnings_of(caplog) == []


# -- A18: file formats, other content kept -----------------------------------------------------------


def test_codex_toml_has_the_server_table_and_keeps_the_rest(provider):
    token = unique("codex")

    async def main() -> None:
        handle = await provider.create()
        try:
            await handle.fs.write(
                "/workspace/.codex/config.toml",
                'model = "gpt-5.5"\n\n[model_providers.fake]\nbase_url = "http://127.0.0.1:1/v1"\n\n'
                '[mcp_servers.issues]\nurl = "http://stale"\nstartup_timeout_sec = 5\n\n'
                '[mcp_servers.other]\nurl = "http://other"\n',
            )
            ws = mcp_workspace(create_secrets(TOKEN=token, KEY="k-" + token))
            await project_workspace(handle, projection_for(ws, workspace_hash(ws)), "codex")
            text = Path(handle.workspace_root, ".codex/config.toml").read_text()
            doc = tomllib.loads(text)
            assert doc["mcp_servers"]["issues"] == {
                "url": "https://mcp.example.com/mcp",
                "http_headers": {"Authorization": f"Bearer {token}", "X-Api-Key": "k-" + token, "X-Plain": "literal"},
            }
            assert doc["mcp_servers"]["other"] == {"url": "http://other"}
            assert doc["model"] == "gpt-5.5"
            assert doc["model_providers"] == {"fake": {"base_url": "http://127.0.0.1:1/v1"}}
            assert "http_headers = { Authorization = " in text  # inline, as Codex's docs write it
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_opencode_json_replaces_only_its_servers_and_keeps_other_keys(provider, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    token = unique("oc")

    async def main() -> None:
        handle = await provider.create()
        try:
            existing = {
                "model": "fake/fake-model",
                "provider": {"fake": {"options": {"baseURL": "http://127.0.0.1:1/v1"}}},
                "mcp": {"issues": {"type": "local", "command": ["stale"]}, "other": {"type": "remote", "url": "u"}},
            }
            await handle.fs.write("/workspace/opencode.json", json.dumps(existing))
            ws = mcp_workspace(create_secrets(TOKEN=token, KEY=unique("k")))
            projection = projection_for(ws, workspace_hash(ws))
            await project_workspace(handle, projection, "opencode")
            doc = json.loads(Path(handle.workspace_root, "opencode.json").read_text())
            assert doc["model"] == existing["model"] and doc["provider"] == existing["provider"]
            assert doc["mcp"]["other"] == existing["mcp"]["other"]
            issues = doc["mcp"]["issues"]
            assert issues["type"] == "remote" and issues["enabled"] is True
            assert issues["url"] == "https://mcp.example.com/mcp"
            assert issues["headers"]["Authorization"] == f"Bearer {token}"
            assert warnings_of(caplog) == []

            # Not JSON any more: written fresh, with one warning that names the file, never its content.
            await handle.fs.write("/workspace/opencode.json", "{ not json")
            await project_workspace(handle, projection, "opencode")
            await project_workspace(handle, projection, "opencode")
            doc = json.loads(Path(handle.workspace_root, "opencode.json").read_text())
            assert list(doc) == ["mcp"] and list(doc["mcp"]) == ["issues"]
            [warning] = warnings_of(caplog)
            assert "opencode" in warning and "opencode.json" in warning and token not in warning
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_grok_toml_keeps_the_bridge_table_and_replaces_same_named_tables(provider, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    token = unique("grok")
    bridge = (
        'model = "grok-4"\n\n[mcp_servers.boxwright]\nurl = "http://127.0.0.1:9/mcp"\nenabled = true\n\n'
        '[mcp_servers.boxwright.headers]\nAuthorization = "Bearer bridge-token"\n\n'
        '[mcp_servers.issues]\nurl = "http://stale"\n\n[mcp_servers.issues.headers]\nOld = "x"\n'
    )

    async def main() -> None:
        handle = await provider.create()
        try:
            await handle.fs.write("/workspace/.grok/config.toml", bridge)
            ws = mcp_workspace(create_secrets(TOKEN=token, KEY=unique("k")))
            projection = projection_for(ws, workspace_hash(ws))
            await project_workspace(handle, projection, "grok-build")
            path = Path(handle.workspace_root, ".grok/config.toml")
            doc = tomllib.loads(path.read_text())
            assert doc["model"] == "grok-4"
            assert doc["mcp_servers"]["boxwright"] == {
                "url": "http://127.0.0.1:9/mcp",
                "enabled": True,
                "headers": {"Authorization": "Bearer bridge-token"},
            }
            issues = doc["mcp_servers"]["issues"]
            assert issues["url"] == "https://mcp.example.com/mcp" and issues["enabled"] is True
            assert issues["headers"] == {
                "Authorization": f"Bearer {token}",
                "X-Api-Key": issues["headers"]["X-Api-Key"],
                "X-Plain": "literal",
            }
            assert "[mcp_servers.issues.headers]" in path.read_text()  # the subtable shape of R21
            assert warnings_of(caplog) == []

            path.write_text("[mcp_servers.boxwright\nbroken")
            await project_workspace(handle, projection, "grok-build")
            assert list(tomllib.loads(path.read_text())["mcp_servers"]) == ["issues"]
            [warning] = warnings_of(caplog)
            assert "grok-build" in warning and ".grok/config.toml" in warning
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_a_harness_adds_its_bridge_to_the_projected_file_without_dropping_workspace_servers():
    projected = render_mcp_config("grok-build", None, {"issues": McpServer("https://i", {"X": "1"})})
    both = render_mcp_config(
        "grok-build", projected, {"boxwright": McpServer("http://127.0.0.1:9/mcp", {"Authorization": "Bearer b"})}
    )
    servers = tomllib.loads(both)["mcp_servers"]
    assert servers["issues"] == {"url": "https://i", "enabled": True, "headers": {"X": "1"}}
    assert servers["boxwright"]["headers"] == {"Authorization": "Bearer b"}
    with pytest.raises(ValueError, match="gemini"):
        render_mcp_config("gemini", None, {})


def test_no_mcp_skills_writes_no_mcp_config(provider):
    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace()
            for harness in HARNESSES:
                await project_workspace(handle, projection_for(ws, workspace_hash(ws)), harness)
            assert sorted(os.listdir(handle.workspace_root)) == [f".boxwright-projected-{workspace_hash(ws)}"]
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_an_mcp_server_without_url_is_skipped_with_a_warning(provider, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace(skills=[mcp_skill("nourl", {"headers": {}}), mcp_skill("ok", {"url": "http://u"})])
            await project_workspace(handle, projection_for(ws, "h"), "claude-code")
            doc = json.loads(Path(handle.workspace_root, ".mcp.json").read_text())
            assert list(doc["mcpServers"]) == ["ok"]
        finally:
            await handle.destroy()

    asyncio.run(main())
    [warning] = warnings_of(caplog)
    assert "'nourl'" in warning and "claude-code" in warning


# -- A19: skill discovery and links ------------------------------------------------------------------

PACK = {
    "README.md": "pack\n",
    "skills/alpha/SKILL.md": "# alpha\n",
    "skills/alpha/nested/SKILL.md": "# not a separate skill: alpha holds it\n",
    "skills/beta/skill.md": "# beta, lower-case name\n",
    "tools/x/a/b/c/delta/SKILL.md": "# delta at depth 6\n",
    "tools/x/a/b/c/d/too-deep/SKILL.md": "# depth 7: not looked at\n",
    ".hidden/eps/SKILL.md": "# dot-folder: skipped\n",
    "node_modules/zeta/SKILL.md": "# node_modules: skipped\n",
}


def test_discover_skill_folders_finds_nested_skills_within_depth_six(provider, tmp_path):
    url = make_repo(tmp_path / "pack", PACK)

    async def main() -> list[str]:
        handle = await provider.create()
        try:
            await handle.git.clone(url, "/workspace/.boxwright-skills/pack")
            return await discover_skill_folders(handle, "/workspace/.boxwright-skills/pack")
        finally:
            await handle.destroy()

    found = asyncio.run(main())
    base = "/workspace/.boxwright-skills/pack"
    assert found == [f"{base}/skills/alpha", f"{base}/skills/beta", f"{base}/tools/x/a/b/c/delta"]


def test_git_skills_are_linked_nested_pack_root_skill_and_plain_clone(provider, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    pack = make_repo(tmp_path / "pack", PACK)
    flat = make_repo(tmp_path / "flat", {"SKILL.md": "# flat\n", "sub/SKILL.md": "# below a skill\n"})
    plain = make_repo(tmp_path / "plain.git", {"notes.md": "no skill file\n"})
    custom = make_repo(tmp_path / "custom", {"SKILL.md": "# custom\n"})

    async def main() -> None:
        handle = await provider.create()
        try:
            skills = [
                git_skill(pack),
                git_skill(flat),
                git_skill(plain),
                git_skill(custom, into="/workspace/tools/mine"),
            ]
            ws = define_workspace(skills=skills)
            for skill in skills:
                await handle.git.clone(skill.repo, git_skill_dir(ws.root, skill))
            await project_workspace(handle, projection_for(ws, workspace_hash(ws)), "claude-code")
            root = Path(handle.workspace_root)
            links = root / ".claude/skills"
            assert sorted(os.listdir(links)) == ["alpha", "beta", "delta", "flat", "mine", "plain"]
            clones = root / ".boxwright-skills"
            expected = {
                "alpha": clones / "pack/skills/alpha",
                "beta": clones / "pack/skills/beta",
                "delta": clones / "pack/tools/x/a/b/c/delta",
                "flat": clones / "flat",
                "plain": clones / "plain",
                "mine": root / "tools/mine",
            }
            for name, target in expected.items():
                assert (links / name).is_symlink()
                # Relative, so the link holds wherever the workspace is mounted or copied.
                assert not os.readlink(links / name).startswith("/")
                assert (links / name).resolve() == target.resolve()
            shown = await handle.process.exec("cat .claude/skills/alpha/SKILL.md", ProcessOptions(cwd="/workspace"))
            assert shown.stdout == "# alpha\n"
        finally:
            await handle.destroy()

    asyncio.run(main())
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(("harness", "skills_dir"), [("codex", ".codex/skills"), ("grok-build", ".grok/skills")])
def test_codex_and_grok_link_into_their_own_skills_dirs(provider, tmp_path, harness, skills_dir):
    url = make_repo(tmp_path / "pack", {"skills/alpha/SKILL.md": "# alpha\n"})

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace(skills=[git_skill(url)])
            await handle.git.clone(url, git_skill_dir(ws.root, ws.skills[0]))
            await project_workspace(handle, projection_for(ws, workspace_hash(ws)), harness)
            link = Path(handle.workspace_root, skills_dir, "alpha")
            assert link.is_symlink() and (link / "SKILL.md").read_text() == "# alpha\n"
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_a_failed_ln_falls_back_to_a_copy_and_a_failed_copy_warns(provider, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    url = make_repo(tmp_path / "pack", {"skills/alpha/SKILL.md": "# alpha\n"})
    no_ln = tmp_path / "no-ln"
    fake_program(no_ln, "ln", "echo 'ln: symlinks not supported' >&2; exit 1")
    no_cp = tmp_path / "no-cp"
    fake_program(no_cp, "ln", "exit 1")
    fake_program(no_cp, "cp", "echo 'cp: read-only file system' >&2; exit 2")

    async def main() -> None:
        for bindir, harness in ((no_ln, "claude-code"), (no_cp, "codex")):
            handle = await provider.create()
            handle.env.set({"PATH": f"{bindir}:{os.environ['PATH']}"})
            try:
                ws = define_workspace(skills=[git_skill(url)])
                await handle.git.clone(url, git_skill_dir(ws.root, ws.skills[0]))
                projection = projection_for(ws, workspace_hash(ws))
                await project_workspace(handle, projection, harness)
                dest = Path(handle.workspace_root, TARGETS[harness].skills_dir or "", "alpha")
                if bindir == no_ln:
                    assert dest.is_dir() and not dest.is_symlink()
                    assert (dest / "SKILL.md").read_text() == "# alpha\n"
                else:
                    assert not dest.exists()
                assert await handle.fs.exists(projection.marker_path)
            finally:
                await handle.destroy()

    asyncio.run(main())
    [warning] = warnings_of(caplog)
    assert "codex" in warning and "skills/alpha" in warning and "read-only file system" in warning


def test_existing_skill_destinations_are_kept(provider, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    url = make_repo(tmp_path / "pack", {"skills/alpha/SKILL.md": "# alpha\n", "skills/beta/SKILL.md": "# beta\n"})

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace(skills=[git_skill(url)])
            await handle.git.clone(url, git_skill_dir(ws.root, ws.skills[0]))
            links = Path(handle.workspace_root, ".claude/skills")
            (links / "alpha").mkdir(parents=True)
            (links / "alpha/SKILL.md").write_text("# the user's own alpha\n")
            # A link left by a projection that stopped before writing its marker.
            os.symlink("../../.boxwright-skills/pack/skills/beta", links / "beta")
            await project_workspace(handle, projection_for(ws, workspace_hash(ws)), "claude-code")
            assert (links / "alpha/SKILL.md").read_text() == "# the user's own alpha\n"
            assert (links / "beta/SKILL.md").read_text() == "# beta\n"
        finally:
            await handle.destroy()

    asyncio.run(main())
    [warning] = warnings_of(caplog)
    assert "already exists" in warning and "alpha" in warning


def test_a_missing_clone_warns_instead_of_linking_nothing(provider, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace(skills=[git_skill("owner/never-cloned")])
            await project_workspace(handle, projection_for(ws, "h"), "claude-code")
            assert not Path(handle.workspace_root, ".claude/skills/never-cloned").exists()
        finally:
            await handle.destroy()

    asyncio.run(main())
    [warning] = warnings_of(caplog)
    assert "owner/never-cloned" in warning and "does not exist" in warning


# -- A20: unsupported concepts warn once, never raise ------------------------------------------------


@pytest.mark.parametrize("harness", ["codex", "opencode", "grok-build"])
def test_plugins_and_agent_skills_warn_once_per_item_even_over_two_runs(provider, tmp_path, harness, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    url = make_repo(tmp_path / "pack", {"SKILL.md": "# pack\n"})

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = define_workspace(skills=[agent_skill("tanstack"), git_skill(url)], plugins=["@acme/plugin-foo", "bar"])
            await handle.git.clone(url, git_skill_dir(ws.root, ws.skills[1]))
            projection = projection_for(ws, workspace_hash(ws))
            await project_workspace(handle, projection, harness)
            await handle.fs.remove(projection.marker_path)  # the once-per-sandbox steps run again...
            await project_workspace(handle, projection, harness)
            assert await handle.fs.exists(projection.marker_path)
            other = await provider.create()  # ...and a new sandbox is told again
            try:
                await other.git.clone(url, git_skill_dir(ws.root, ws.skills[1]))
                await project_workspace(other, projection, harness)
            finally:
                await other.destroy()
        finally:
            await handle.destroy()

    asyncio.run(main())
    warned = warnings_of(caplog)
    items = ["'tanstack'", "'@acme/plugin-foo'", "'bar'"] + ([f"{url!r}"] if harness == "opencode" else [])
    assert len(warned) == 2 * len(items)
    for item in items:
        matching = [w for w in warned if item in w]
        assert len(matching) == 2, (item, warned)
        assert all(w.startswith(f"{harness}: ") for w in matching)


def test_claude_installs_plugins_and_warns_once_for_a_failed_install(provider, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bindir = tmp_path / "bin"
    calls = tmp_path / "calls"
    fake_program(
        bindir,
        "claude",
        f'echo "$# $@ cwd=$(pwd)" >> {calls}\n'
        '[ "$3" = broken ] && { echo "no marketplace has broken" >&2; exit 1; }\nexit 0',
    )

    async def main() -> None:
        handle = await provider.create()
        handle.env.set({"PATH": f"{bindir}:{os.environ['PATH']}"})
        try:
            ws = define_workspace(skills=[agent_skill("tanstack")], plugins=["@acme/plugin foo", "broken"])
            projection = projection_for(ws, workspace_hash(ws))
            await project_workspace(handle, projection, "claude-code")
            await handle.fs.remove(projection.marker_path)
            await project_workspace(handle, projection, "claude-code")
            return handle.workspace_root
        finally:
            await handle.destroy()

    root = asyncio.run(main())
    lines = calls.read_text().splitlines()
    # One argument each, quoted: a space in a plugin name stays inside it.
    assert (
        lines
        == [
            f"3 plugin install @acme/plugin foo cwd={root}",
            f"3 plugin install broken cwd={root}",
        ]
        * 2
    )
    warned = warnings_of(caplog)
    assert len(warned) == 2
    [plugin] = [w for w in warned if "'broken'" in w]
    assert plugin.startswith("claude-code: ") and "exited 1" in plugin and "no marketplace" in plugin
    [agent] = [w for w in warned if "'tanstack'" in w]
    assert agent.startswith("claude-code: ")


def test_an_unknown_harness_warns_once_and_writes_nothing(provider, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = mcp_workspace(create_secrets(TOKEN=unique("t"), KEY=unique("k")), plugins=["p"])
            projection = projection_for(ws, workspace_hash(ws))
            await project_workspace(handle, projection, "gemini-cli")
            await project_workspace(handle, projection, "gemini-cli")
            assert os.listdir(handle.workspace_root) == []
        finally:
            await handle.destroy()

    asyncio.run(main())
    [warning] = warnings_of(caplog)
    assert "'gemini-cli'" in warning


# -- the TOML writer --------------------------------------------------------------------------------


def test_toml_dumps_round_trips_the_shapes_a_config_holds():
    doc = {
        "model": "gpt-5.5",
        'quote"key': 'tab\there "q" back\\slash\nnew\x01ctl\x7fdel é 😀',
        "": "empty key",
        "n": -42,
        "big": 2**62,
        "f": 1.5e-07,
        "neg_zero": -0.0,
        "inf": float("-inf"),
        "flag": False,
        "when": datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.UTC),
        "local": datetime.datetime(1979, 5, 27, 7, 32, 0, 999999),
        "day": datetime.date(2024, 2, 29),
        "at": datetime.time(7, 32),
        "list": [1, "two", [3.0, True], {"inline": {"deep": "x"}}, []],
        "empty": {},
        "mcp_servers": {
            "my.server": {"url": "u", "headers": {"A B": "c"}},
            "plain": {"url": "u2", "tools": {"t": {"approval_mode": "approve"}}},
        },
        "profiles": [{"name": "a", "sub": {"x": 1}}, {"name": "b"}],
        "only_tables": {"a": {"b": {"c": 1}}},
    }
    text = toml_dumps(doc)
    assert tomllib.loads(text) == doc
    assert math.isnan(tomllib.loads(toml_dumps({"x": float("nan")}))["x"])
    assert toml_dumps({}) == ""


def test_toml_dumps_writes_an_inline_table_on_one_line():
    text = toml_dumps({"s": {"http_headers": InlineTable({"Authorization": 'Bearer "x"', "X-K": "v"})}})
    assert text == '[s]\nhttp_headers = { Authorization = "Bearer \\"x\\"", X-K = "v" }\n'
    assert tomllib.loads(text) == {"s": {"http_headers": {"Authorization": 'Bearer "x"', "X-K": "v"}}}


_keys = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_scalars = (
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.booleans()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5))
def test_toml_dumps_round_trips_any_document(doc):
    assert tomllib.loads(toml_dumps(doc)) == doc
