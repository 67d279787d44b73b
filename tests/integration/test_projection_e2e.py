"""Projection end to end: real bootstrap clones, then projection for every harness, in bubblewrap and local-process.

The last tests hand the written files to the real agent CLIs when they are on
PATH (they are large npm installs, so they are skipped, with the reason, when absent).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest

from boxwright.projection import project_workspace, projection_for
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import ProcessOptions
from boxwright.secrets import bearer, create_secrets
from boxwright.workspace import agent_skill, bootstrap, define_workspace, git_skill, mcp_skill, workspace_hash
from tests.support.require import agent_cli, missing

LOGGER = "boxwright.projection"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def skills_repo(tmp_path) -> Path:
    repo = tmp_path / "repos" / "skill-pack"
    for rel, text in {
        "skills/alpha/SKILL.md": "---\nname: alpha\ndescription: alpha skill\n---\nalpha body\n",
        "skills/beta/skill.md": "---\nname: beta\ndescription: beta skill\n---\nbeta body\n",
        "node_modules/zeta/SKILL.md": "skipped\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pack")
    return repo


@pytest.fixture(params=["local-process", "bubblewrap"])
def provider(request, tmp_path, skills_repo):
    if request.param == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "lp")
    found = probe()
    if not found.available:
        missing(f"bubblewrap unavailable: {found.reason}")
    # The pack lives on the host; the sandbox sees it read-only to clone it.
    return bubblewrap_sandbox(base_dir=tmp_path / "bw", ro_binds=[str(skills_repo.parent)])


def workspace_with(skills_repo: Path, token: str, key: str):
    secrets = create_secrets(TOKEN=token, KEY=key)
    return define_workspace(
        secrets=secrets,
        instructions="Run the tests.",
        plugins=["@acme/plugin"],
        skills=[
            git_skill(f"file://{skills_repo}"),
            agent_skill("tanstack"),
            mcp_skill(
                "issues",
                {
                    "url": "http://127.0.0.1:18110/mcp",
                    "headers": {"Authorization": bearer(secrets.TOKEN), "X": secrets.KEY},
                },
            ),
        ],
    )


def test_bootstrap_then_projection_for_every_harness(provider, skills_repo, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    token, key, rotated = (f"{p}-{uuid.uuid4().hex}" for p in ("tok", "key", "rot"))

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = workspace_with(skills_repo, token, key)
            await bootstrap(handle, ws)
            projection = projection_for(ws, workspace_hash(ws))
            for harness in ("claude-code", "codex", "grok-build", "opencode"):
                await project_workspace(handle, projection, harness)
                await handle.fs.remove(projection.marker_path)
            await handle.fs.write(projection.marker_path, "")

            # Inside the sandbox the links resolve: relative targets hold at /workspace and on the host.
            for skills_dir in (".claude/skills", ".codex/skills", ".grok/skills"):
                at_root = ProcessOptions(cwd="/workspace")
                shown = await handle.process.exec(
                    f"cat {skills_dir}/alpha/SKILL.md {skills_dir}/beta/skill.md", at_root
                )
                assert shown.exit_code == 0, shown.stderr
                assert "alpha body" in shown.stdout and "beta body" in shown.stdout
                assert (await handle.process.exec(f"ls {skills_dir}", at_root)).stdout == "alpha\nbeta\n"

            root = Path(handle.workspace_root)
            claude = json.loads((root / ".mcp.json").read_text())["mcpServers"]["issues"]
            assert claude["headers"] == {"Authorization": f"Bearer {token}", "X": key}
            codex = tomllib.loads((root / ".codex/config.toml").read_text())["mcp_servers"]["issues"]
            assert codex["http_headers"]["Authorization"] == f"Bearer {token}"
            grok = tomllib.loads((root / ".grok/config.toml").read_text())["mcp_servers"]["issues"]
            assert grok["headers"]["X"] == key and grok["enabled"] is True
            opencode = json.loads((root / "opencode.json").read_text())["mcp"]["issues"]
            assert opencode["type"] == "remote" and opencode["headers"]["Authorization"] == f"Bearer {token}"

            # Rotation with the marker present: configs follow the new value, nothing else runs again.
            caplog.clear()
            again = projection_for(workspace_with(skills_repo, rotated, key), workspace_hash(ws))
            for harness in ("claude-code", "codex", "grok-build", "opencode"):
                await project_workspace(handle, again, harness)
            for name in (".mcp.json", ".codex/config.toml", ".grok/config.toml", "opencode.json"):
                text = (root / name).read_text()
                assert f"Bearer {rotated}" in text and token not in text, name
            assert [r for r in caplog.records if r.name == LOGGER] == []
        finally:
            await handle.destroy()

    asyncio.run(main())


def test_warnings_name_harness_and_item_and_come_once(provider, skills_repo, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def main() -> None:
        handle = await provider.create()
        try:
            ws = workspace_with(skills_repo, uuid.uuid4().hex, uuid.uuid4().hex)
            await bootstrap(handle, ws)
            projection = projection_for(ws, workspace_hash(ws))
            for _ in range(2):
                for harness in ("claude-code", "codex", "opencode"):
                    await project_workspace(handle, projection, harness)
                    await handle.fs.remove(projection.marker_path)
        finally:
            await handle.destroy()

    asyncio.run(main())
    # Only the projection's own records: under load asyncio and the providers may warn too (a slow callback).
    ours = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    warned = sorted(m.split(":")[0] + " " + m.split("'")[1] for m in ours)
    # `claude` is not installed in the sandbox, so its plugin install fails and warns like the others.
    assert warned == sorted(
        [
            "claude-code tanstack",
            "claude-code @acme/plugin",
            "codex tanstack",
            "codex @acme/plugin",
            "opencode tanstack",
            "opencode @acme/plugin",
            f"opencode file://{skills_repo}",
        ]
    )


# -- the real CLIs read what projection wrote ----------------------------------------------------------


def _cli(name: str) -> str:
    return agent_cli(name)


def _projected(tmp_path: Path, harness: str, token: str) -> Path:
    async def main() -> Path:
        handle = await local_process_sandbox(tmp_path / "ws", remove_on_destroy=False).create()
        secrets = create_secrets(TOKEN=token)
        ws = define_workspace(
            secrets=secrets,
            skills=[
                mcp_skill(
                    "issues", {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": bearer(secrets.TOKEN)}}
                )
            ],
        )
        await project_workspace(handle, projection_for(ws, workspace_hash(ws)), harness)
        return Path(handle.workspace_root)

    return asyncio.run(main())


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_codex_reads_the_projected_config_toml_in_a_trusted_project(tmp_path):
    codex = _cli("codex")
    token = uuid.uuid4().hex
    root = _projected(tmp_path, "codex", token)
    home = tmp_path / "codex-home"
    home.mkdir()
    # Codex reads a project's .codex/config.toml only for a trusted project (a `-c` override does not count).
    (home / "config.toml").write_text(f'[projects."{root}"]\ntrust_level = "trusted"\n')
    out = _run([codex, "mcp", "list", "--json"], root, {"CODEX_HOME": str(home), "HOME": str(home)})
    [server] = [s for s in json.loads(out.stdout) if s["name"] == "issues"]
    assert server["transport"]["url"] == "http://127.0.0.1:9/mcp"
    assert server["transport"]["http_headers"] == {"Authorization": f"Bearer {token}"}


def test_opencode_reads_the_projected_opencode_json(tmp_path):
    opencode = _cli("opencode")
    root = _projected(tmp_path, "opencode", uuid.uuid4().hex)
    home = tmp_path / "oc-home"
    env = {"HOME": str(home), "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    env.update({f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")})
    out = _run([opencode, "debug", "config"], root, env)
    config = json.loads(out.stdout[out.stdout.index("{") :])
    assert config["mcp"]["issues"]["type"] == "remote"
    assert config["mcp"]["issues"]["url"] == "http://127.0.0.1:9/mcp"


def test_claude_reads_the_projected_mcp_json(tmp_path):
    claude = _cli("claude")
    token = uuid.uuid4().hex
    root = _projected(tmp_path, "claude-code", token)
    home = tmp_path / "claude-home"
    home.mkdir()
    env = {"HOME": str(home), "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    out = _run([claude, "mcp", "get", "issues"], root, env)
    assert "Project config" in out.stdout and "http://127.0.0.1:9/mcp" in out.stdout
    assert f"Authorization: Bearer {token}" in out.stdout
