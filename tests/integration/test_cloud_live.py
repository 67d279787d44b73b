"""The conformance suites against the real cloud services, when their credentials are in the environment.

Each provider of ``tests.support.cloud_providers.CLOUD_PROVIDERS`` either registers its
contract and journal suites against the live service (its variables set), or one test
that skips naming the variables it needs: never a silent pass. These skips hold under CI
too: CI has no vendor accounts, and the fakes carry the same suites there.
"""

from __future__ import annotations

from typing import Any

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import CLOUD_PROVIDERS, live_config, live_problem

pytestmark = pytest.mark.integration


def _skip_class(name: str, reason: str) -> type:
    def test(self: object) -> None:
        pytest.skip(f"{name}: {reason}")

    test_name = "test_live_" + "".join(ch if ch.isalnum() else "_" for ch in reason.lower()).strip("_")
    test.__name__ = test.__qualname__ = test_name
    return type(f"TestLive_{name}", (), {test_name: test, "__module__": __name__})


def _register() -> dict[str, Any]:
    classes: dict[str, Any] = {}
    for name in CLOUD_PROVIDERS:
        problem = live_problem(name)
        slug = name.replace("-", "_")
        if problem is not None:
            classes[f"TestLive_{slug}"] = _skip_class(slug, problem)
            continue
        classes[f"TestLiveContract_{slug}"] = provider_contract_suite(live_config(name))
        journal_skip = CLOUD_PROVIDERS[name].journal_skip
        if journal_skip is not None:  # a named skip even with credentials (Cloudflare: CF4)
            classes[f"TestLiveJournal_{slug}"] = _skip_class(f"{slug}_journal", journal_skip)
            continue
        classes[f"TestLiveJournal_{slug}"] = journal_conformance_suite(live_config(name))
    return classes


globals().update(_register())
