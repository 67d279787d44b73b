"""The journal conformance cases J0..J8 (spec/providers.md §3) against local-process and bubblewrap.

The J7 windows are shortened from the spec's 5 s settle / 6 s freeze to 1.5 s / 2 s: the
heartbeat beats every second, so a writer that survived kill() would still add two bytes.
"""

from __future__ import annotations

import pytest

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.testkit import ProviderSuiteConfig, RecordingLogger
from boxwright.testkit.journal import journal_conformance_suite

pytestmark = pytest.mark.integration

SETTLE_S = 1.5
FREEZE_S = 2.0

_local_logger = RecordingLogger()
_local = local_process_sandbox(logger=_local_logger)


async def _create_local():
    handle = await _local.create()
    return handle, handle.destroy


TestLocalProcessJournal = journal_conformance_suite(
    ProviderSuiteConfig(name="local-process", create_handle=_create_local, provider=_local, logger=_local_logger),
    heartbeat_settle_s=SETTLE_S,
    heartbeat_freeze_s=FREEZE_S,
)

_found = probe()
_bwrap_logger = RecordingLogger()
_bwrap = bubblewrap_sandbox(logger=_bwrap_logger)


async def _create_bwrap():
    handle = await _bwrap.create()
    return handle, handle.destroy


TestBubblewrapJournal = journal_conformance_suite(
    ProviderSuiteConfig(
        name="bubblewrap",
        create_handle=_create_bwrap,
        provider=_bwrap,
        unsupported=None if _found.available else _found.reason,
        follow_unsupported=None if _found.killable else "a group kill does not empty the bwrap pid namespace here",
        logger=_bwrap_logger,
    ),
    heartbeat_settle_s=SETTLE_S,
    heartbeat_freeze_s=FREEZE_S,
)
