"""The contract and journal conformance suites against boxd, on the real ``boxd`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/boxd.py) serves the gRPC API the SDK calls and runs every
command in a container of the base image, so the setsid group and the in-VM group kill meet a
real process model: the kill cases show ``killable_processes=True`` holds.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestBoxdContract = provider_contract_suite(fake_config("boxd"))
TestBoxdJournal = journal_conformance_suite(fake_config("boxd"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
