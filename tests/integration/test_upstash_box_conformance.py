"""The contract and journal conformance suites against Upstash Box, on the ``upstash-box`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/upstash_box.py) serves the REST API and the exec-session
WebSocket the SDK calls and runs every command in a container of the base
image, so the server-side signal to the process tree meets a real process model: the kill cases show
``killable_processes=True`` holds.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestUpstashBoxContract = provider_contract_suite(fake_config("upstash-box"))
TestUpstashBoxJournal = journal_conformance_suite(
    fake_config("upstash-box"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0
)
