"""The contract and journal conformance suites against Daytona, on the real ``daytona`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/daytona.py) serves the REST and toolbox APIs the SDK
calls and runs every session command in a container of the base image. Daytona declares
``killable_processes=False`` (the seed: not measured), so its journal polls and the kill
cases check that nothing claims more.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestDaytonaContract = provider_contract_suite(fake_config("daytona"))
TestDaytonaJournal = journal_conformance_suite(fake_config("daytona"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
