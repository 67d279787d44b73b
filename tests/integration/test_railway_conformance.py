"""The contract and journal conformance suites against Railway, on boxwright's own client and its faithful fake.

The fake (tests/support/fake_cloud/railway.py) serves the GraphQL operations and the
``/ws/exec`` bridge the client calls and runs every command in a container of the base
image, so the TERM-then-KILL group kill meets a real process model: the kill cases show
``killable_processes=True`` holds.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestRailwayContract = provider_contract_suite(fake_config("railway"))
TestRailwayJournal = journal_conformance_suite(fake_config("railway"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
