"""Finding an agent CLI on the host: what the sandbox must be shown, and how it runs it by absolute path."""

from __future__ import annotations

import os
from pathlib import Path

from boxwright.host_paths import find_host_command, host_directory_of


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_an_npm_link_binds_the_outermost_node_modules_and_runs_the_script_with_its_interpreter(
    tmp_path: Path,
) -> None:
    modules = tmp_path / "agents" / "node_modules"
    script = _executable(modules / "@acme" / "cli" / "bin" / "cli.js", "#!/usr/bin/env node\nconsole.log(1)\n")
    node = _executable(tmp_path / "node-22" / "bin" / "node", "\x7fELF")  # where nvm would put it
    link = modules / ".bin" / "acme"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(script, link.parent))
    found = find_host_command("acme", f"{link.parent}:{node.parent}")
    assert found is not None
    assert found.host_path == str(link)
    # node named through `env`, resolved on the host PATH: the sandbox's own PATH need not find it.
    assert found.argv == (str(node), str(script))
    assert found.needs == (str(modules), str(node))


def test_a_native_binary_outside_node_modules_is_bound_as_the_one_file_it_is(tmp_path: Path) -> None:
    binary = _executable(tmp_path / "home" / "bin" / "claude", "\x7fELF not a script")
    found = find_host_command("claude", str(binary.parent))
    assert found is not None
    assert found.argv == (str(binary),)
    assert found.needs == (str(binary),)  # never its folder: ~/bin would show the agent the rest of it


def test_a_script_with_an_absolute_interpreter_keeps_it_and_its_arguments(tmp_path: Path) -> None:
    script = _executable(tmp_path / "bin" / "tool", "#!/bin/sh -e\necho hi\n")
    found = find_host_command("tool", str(script.parent))
    assert found is not None
    assert found.argv == (os.path.realpath("/bin/sh"), "-e", str(script))


def test_a_command_the_host_does_not_have_is_none(tmp_path: Path) -> None:
    assert find_host_command("no-such-agent-cli", str(tmp_path)) is None


def test_local_repository_urls_name_their_host_directory(tmp_path: Path) -> None:
    assert host_directory_of(f"file://{tmp_path}") == str(tmp_path.resolve())
    assert host_directory_of(str(tmp_path)) == str(tmp_path.resolve())
    assert host_directory_of("https://github.com/o/r.git") is None
    assert host_directory_of(f"file://{tmp_path}/missing") is None
