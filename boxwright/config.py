"""Process-wide configuration, read from the environment.

One value so far:

``BOXWRIGHT_DB``
    Path of the SQLite file the embedded stores (instances, locks, runs, event logs)
    share. Unset or empty: ``./.boxwright/boxwright.db`` under the current working
    directory. A relative path is taken relative to the current working directory
    and ``~`` is expanded; the returned path is always absolute, so a later
    ``chdir`` does not move the database.
"""

from __future__ import annotations

import os

DEFAULT_DATABASE_PATH = os.path.join(".", ".boxwright", "boxwright.db")


def database_path() -> str:
    """The absolute path of the embedded SQLite database (``BOXWRIGHT_DB``, else ``./.boxwright/boxwright.db``)."""
    raw = os.environ.get("BOXWRIGHT_DB") or DEFAULT_DATABASE_PATH
    return os.path.abspath(os.path.expanduser(raw))
