"""The two providers whose sandbox files are host files (local-process, bubblewrap), for security tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from tests.support.require import missing

HOST_PROVIDERS = ("local-process", "bubblewrap")


@contextlib.asynccontextmanager
async def host_sandbox(kind: str, base_dir: str | os.PathLike[str]) -> AsyncIterator[Any]:
    """A fresh sandbox of ``kind`` with its state under ``base_dir``; destroyed on exit."""
    if kind == "bubblewrap":
        found = probe()
        if not found.available:
            missing(f"bubblewrap cannot run here: {found.reason}")
        provider: Any = bubblewrap_sandbox(base_dir=base_dir)
    else:
        provider = local_process_sandbox(base_dir=base_dir)
    handle = await provider.create()
    try:
        yield handle
    finally:
        await handle.destroy()
