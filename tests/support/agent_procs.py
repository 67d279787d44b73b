"""Host processes of one test's agent still alive after its run: the "no process left" check of the e2e tests.

A process is the test's when its environment holds the test's own entry (``HOME=<tmp_path>/home``): that
catches the CLI and every child it started, and never another test's agent of the same CLI.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _pids_with(entry: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and entry in environ:
            found.append(pid)
    return found


def agent_left(env_entry: str, settle: float = 5.0) -> list[str]:
    """Live processes whose environment holds ``env_entry`` (``NAME=value``), after up to ``settle`` s."""
    entry = os.fsencode(env_entry)
    deadline = time.monotonic() + settle
    while (found := _pids_with(entry)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _pids_running(arg: bytes) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(arg in part for part in argv):
            found.append(pid)
    return found


def running_with_arg(arg: str | Path, settle: float = 5.0) -> list[str]:
    """Live processes with ``arg`` in an argument (a script under the test's tmp dir), after up to ``settle`` s."""
    needle = os.fsencode(str(arg))
    deadline = time.monotonic() + settle
    while (found := _pids_running(needle)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found
