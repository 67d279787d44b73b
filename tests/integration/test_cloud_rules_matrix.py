"""Issue 17's per-provider table, pinned: the seed's two flags, the journal strategy they imply, the live
named skip, the doctor row, the README row and each fake's record of what it follows.

The seed's ``writableStdin`` and ``killableProcesses`` tables (with their reasons) are copied here,
because CI's clean clone has no seed: a flag is ``true`` only where the seed says it was measured
(Sprites' unverified ``true`` ships ``false``, spec §2.5). A provider that flips a flag, a registry
entry whose journal would follow on a provider that cannot kill, a missing doctor or README row, or
a fake whose docstring names another SDK version than the installed one fails here. Cheap: nothing
is started (constructors make no call; the flags are static).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from boxwright.cloud_doctor import cloud_checks
from boxwright.sandbox import journal_read_strategy as strategy_for_capabilities
from tests.support.cloud_providers import CLOUD_PROVIDERS, live_problem
from tests.support.require import missing

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"

# provider -> (writable_stdin, killable_processes, the seed's reason for the kill flag)
SEED: dict[str, tuple[bool, bool, str]] = {
    "e2b": (True, True, "measured: setsid group leader, kill -KILL -- -<pid> in the sandbox"),
    "daytona": (True, False, "kill() only aborts the client poll; deleteSession later; not measured"),
    "railway": (True, True, "measured: TERM to the group, KILL after 2 s, confirmed remote exit"),
    "upstash-box": (True, True, "measured: the box agent signals the process tree"),
    "blaxel": (False, True, "process-group supervisor, the remote reaper waited for"),
    "boxd": (True, True, "measured: setsid group signalled in the machine, KILL, kill -0 check"),
    "sbx": (False, False, "not measured until sbx login"),
    "cloudflare": (False, False, "kill() does nothing: no AbortSignal crosses Workers RPC"),
}

# provider -> (module, constructor, options that make no call)
BUILD: dict[str, tuple[str, str, dict[str, Any]]] = {
    "e2b": ("boxwright.providers.e2b", "e2b_sandbox", {"api_key": "e2b_x"}),
    "daytona": ("boxwright.providers.daytona", "daytona_sandbox", {"api_key": "dtn_x"}),
    "railway": ("boxwright.providers.railway", "railway_sandbox", {"token": "x", "environment_id": "env"}),
    "upstash-box": ("boxwright.providers.upstash_box", "upstash_box_sandbox", {"api_key": "x"}),
    # No credentials: Blaxel's auth is process-global, a provider with some would bind this process's SDK.
    "blaxel": ("boxwright.providers.blaxel", "blaxel_sandbox", {}),
    "boxd": ("boxwright.providers.boxd", "boxd_sandbox", {"token": "x"}),
    "sbx": ("boxwright.providers.sbx", "sbx_sandbox", {"workspace_dir": "/nonexistent"}),
    "cloudflare": ("boxwright.providers.cloudflare", "cloudflare_sandbox", {"worker_url": "http://x", "token": "x"}),
}

# provider -> (fake module, the SDK distribution it follows, or None: what it follows instead)
FAKES: dict[str, tuple[str, str | None, str]] = {
    "e2b": ("tests.support.fake_cloud.e2b", "e2b", "/v2/sandboxes"),
    "daytona": ("tests.support.fake_cloud.daytona", "daytona", "/sandbox"),
    "upstash-box": ("tests.support.fake_cloud.upstash_box", "upstash-box", "/v2/box"),
    "blaxel": ("tests.support.fake_cloud.blaxel", "blaxel", "/sandboxes"),
    "boxd": ("tests.support.fake_cloud.boxd", "boxd", "CreateVm"),
    "railway": ("tests.support.fake_cloud.railway", None, "sandboxCreate"),
    "sbx": ("tests.support.fake_cloud.sbx_daemon", None, "create --name"),
    "cloudflare": ("tests.support.fake_cloud.cloudflare", None, "/exec/stream"),
}


def _provider(name: str) -> Any:
    module, function, options = BUILD[name]
    sdk = CLOUD_PROVIDERS[name].sdk
    if importlib.util.find_spec(sdk) is None:
        missing(f"the `{sdk}` SDK of {name} is not installed (pip install -e '.[dev]')")
    build: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return build(**options)


def test_every_cloud_provider_of_the_registry_is_in_the_table() -> None:
    # Vercel and Sprites join this table when their providers land.
    assert set(SEED) <= set(CLOUD_PROVIDERS), set(SEED) - set(CLOUD_PROVIDERS)
    assert set(BUILD) == set(SEED) and set(FAKES) == set(SEED)


@pytest.mark.parametrize("name", sorted(SEED))
def test_the_flags_are_the_seeds_and_the_journal_follows_only_where_kill_is_measured(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("BL_API_KEY", "BL_WORKSPACE"):  # nothing may bind Blaxel's process-global auth here
        monkeypatch.delenv(var, raising=False)
    stdin, killable, why = SEED[name]
    caps = _provider(name).capabilities()
    assert caps.writable_stdin is stdin, f"{name}: writable_stdin must be {stdin} (seed)"
    assert caps.killable_processes is killable, f"{name}: killable_processes must be {killable} (seed: {why})"
    follows = CLOUD_PROVIDERS[name].follow_unsupported is None and CLOUD_PROVIDERS[name].journal_skip is None
    expected = "follow" if killable and caps.background_processes else "poll"
    assert strategy_for_capabilities(caps) == expected, name
    # The registry's journal declaration agrees: a provider that cannot kill never gets a `tail -f`.
    assert follows == (expected == "follow"), f"{name}: follow_unsupported disagrees with the flags"


@pytest.mark.parametrize("name", sorted(SEED))
def test_the_live_suite_is_a_named_skip_naming_each_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = CLOUD_PROVIDERS[name]
    for var in entry.env:
        for one in var.split("|"):
            monkeypatch.delenv(one, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # sbx: no CLI, so its probe names that
    problem = live_problem(name)
    assert problem is not None and problem.startswith(f"live {name} needs"), problem
    for var in entry.env:
        assert all(one in problem for one in var.split("|")), (var, problem)


def test_doctor_has_a_row_per_provider_naming_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    for entry in CLOUD_PROVIDERS.values():
        for var in entry.env:
            for one in var.split("|"):
                monkeypatch.delenv(one, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    rows = {name: (ok, detail) for _kind, name, ok, detail in cloud_checks()}
    assert set(SEED) <= set(rows), set(SEED) - set(rows)
    for name in SEED:
        ok, detail = rows[name]
        assert not ok, (name, detail)
        needed = [one for var in CLOUD_PROVIDERS[name].env for one in var.split("|")] or ["sbx"]
        assert all(one in detail for one in needed) or "not installed" in detail, (name, detail)


@pytest.mark.parametrize("name", sorted(SEED))
def test_the_readme_row_states_the_seeds_flags(name: str) -> None:
    module, function, _ = BUILD[name]
    rows = [line for line in README.read_text().splitlines() if line.startswith(f"| `{function}(")]
    assert len(rows) == 1, f"README needs one providers-table row for {function}"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert f"`{module}`" in cells[0], cells[0]
    stdin, killable, _ = SEED[name]
    assert cells[3].startswith("yes" if stdin else "no"), (name, cells[3])
    assert cells[4].startswith("yes" if killable else "no"), (name, cells[4])


@pytest.mark.parametrize("name", sorted(SEED))
def test_each_fake_names_the_sdk_version_and_endpoints_it_follows(name: str) -> None:
    module, distribution, endpoint = FAKES[name]
    doc = inspect.getdoc(importlib.import_module(module)) or ""
    assert "Follows" in doc or "follows" in doc, f"{module}: the docstring must say what it follows"
    assert endpoint in doc, f"{module}: the docstring must list the endpoints ({endpoint!r} missing)"
    if distribution is None:
        return
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        missing(f"the `{distribution}` SDK is not installed (pip install -e '.[dev]')")
    # The fake follows the installed SDK: a new SDK version means re-reading its request path.
    named = set(re.findall(rf"``{re.escape(distribution)}`` (?:SDK )?(\d+\.\d+(?:\.\d+)?)", doc))
    assert named, f"{module}: the docstring must name the `{distribution}` version it follows"
    assert any(installed == v or installed.startswith(v + ".") for v in named), (module, named, installed)


def test_no_fake_is_reached_through_a_patched_sdk_client() -> None:
    # The SDKs' own request paths run end to end: no test of a cloud provider patches a client.
    here = Path(__file__).resolve().parent
    for path in sorted(here.glob("test_*.py")):
        if not any(path.name.startswith(f"test_{n.replace('-', '_')}_") for n in SEED):
            continue
        text = path.read_text()
        patched = re.findall(r"monkeypatch\.setattr\([^)]*\)|mock\.patch|unittest\.mock|MagicMock|AsyncMock", text)
        assert patched == [], f"{path.name} patches instead of going through the SDK: {patched[:3]}"
    assert os.path.exists(here / "test_cloud_live.py")
