"""The names a user of the TypeScript original looks for are importable from ``boxwright`` itself."""

from __future__ import annotations

import boxwright
from boxwright import journal, reaper, takeover

# The seed's `import { ... } from '@tanstack/ai-sandbox'` names, spelled the Python way.
SEED_NAMES = {
    "reap_detached_runs": reaper.reap_detached_runs,
    "sandbox_reclaimer": reaper.sandbox_reclaimer,
    "ReapResult": reaper.ReapResult,
    "probe_run_exit": journal.probe_run_exit,
    "prune_journals": journal.prune_journals,
    "RunExitProbe": journal.RunExitProbe,
    "read_journal": journal.read_journal,
    "read_journal_ndjson": journal.read_journal_ndjson,
    "journal_read_command": journal.journal_read_command,
    "journal_follow_command": journal.journal_follow_command,
    "sandbox_run_driver": takeover.sandbox_run_driver,
    "align_to_stored_log": takeover.align_to_stored_log,
    "JournalReplayDivergedError": takeover.JournalReplayDivergedError,
    "JournalReplayThreadIdMismatchError": takeover.JournalReplayThreadIdMismatchError,
}
SEED_ERRORS = (
    "RunClaimLostError",
    "RunClaimNotAcquiredError",
    "RunDriverPipeOutsideClaimError",
    "DurableRunIdRequiredError",
    "DurableThreadIdRequiredError",
    "SandboxReclaimFailedError",
    "UnsupportedCapabilityError",
)


def test_the_seeds_public_names_are_exported_from_the_package() -> None:
    for name, value in SEED_NAMES.items():
        assert getattr(boxwright, name, None) is value, name
        assert name in boxwright.__all__, name
    for name in SEED_ERRORS:
        assert issubclass(getattr(boxwright, name), boxwright.BoxwrightError), name
        assert name in boxwright.__all__, name


def test_every_name_in_all_exists() -> None:
    assert [name for name in boxwright.__all__ if not hasattr(boxwright, name)] == []
