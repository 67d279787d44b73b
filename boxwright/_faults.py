"""Named fault points: exact places where the chaos tests stop or kill this process.

``fault_point("agent.exit-sentinel")`` does nothing unless the environment variable
``BOXWRIGHT_FAULT`` names that point when this module is first imported::

    BOXWRIGHT_FAULT=<name>[:<n>][:kill|stop]

At the ``n``-th pass (default 1) through the named point the process sends itself
``SIGKILL`` (default) or ``SIGSTOP``, so a test can kill a driver *between two given
statements* instead of racing a timer against it. Killing oneself is the point: no
``finally``, no flush, no lease release runs, exactly as when a host dies.

The variable is read once, at import: an unset fault costs one string comparison per pass.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

FAULT_ENV: Final = "BOXWRIGHT_FAULT"
_ACTIONS: Final = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def _parse(spec: str) -> tuple[str, int, signal.Signals] | None:
    parts = spec.strip().split(":")
    if not parts or not parts[0]:
        return None
    name, count, action = parts[0], 1, signal.SIGKILL
    for part in parts[1:]:
        if part.isdigit() and int(part) > 0:
            count = int(part)
        elif part in _ACTIONS:
            action = _ACTIONS[part]
        else:
            # A typo must not silently turn a chaos round into an uninterrupted run.
            raise ValueError(f"{FAULT_ENV}={spec!r}: expected <name>[:<n>][:kill|stop], not {part!r}")
    return name, count, action


_ARMED: Final = _parse(os.environ.get(FAULT_ENV, ""))
_NAME: Final = _ARMED[0] if _ARMED is not None else None
_passes = 0


def fault_point(name: str) -> None:
    """Kill or stop this process here if ``BOXWRIGHT_FAULT`` names this point and this is its n-th pass."""
    global _passes
    if name != _NAME:
        return
    assert _ARMED is not None
    _passes += 1
    if _passes != _ARMED[1]:
        return
    # Say where, for the test's log: a stopped or killed process leaves no other trace.
    sys.stderr.write(f"boxwright fault: {name} pass {_passes}: {_ARMED[2].name}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), _ARMED[2])


__all__ = ["FAULT_ENV", "fault_point"]
