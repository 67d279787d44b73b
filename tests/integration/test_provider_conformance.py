"""The provider conformance suite (spec/providers.md §3) against local-process and bubblewrap."""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from tests.support.conformance import bubblewrap_config, local_process_config

pytestmark = pytest.mark.integration

TestLocalProcessContract = provider_contract_suite(local_process_config(host_workspace=True))
TestBubblewrapContract = provider_contract_suite(bubblewrap_config(host_workspace=True))
