"""The contract suite against Cloudflare, through the provider and a fake of boxwright's Worker (deploy/cloudflare/).

The fake (tests/support/fake_cloud/cloudflare.py) serves the Worker's HTTP protocol over containers
of the base image. The journal suite is an unconditional named skip (CF4): it needs a Workers runtime
with the Sandbox binding, and ``kill()`` has no way to reach a process there.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from tests.support.cloud_providers import CLOUDFLARE_JOURNAL_SKIP, fake_config

pytestmark = pytest.mark.integration

TestCloudflareContract = provider_contract_suite(fake_config("cloudflare"))


class TestCloudflareJournal:
    def test_journal_needs_a_workers_runtime_with_the_sandbox_binding(self) -> None:
        pytest.skip(f"cloudflare journal: {CLOUDFLARE_JOURNAL_SKIP}")
