"""Conformance suites for boxwright users: providers, journals, instance/lock stores, run stores and event logs."""

from __future__ import annotations

from .journal import journal_conformance_suite
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
from .runs import event_log_suite, run_store_suite
from .stores import lock_store_suite, run_instance_store_conformance

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
    "event_log_suite",
    "fresh_sandbox",
    "host_pids",
    "journal_conformance_suite",
    "lock_store_suite",
    "provider_contract_suite",
    "run_case",
    "run_instance_store_conformance",
    "run_store_suite",
    "skip_unavailable",
]
