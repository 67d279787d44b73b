"""Test helpers for boxwright users: the provider conformance suite (``boxwright.testkit.providers``)."""

from __future__ import annotations

from .providers import (
    CASE_TIMEOUT,
    CASES,
    REQUIRE_INTEGRATION_ENV,
    Case,
    CaseNotApplicable,
    CreateHandle,
    Dispose,
    ProviderSuiteConfig,
    RecordingLogger,
    fresh_sandbox,
    host_pids,
    provider_contract_suite,
    run_case,
    skip_unavailable,
)

__all__ = [
    "CASES",
    "CASE_TIMEOUT",
    "REQUIRE_INTEGRATION_ENV",
    "Case",
    "CaseNotApplicable",
    "CreateHandle",
    "Dispose",
    "ProviderSuiteConfig",
    "RecordingLogger",
    "fresh_sandbox",
    "host_pids",
    "provider_contract_suite",
    "run_case",
    "skip_unavailable",
]
from .journal import journal_conformance_suite as journal_conformance_suite
