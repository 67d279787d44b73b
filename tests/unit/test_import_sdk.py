"""A provider whose vendor SDK is not installed says which package is missing and the extra that brings it.

Every SDK-backed provider imports its SDK through ``_remote.import_sdk``; here each SDK is made
absent (``sys.modules[name] = None`` is how Python itself marks a module that must not import)
and the provider's importer must raise ``ProviderUnavailableError`` naming a real extra of
pyproject.toml that lists that distribution.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from boxwright.errors import ProviderUnavailableError
from boxwright.providers._remote import import_sdk

ROOT = Path(__file__).resolve().parents[2]
# provider module -> (the SDK module its importer loads, its importer's name)
SDK_PROVIDERS = {
    "e2b": ("e2b", "_sdk"),
    "daytona": ("daytona", "_sdk"),
    "blaxel": ("blaxel.core", "_sdk"),
    "boxd": ("boxd", "_sdk"),
    "upstash_box": ("upstash_box", "_sdk"),
    "vercel": ("vercel.sandbox", "_sdk"),
    "sprites": ("sprites", "_sdk"),
    "docker": ("docker", "_docker"),
}


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def test_a_missing_module_is_a_provider_unavailable_error_with_its_install_line() -> None:
    with pytest.raises(ProviderUnavailableError) as caught:
        import_sdk("acme", "boxwright_no_such_sdk_module", "acme-sdk", "acme")
    assert caught.value.provider == "acme"
    assert caught.value.reason == "the `acme-sdk` Python package is not installed"
    assert caught.value.help == "pip install 'boxwright[acme]'"
    assert isinstance(caught.value.__cause__, ImportError)


def test_an_installed_module_is_returned_itself() -> None:
    assert import_sdk("acme", "json", "json", "acme") is importlib.import_module("json")


@pytest.mark.parametrize("provider", sorted(SDK_PROVIDERS))
def test_each_provider_names_a_real_extra_when_its_sdk_is_absent(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(f"boxwright.providers.{provider}")
    sdk, importer = SDK_PROVIDERS[provider]
    monkeypatch.setitem(sys.modules, sdk, None)
    with pytest.raises(ProviderUnavailableError) as caught:
        getattr(module, importer)()
    error = caught.value
    assert error.provider == module.NAME
    named = re.fullmatch(r"the `([A-Za-z0-9._-]+)` Python package is not installed", error.reason)
    assert named is not None, error.reason
    extra = re.fullmatch(r"pip install 'boxwright\[([a-z0-9-]+)\]'", error.help or "")
    assert extra is not None, error.help
    requirements = _extras().get(extra[1])
    assert requirements is not None, f"{provider} names the extra {extra[1]!r}, which pyproject.toml lacks"
    # The distribution it names is the one that extra installs (a requirement starts with its name).
    assert any(re.match(rf"{re.escape(named[1])}\b(?!-)", r) for r in requirements), (named[1], requirements)
