"""The contract and journal conformance suites against Docker Sandboxes, through the ``sbx`` CLI and its fake.

The fake (tests/support/fake_cloud/sbx, sbx_daemon.py) is an ``sbx`` executable whose daemon
runs each microVM as a container of the base image; ``killable_processes`` is false (seed:
unmeasured), so the journal reads poll and the kill cases assert what a non-killable provider owes.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestSbxContract = provider_contract_suite(fake_config("sbx"))
TestSbxJournal = journal_conformance_suite(fake_config("sbx"))
