"""Sandbox providers. Each is one module implementing ``SandboxProvider``; optional ones
(docker, e2b, ...) import their SDK only inside their own module."""

from __future__ import annotations

from .bubblewrap import BubblewrapProvider, Posture, bubblewrap_sandbox
from .docker import DockerProvider, docker_sandbox
from .local_process import LocalProcessProvider, local_process_sandbox

__all__ = [
    "BubblewrapProvider",
    "DockerProvider",
    "LocalProcessProvider",
    "Posture",
    "bubblewrap_sandbox",
    "docker_sandbox",
    "local_process_sandbox",
]
