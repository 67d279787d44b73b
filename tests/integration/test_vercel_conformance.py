"""The contract and journal conformance suites against Vercel, on the real ``vercel-sandbox`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/vercel.py) serves the Sandbox API the SDK calls and runs
every command in a container of the base image. ``killable_processes`` is false (the seed:
the server-side kill reaching a forked child is unmeasured), so the journal suite polls and
the kill cases check that a kill returns and the process ends.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestVercelContract = provider_contract_suite(fake_config("vercel"))
TestVercelJournal = journal_conformance_suite(fake_config("vercel"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
