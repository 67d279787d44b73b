"""``python -m boxwright``: the ``boxwright`` command, for an environment whose scripts are not on PATH."""

from .cli import main

raise SystemExit(main())
