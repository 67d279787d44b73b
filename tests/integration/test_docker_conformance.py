"""The provider conformance suite (contract and journal cases) against Docker, on the debootstrap base image."""

from __future__ import annotations

import pytest

from boxwright.testkit import provider_contract_suite
from boxwright.testkit.journal import journal_conformance_suite
from tests.support.docker import docker_config, no_leaked_containers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]

TestDockerContract = provider_contract_suite(docker_config())
TestDockerJournal = journal_conformance_suite(docker_config(), heartbeat_settle_s=1.5, heartbeat_freeze_s=2.0)
