"""The suite configurations of this repository's own providers, shared by every conformance test file."""

from __future__ import annotations

from typing import Any

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.testkit import ProviderSuiteConfig, RecordingLogger


def _config(name: str, provider: Any, logger: RecordingLogger, **extra: Any) -> ProviderSuiteConfig:
    async def create() -> tuple[Any, Any]:
        handle = await provider.create()
        return handle, handle.destroy

    return ProviderSuiteConfig(name=name, create_handle=create, provider=provider, logger=logger, **extra)


def local_process_config(**extra: Any) -> ProviderSuiteConfig:
    logger = RecordingLogger()
    return _config("local-process", local_process_sandbox(logger=logger), logger, **extra)


def bubblewrap_config(**extra: Any) -> ProviderSuiteConfig:
    found = probe()
    logger = RecordingLogger()
    return _config(
        "bubblewrap",
        bubblewrap_sandbox(logger=logger),
        logger,
        unsupported=None if found.available else found.reason,
        follow_unsupported=None if found.killable else "a group kill does not empty the bwrap pid namespace here",
        **extra,
    )
