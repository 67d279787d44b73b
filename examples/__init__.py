"""Example apps built on boxwright (run them from the repository root: ``python -m examples.chat_app``)."""
