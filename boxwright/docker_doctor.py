"""``boxwright doctor``'s Docker lines: does an engine answer, is the runner image built, and why not."""

from __future__ import annotations

import os

RUNNER_IMAGE = os.environ.get("BOXWRIGHT_RUNNER_IMAGE", "boxwright-runner:latest")
BUILD_HELP = "build it with deploy/runner/build.sh (no registry needed)"


def docker_checks() -> list[tuple[str, str, bool, str]]:
    """(kind, name, ok, detail) rows: the provider, then the runner image."""
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        why = "the `docker` Python package is not installed: pip install 'boxwright[docker]'"
        return [("provider", "docker", False, why)]
    try:
        url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"  # as the provider reads it
        client = docker.APIClient(base_url=url, version="auto", timeout=5)
        version = client.version().get("Version", "?")
    except Exception as exc:
        why = f"no Docker engine answers ({type(exc).__name__}); start dockerd, or set DOCKER_HOST"
        return [("provider", "docker", False, why)]
    rows = [("provider", "docker", True, f"engine {version} (containers: non-root, no capabilities, limits)")]
    try:
        image = client.inspect_image(RUNNER_IMAGE)
        size = image.get("Size", 0) / 1e6
        label = (image.get("Config") or {}).get("Labels", {}).get("boxwright.content-hash", "?")
        rows.append(("provider", "docker-runner", True, f"{RUNNER_IMAGE} ({size:.0f} MB, content {label})"))
    except docker.errors.ImageNotFound:
        rows.append(("provider", "docker-runner", False, f"image {RUNNER_IMAGE} is not built; {BUILD_HELP}"))
    except Exception as exc:
        rows.append(("provider", "docker-runner", False, f"could not inspect {RUNNER_IMAGE}: {exc}"))
    finally:
        client.close()
    return rows
