"""The run viewer: a page (plain HTML, CSS and a module script, served by the package) that starts a run,
shows its events live, answers its approvals and stops it; and the built-in demo agent it offers offline.

Mount it next to the service's routes: ``routes=[*sandbox_routes(service), *viewer_routes()]``.
"""

from .app import HarnessOption, ProviderOption, ViewerConfig, ViewerRuns, detect_config, profiles_config, viewer_routes
from .demo import DEMO_HARNESS, DEMO_POLICY, DemoHarness, demo_harness, ensure_demo_repo, house_style

__all__ = [
    "DEMO_HARNESS",
    "DEMO_POLICY",
    "DemoHarness",
    "HarnessOption",
    "ProviderOption",
    "ViewerConfig",
    "ViewerRuns",
    "demo_harness",
    "detect_config",
    "ensure_demo_repo",
    "house_style",
    "profiles_config",
    "viewer_routes",
]
