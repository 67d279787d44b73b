"""The contract and journal conformance suites against Sprites, on the real ``sprites-py`` SDK and its faithful fake.

The fake (tests/support/fake_cloud/sprites.py) serves the REST API and the exec WebSocket the
SDK calls and runs every command in a container of the base image. ``killable_processes`` is
false (the seed's "not verified"), so the journal suite polls and the kill cases check only
that a kill returns and the process ends.
"""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.cloud_providers import fake_config

pytestmark = pytest.mark.integration

TestSpritesContract = provider_contract_suite(fake_config("sprites"))
TestSpritesJournal = journal_conformance_suite(fake_config("sprites"), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
