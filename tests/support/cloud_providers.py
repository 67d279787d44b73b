"""The cloud providers' registry for the conformance suites: provider -> fake config, live config, needed env.

Each remote provider adds one ``CloudEntry``: how to build its provider against its
faithful fake (``tests/support/fake_cloud/``, run in CI wherever Docker and the base
image are), how to build it against the real service, and the environment variables the
live variant needs. ``fake_config(name)`` and ``live_config(name)`` give suite configs;
without the live variables, the live config is ``unsupported`` with a reason naming
them, so the suite reports one named skip per provider (never a silent pass).

A fake starts lazily (on the first sandbox a test asks for) and serves until the session
ends (tests/conftest.py closes it before the leak check; atexit if the session never ends):
it removes every container and image it made then. Its idle warm machines go at the end
of each test module.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from boxwright.testkit import ProviderSuiteConfig, RecordingLogger
from tests.support.docker import BASE_IMAGE, image_problem

Build = Callable[[RecordingLogger], Any]


@dataclass(frozen=True)
class CloudEntry:
    name: str
    sdk: str  # the importable module of the vendor's SDK (the provider's extra)
    env: tuple[str, ...]  # what the live variant needs
    fake: Build  # the provider against its fake (started on first use)
    live: Build  # the provider against the real service
    port: int = 8080
    probe: Callable[[], str | None] | None = None  # why the live service is unusable beyond env (sbx: a CLI)
    journal_skip: str | None = None  # why the journal suite cannot run on this provider at all (Cloudflare: CF4)
    follow_unsupported: str | None = None  # why its journal polls (not both background and killable)
    # Strips boxwright's labels off a sandbox in the fake (it becomes someone else's), for the reap
    # test; None where the vendor stores no labels (Railway) or cannot list sandboxes (sbx, Cloudflare).
    disown: Callable[[str], None] | None = None


_fakes: dict[str, Any] = {}
_lock = threading.Lock()


def running_fake(name: str, make: Callable[[], Any]) -> Any:
    """The one fake server of ``name`` for this test process, started on first use."""
    with _lock:
        fake = _fakes.get(name)
        if fake is None:
            fake = make().start()
            _fakes[name] = fake
            atexit.register(fake.close)
        return fake


def drain_fakes() -> None:
    """Every running fake's idle warm machines removed: a test module's end (tests/conftest.py).

    The servers stay (Blaxel's SDK keeps its first API URL for the process); the next sandbox boots anew.
    """
    with _lock:
        fakes = list(_fakes.values())
    for fake in fakes:
        fake.cloud.drain()


def close_fakes() -> list[str]:
    """Every running fake stopped and all it made removed: the session's end, before its leak check.

    Returns a line for each fake sandbox a test created and never destroyed (removed now).
    """
    with _lock:
        fakes = dict(_fakes)
        _fakes.clear()
    left = []
    for name, fake in fakes.items():
        atexit.unregister(fake.close)
        left.extend(f"  fake {name} sandbox {sandbox}" for sandbox in fake.close())
    return left


# -- E2B ------------------------------------------------------------------------------------------


def e2b_fake() -> Any:
    from tests.support.fake_cloud.e2b import FakeE2B

    return running_fake("e2b", lambda: FakeE2B(BASE_IMAGE))


def e2b_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """An ``e2b_sandbox`` pointed at the running fake (extra options as for ``e2b_sandbox``)."""
    from boxwright.providers.e2b import e2b_sandbox

    fake = e2b_fake()
    extra.setdefault("api_key", fake.api_key)
    return e2b_sandbox(
        api_url=fake.api_url,
        sandbox_url=fake.envd_url,
        http_version="1.1",
        lifetime=600,
        logger=logger or RecordingLogger(),
        metadata={"boxwright.test": "1"},
        **extra,
    )


def _e2b_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.e2b import e2b_sandbox

    return e2b_sandbox(lifetime=600, logger=logger, metadata={"boxwright.test": "1"})


# -- Railway --------------------------------------------------------------------------------------


def railway_fake() -> Any:
    from tests.support.fake_cloud.railway import FakeRailway

    return running_fake("railway", lambda: FakeRailway(BASE_IMAGE))


def railway_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``railway_sandbox`` pointed at the running fake (extra options as for ``railway_sandbox``)."""
    from boxwright.providers.railway import railway_sandbox

    fake = railway_fake()
    extra.setdefault("token", fake.api_token)
    extra.setdefault("environment_id", fake.environment)
    return railway_sandbox(endpoint=fake.endpoint, exec_url=fake.exec_url, logger=logger or RecordingLogger(), **extra)


def _railway_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.railway import railway_sandbox

    return railway_sandbox(idle_timeout_minutes=10, logger=logger)


# -- Daytona --------------------------------------------------------------------------------------


def daytona_fake() -> Any:
    from tests.support.fake_cloud.daytona import FakeDaytona

    return running_fake("daytona", lambda: FakeDaytona(BASE_IMAGE))


def daytona_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``daytona_sandbox`` pointed at the running fake (extra options as for ``daytona_sandbox``)."""
    from boxwright.providers.daytona import daytona_sandbox

    fake = daytona_fake()
    extra.setdefault("api_key", fake.api_key)
    return daytona_sandbox(
        api_url=fake.api_url, logger=logger or RecordingLogger(), labels={"boxwright.test": "1"}, **extra
    )


def _daytona_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.daytona import daytona_sandbox

    return daytona_sandbox(logger=logger, labels={"boxwright.test": "1"}, ephemeral=True)


# -- Blaxel ---------------------------------------------------------------------------------------


def blaxel_fake() -> Any:
    from tests.support.fake_cloud.blaxel import FakeBlaxel

    os.environ.setdefault("DO_NOT_TRACK", "1")  # the SDK's telemetry has no business in tests
    return running_fake("blaxel", lambda: FakeBlaxel(BASE_IMAGE))


def blaxel_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``blaxel_sandbox`` pointed at the running fake (the SDK's auth is process-global: one workspace)."""
    from boxwright.providers.blaxel import blaxel_sandbox

    fake = blaxel_fake()
    extra.setdefault("api_key", fake.api_key)
    extra.setdefault("workspace", fake.workspace)
    return blaxel_sandbox(
        api_url=fake.api_url,
        region="us-pdx-1",
        logger=logger or RecordingLogger(),
        labels={"boxwright.test": "1"},
        **extra,
    )


def _blaxel_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.blaxel import blaxel_sandbox

    return blaxel_sandbox(ttl="30m", logger=logger, labels={"boxwright.test": "1"})


# -- Upstash Box ----------------------------------------------------------------------------------


def upstash_box_fake() -> Any:
    from tests.support.fake_cloud.upstash_box import FakeUpstashBox

    return running_fake("upstash-box", lambda: FakeUpstashBox(BASE_IMAGE))


def upstash_box_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """An ``upstash_box_sandbox`` pointed at the running fake (extra options as for ``upstash_box_sandbox``)."""
    from boxwright.providers.upstash_box import upstash_box_sandbox

    fake = upstash_box_fake()
    extra.setdefault("api_key", fake.api_key)
    return upstash_box_sandbox(
        base_url=fake.base_url, logger=logger or RecordingLogger(), labels=("boxwright-test",), **extra
    )


def _upstash_box_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.upstash_box import upstash_box_sandbox

    return upstash_box_sandbox(logger=logger, labels=("boxwright-test",))


# -- boxd -----------------------------------------------------------------------------------------


def boxd_fake() -> Any:
    from tests.support.fake_cloud.boxd import FakeBoxd

    return running_fake("boxd", lambda: FakeBoxd(BASE_IMAGE))


def boxd_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``boxd_sandbox`` pointed at the running fake (token mode: the fake serves no key exchange)."""
    from boxwright.providers.boxd import boxd_sandbox

    fake = boxd_fake()
    extra.setdefault("token", fake.token)
    return boxd_sandbox(
        base_url=fake.base_url, logger=logger or RecordingLogger(), labels={"boxwright.test": "1"}, **extra
    )


def _boxd_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.boxd import boxd_sandbox

    return boxd_sandbox(vcpu=1, auto_destroy_timeout=3600, logger=logger, labels={"boxwright.test": "1"})


# -- Vercel ---------------------------------------------------------------------------------------


def vercel_fake() -> Any:
    from tests.support.fake_cloud.vercel import FakeVercel

    return running_fake("vercel", lambda: FakeVercel(BASE_IMAGE))


def vercel_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``vercel_sandbox`` pointed at the running fake (extra options as for ``vercel_sandbox``)."""
    from boxwright.providers.vercel import vercel_sandbox

    fake = vercel_fake()
    extra.setdefault("token", fake.token)
    extra.setdefault("team_id", fake.team)
    extra.setdefault("project_id", fake.project)
    extra.setdefault("ports", [8080])
    return vercel_sandbox(
        api_url=fake.api_url, logger=logger or RecordingLogger(), labels={"boxwright.test": "1"}, **extra
    )


def _vercel_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.vercel import vercel_sandbox

    return vercel_sandbox(ports=[8080], execution_time_limit=1800, logger=logger, labels={"boxwright.test": "1"})


# -- Sprites --------------------------------------------------------------------------------------


def sprites_fake() -> Any:
    from tests.support.fake_cloud.sprites import FakeSprites

    return running_fake("sprites", lambda: FakeSprites(BASE_IMAGE))


def sprites_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``sprites_sandbox`` pointed at the running fake (extra options as for ``sprites_sandbox``)."""
    from boxwright.providers.sprites import sprites_sandbox

    fake = sprites_fake()
    extra.setdefault("api_key", fake.token)
    return sprites_sandbox(
        api_url=fake.api_url, logger=logger or RecordingLogger(), labels={"boxwright.test": "1"}, **extra
    )


def _sprites_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.sprites import sprites_sandbox

    return sprites_sandbox(logger=logger, labels={"boxwright.test": "1"})


# -- Docker Sandboxes (sbx) -----------------------------------------------------------------------


def sbx_fake() -> Any:
    from tests.support.fake_cloud.sbx_daemon import FakeSbxDaemon

    return running_fake("sbx", lambda: FakeSbxDaemon(BASE_IMAGE))


@functools.cache
def _sbx_repo() -> str:
    import tempfile

    from tests.support.fake_cloud.sbx_daemon import fake_repo

    root = tempfile.mkdtemp(prefix="boxwright-sbx-repo-")
    atexit.register(lambda: __import__("shutil").rmtree(root, ignore_errors=True))
    return fake_repo(root)


def sbx_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """An ``sbx_sandbox`` driving the fake ``sbx`` CLI, whose daemon runs the VMs as containers."""
    from boxwright.providers.sbx import sbx_sandbox
    from tests.support.fake_cloud.sbx_daemon import CLI

    fake = sbx_fake()
    extra.setdefault("workspace_dir", _sbx_repo())
    extra.setdefault("binary", CLI)
    return sbx_sandbox(cli_env=fake.env, logger=logger or RecordingLogger(), **extra)


def _sbx_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.sbx import sbx_sandbox

    return sbx_sandbox(workspace_dir=_sbx_repo(), logger=logger)


def _sbx_probe() -> str | None:
    """The live sbx suite runs only where `sbx ls --json` answers (installed, signed in, hypervisor)."""
    import shutil
    import subprocess

    if shutil.which("sbx") is None:
        return "live sbx needs the `sbx` CLI on PATH (not installed)"
    try:
        done = subprocess.run(["sbx", "ls", "--json"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"live sbx needs a working `sbx ls --json` ({exc!r})"
    if done.returncode != 0:
        return f"live sbx needs a working `sbx ls --json` (sbx login?): {done.stderr.strip()[:120]}"
    return None


# -- Cloudflare -----------------------------------------------------------------------------------

CLOUDFLARE_JOURNAL_SKIP = (
    "needs a Workers runtime with the Sandbox Durable Object binding (CF4): a Python process has none, and "
    "kill() cannot reach a process there"
)


def cloudflare_fake() -> Any:
    from tests.support.fake_cloud.cloudflare import FakeCloudflareWorker

    return running_fake("cloudflare", lambda: FakeCloudflareWorker(BASE_IMAGE))


def cloudflare_fake_provider(logger: RecordingLogger | None = None, **extra: Any) -> Any:
    """A ``cloudflare_sandbox`` pointed at the fake of boxwright's Worker."""
    from boxwright.providers.cloudflare import cloudflare_sandbox

    fake = cloudflare_fake()
    extra.setdefault("token", fake.token)
    extra.setdefault("preview_hostname", "preview.cf.fake")
    return cloudflare_sandbox(worker_url=fake.url, logger=logger or RecordingLogger(), **extra)


def _cloudflare_live(logger: RecordingLogger) -> Any:
    from boxwright.providers.cloudflare import cloudflare_sandbox

    return cloudflare_sandbox(preview_hostname=os.environ.get("BOXWRIGHT_CLOUDFLARE_PREVIEW_HOST"), logger=logger)


# -- ownership labels in the fakes (the reap test) --------------------------------------------------


def _e2b_disown(sandbox_id: str) -> None:
    e2b_fake().boxes[sandbox_id].metadata.clear()


def _daytona_disown(sandbox_id: str) -> None:
    daytona_fake().boxes[sandbox_id].labels.clear()


def _blaxel_disown(name: str) -> None:
    blaxel_fake().boxes[name].record["metadata"]["labels"] = {}


def _boxd_disown(machine_id: str) -> None:
    boxd_fake().vms[machine_id].labels.clear()


def _upstash_box_disown(box_id: str) -> None:
    upstash_box_fake().boxes[box_id].labels.clear()


def _sprites_disown(name: str) -> None:
    sprites_fake().sprites[name].labels.clear()


def _vercel_disown(name: str) -> None:
    vercel_fake().sandboxes[name].tags.clear()


# -- the registry ---------------------------------------------------------------------------------

CLOUD_PROVIDERS: dict[str, CloudEntry] = {
    "blaxel": CloudEntry(
        "blaxel", "blaxel", ("BL_API_KEY", "BL_WORKSPACE"), blaxel_fake_provider, _blaxel_live, disown=_blaxel_disown
    ),
    "boxd": CloudEntry(
        "boxd", "boxd", ("BOXD_API_KEY", "BOXD_ORG"), boxd_fake_provider, _boxd_live, disown=_boxd_disown
    ),
    # No SDK: the provider drives the `sbx` CLI (its fake: tests/support/fake_cloud/sbx).
    "sbx": CloudEntry(
        "sbx",
        "boxwright",
        (),
        sbx_fake_provider,
        _sbx_live,
        probe=_sbx_probe,
        follow_unsupported="sbx's recorded-pid kill is not measured against a real microVM (seed)",
    ),
    # No SDK: a Worker of ours (deploy/cloudflare/) fronts the Durable Object; its client is httpx.
    "cloudflare": CloudEntry(
        "cloudflare",
        "httpx",
        ("BOXWRIGHT_CLOUDFLARE_URL", "BOXWRIGHT_CLOUDFLARE_TOKEN"),
        cloudflare_fake_provider,
        _cloudflare_live,
        journal_skip=CLOUDFLARE_JOURNAL_SKIP,
        follow_unsupported="no signal crosses Workers RPC: kill() cannot reach the process (seed)",
    ),
    "e2b": CloudEntry("e2b", "e2b", ("E2B_API_KEY",), e2b_fake_provider, _e2b_live, disown=_e2b_disown),
    "daytona": CloudEntry(
        "daytona",
        "daytona",
        ("DAYTONA_API_KEY",),
        daytona_fake_provider,
        _daytona_live,
        follow_unsupported="Daytona's kill deletes the session; reaching a background child is not measured (seed)",
        disown=_daytona_disown,
    ),
    # Railway has no SDK: its client is httpx + websockets (core dependencies); either token kind will do.
    "railway": CloudEntry(
        "railway",
        "websockets",
        ("RAILWAY_API_TOKEN|RAILWAY_TOKEN", "RAILWAY_ENVIRONMENT_ID"),
        railway_fake_provider,
        _railway_live,
    ),
    # vercel.sandbox comes from the `vercel-sandbox` distribution (the umbrella `vercel` pins websockets<17).
    "vercel": CloudEntry(
        "vercel",
        "vercel.sandbox",
        ("VERCEL_TOKEN", "VERCEL_TEAM_ID", "VERCEL_PROJECT_ID"),
        vercel_fake_provider,
        _vercel_live,
        follow_unsupported="Vercel's server-side kill reaching a forked child is not measured (seed)",
        disown=_vercel_disown,
    ),
    "sprites": CloudEntry(
        "sprites",
        "sprites",
        ("SPRITES_API_KEY",),
        sprites_fake_provider,
        _sprites_live,
        follow_unsupported="Sprites' kill is claimed but not verified against a real Sprite (seed: ship false)",
        disown=_sprites_disown,
    ),
    "upstash-box": CloudEntry(
        "upstash-box",
        "upstash_box",
        ("UPSTASH_BOX_API_KEY",),
        upstash_box_fake_provider,
        _upstash_box_live,
        disown=_upstash_box_disown,
    ),
}


@functools.cache
def _sdk_problem(module: str) -> str | None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted module (vercel.sandbox) whose parent package is missing
        found = False
    if not found:
        return f"the `{module}` SDK is not installed (pip install 'boxwright[{module}]')"
    return None


def _config(entry: CloudEntry, build: Build, unsupported: str | None, label: str, **extra: Any) -> ProviderSuiteConfig:
    logger = RecordingLogger()
    holder: dict[str, Any] = {}

    def provider() -> Any:
        if "provider" not in holder:
            holder["provider"] = build(logger)
        return holder["provider"]

    async def create() -> tuple[Any, Any]:
        handle = await provider().create()
        return handle, handle.destroy

    class _Lazy:
        """The provider, built when a case first touches it (a fake starts only when a test runs)."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(provider(), attr)

    return ProviderSuiteConfig(
        name=label,
        create_handle=create,
        provider=_Lazy() if unsupported is None else None,  # type: ignore[arg-type]
        logger=logger,
        unsupported=unsupported,
        port=entry.port,
        follow_unsupported=entry.follow_unsupported,
        **extra,
    )


def fake_problem(name: str) -> str | None:
    """Why the fake of ``name`` cannot run here (no SDK, no Docker, no base image), or None."""
    return _sdk_problem(CLOUD_PROVIDERS[name].sdk) or image_problem(BASE_IMAGE)


def fake_config(name: str, **extra: Any) -> ProviderSuiteConfig:
    entry = CLOUD_PROVIDERS[name]
    problem = fake_problem(name)
    return _config(entry, entry.fake, problem, f"{name}-fake", **extra)


def live_problem(name: str) -> str | None:
    entry = CLOUD_PROVIDERS[name]
    # "A|B" is either of two variables.
    missing = [var for var in entry.env if not any(os.environ.get(v) for v in var.split("|"))]
    if missing:
        return f"live {name} needs {' and '.join(m.replace('|', ' or ') for m in missing)} (unset)"
    if entry.probe is not None:
        return entry.probe()
    return _sdk_problem(entry.sdk)


def live_config(name: str, **extra: Any) -> ProviderSuiteConfig:
    entry = CLOUD_PROVIDERS[name]
    return _config(entry, entry.live, live_problem(name), f"{name}-live", **extra)
