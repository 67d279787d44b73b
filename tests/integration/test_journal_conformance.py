"""The journal conformance cases J0..J8 (spec/providers.md §3) against local-process and bubblewrap.

The J7 windows are shortened from the spec's 5 s settle / 6 s freeze to 1.5 s / 2 s: the
heartbeat beats every second, so a writer that survived kill() would still add two bytes.
"""

from __future__ import annotations

import pytest

from boxwright.testkit.journal import journal_conformance_suite
from tests.support.conformance import bubblewrap_config, local_process_config

pytestmark = pytest.mark.integration

SETTLE_S = 1.5
FREEZE_S = 2.0

TestLocalProcessJournal = journal_conformance_suite(
    local_process_config(), heartbeat_settle_s=SETTLE_S, heartbeat_freeze_s=FREEZE_S
)
TestBubblewrapJournal = journal_conformance_suite(
    bubblewrap_config(), heartbeat_settle_s=SETTLE_S, heartbeat_freeze_s=FREEZE_S
)
