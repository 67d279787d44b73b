"""``boxwright doctor``'s cloud provider lines: is the vendor SDK installed, is its credential set (never shown)."""

from __future__ import annotations

import importlib.util
import os

# (provider, SDK module, extra, credential variables, optional variables)
CLOUD = (
    ("e2b", "e2b", "e2b", ("E2B_API_KEY",), ("E2B_DOMAIN",)),
    ("daytona", "daytona", "daytona", ("DAYTONA_API_KEY",), ("DAYTONA_API_URL", "DAYTONA_TARGET")),
    # Railway has no Python SDK: boxwright's client is httpx + websockets; "A|B" is either variable.
    ("railway", "websockets", "railway", ("RAILWAY_API_TOKEN|RAILWAY_TOKEN", "RAILWAY_ENVIRONMENT_ID"), ()),
    ("upstash-box", "upstash_box", "upstash-box", ("UPSTASH_BOX_API_KEY",), ("UPSTASH_BOX_BASE_URL",)),
    # Blaxel: without a key the SDK's `bl login` would do, but doctor only vouches for what it can see.
    ("blaxel", "blaxel", "blaxel", ("BL_API_KEY", "BL_WORKSPACE"), ("BL_REGION",)),
    # Vercel: the `vercel-sandbox` distribution provides vercel.sandbox; all three variables are needed.
    ("vercel", "vercel.sandbox", "vercel", ("VERCEL_TOKEN", "VERCEL_TEAM_ID", "VERCEL_PROJECT_ID"), ()),
    ("sprites", "sprites", "sprites", ("SPRITES_API_KEY",), ("SPRITES_API_URL",)),
    ("boxd", "boxd", "boxd", ("BOXD_API_KEY|BOXD_TOKEN", "BOXD_ORG"), ("BOXD_BASE_URL",)),
    # Cloudflare: a Worker of ours (deploy/cloudflare/) fronts the Durable Object; the client is httpx (core).
    ("cloudflare", "httpx", "cloudflare", ("BOXWRIGHT_CLOUDFLARE_URL", "BOXWRIGHT_CLOUDFLARE_TOKEN"), ()),
)


def sbx_check() -> tuple[str, str, bool, str]:
    """Docker Sandboxes: a CLI, not an SDK. Whether ``sbx`` is on PATH (login is checked by use, not here)."""
    import shutil

    if shutil.which("sbx") is None:
        return ("provider", "sbx", False, "needs the `sbx` CLI on PATH (Docker Sandboxes), `sbx login`, a hypervisor")
    return ("provider", "sbx", True, "`sbx` on PATH (needs `sbx login` and a hypervisor: `sbx ls --json` tells)")


def _installed(module: str) -> bool:
    """Whether ``module`` imports here; a dotted one (``vercel.sandbox``) without its parent package is not."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def cloud_checks() -> list[tuple[str, str, bool, str]]:
    """(kind, name, ok, detail) rows, one per cloud provider boxwright has."""
    rows = []
    for name, module, extra, needed, optional in CLOUD:
        if not _installed(module):
            rows.append(
                ("provider", name, False, f"the `{module}` SDK is not installed: pip install 'boxwright[{extra}]'")
            )
            continue
        missing = [var.replace("|", " or ") for var in needed if not any(os.environ.get(v) for v in var.split("|"))]
        also = f" (optional: {', '.join(optional)})" if optional else ""
        if missing:
            rows.append(("provider", name, False, f"needs {' and '.join(missing)}{also}"))
        else:
            present = [next(v for v in var.split("|") if os.environ.get(v)) for var in needed]
            rows.append(("provider", name, True, f"${' and $'.join(present)} set{also}"))
    rows.append(sbx_check())
    return rows
