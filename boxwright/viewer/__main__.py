"""``python -m boxwright.viewer``: the run viewer on the embedded default (see ``serve.py``)."""

from .serve import main

raise SystemExit(main())
