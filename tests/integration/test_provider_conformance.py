"""The provider conformance suite (spec/providers.md §3) against local-process and bubblewrap."""

from __future__ import annotations

import pytest

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.testkit import ProviderSuiteConfig, RecordingLogger, provider_contract_suite

pytestmark = pytest.mark.integration

_local_logger = RecordingLogger()
_local = local_process_sandbox(logger=_local_logger)


async def _create_local():
    handle = await _local.create()
    return handle, handle.destroy


TestLocalProcessContract = provider_contract_suite(
    ProviderSuiteConfig(
        name="local-process",
        create_handle=_create_local,
        provider=_local,
        logger=_local_logger,
        host_workspace=True,
    )
)

_found = probe()
_bwrap_logger = RecordingLogger()
_bwrap = bubblewrap_sandbox(logger=_bwrap_logger)


async def _create_bwrap():
    handle = await _bwrap.create()
    return handle, handle.destroy


TestBubblewrapContract = provider_contract_suite(
    ProviderSuiteConfig(
        name="bubblewrap",
        create_handle=_create_bwrap,
        provider=_bwrap,
        unsupported=None if _found.available else _found.reason,
        follow_unsupported=None if _found.killable else "a group kill does not empty the bwrap pid namespace here",
        logger=_bwrap_logger,
        host_workspace=True,
    )
)
