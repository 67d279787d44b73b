"""The contract and journal conformance suites against E2B, on the real ``e2b`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/e2b.py) serves the REST API and envd the SDK calls and
runs every command in a container of the base image, so the setsid/group-kill code meets
a real process model: the kill cases show ``killable_processes=True`` holds.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestE2BContract = provider_contract_suite(fake_config("e2b"))
TestE2BJournal = journal_conformance_suite(fake_config("e2b"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
