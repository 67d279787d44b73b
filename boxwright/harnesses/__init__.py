"""Harness adapters: one module per agent CLI, each implementing ``Harness`` from ``base``."""
