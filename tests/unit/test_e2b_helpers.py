"""The cloud providers' pure helpers: E2B's signal-death exit codes (K5), the /workspace mapping, Daytona's
snapshot names, and the shell quoting of values the fs helpers pass (never spliced into a script)."""

from __future__ import annotations

import pytest

from boxwright.providers._remote import map_path, ownership, script
from boxwright.providers.daytona import _snapshot_name
from boxwright.providers.e2b import _exit_code


def test_envd_signal_deaths_become_128_plus_the_signal_never_0() -> None:
    assert _exit_code(0, None) == 0
    assert _exit_code(7, None) == 7
    assert _exit_code(-1, "signal: killed") == 137
    assert _exit_code(-1, "signal: terminated") == 143
    assert _exit_code(-1, None) == 137  # an unknown signal death is still a death, not a success


def test_workspace_paths_map_onto_the_workdir_and_others_stay_the_vms() -> None:
    root = "/home/user/workspace"
    assert map_path("/workspace", root) == root
    assert map_path("/workspace/a/b", root) == f"{root}/a/b"
    assert map_path("a/b", root) == f"{root}/a/b"
    assert map_path("", root) == root
    assert map_path("/etc/hosts", root) == "/etc/hosts"
    assert map_path("/workspacex", root) == "/workspacex"
    with pytest.raises(ValueError):
        map_path("/workspace/nul\x00", root)


def test_daytona_snapshot_names_use_hyphens_only() -> None:
    assert _snapshot_name("ABCdef0123456789", "after setup!") == "boxwright-abcdef012345-after-setup"
    assert _snapshot_name("abc", None) == "boxwright-abc-snap"
    assert len(_snapshot_name("x" * 40, "l" * 100)) <= 63


def test_fs_values_are_positional_arguments_of_a_fixed_script() -> None:
    line = script("read", 'base64 -w0 -- "$1"', "/tmp/it's $(here)")
    assert line == "sh -c 'base64 -w0 -- \"$1\"' 'read' '/tmp/it'\"'\"'s $(here)'"


def test_ownership_labels_name_the_host_the_key_and_the_run() -> None:
    labels = ownership("key1", "run1", 60.0, {"team": "a"})
    assert labels["boxwright.managed"] == "1" and labels["boxwright.sandbox"] == "key1"
    assert labels["boxwright.run"] == "run1" and labels["team"] == "a" and labels["boxwright.owner"]
