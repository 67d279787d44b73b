"""Docker snapshots: commit after setup, restore and fork by id; secrets travel as per-command env, so neither the
container's config nor a committed image (its config and every layer) holds a secret value."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import tarfile

import pytest

from boxwright.sandbox import ProcessOptions, RestoreInput
from tests.support.docker import BASE_IMAGE, TEST_LABEL, image_problem, no_leaked_containers
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]
SECRET = "sk-boxwright-canary-7f3a9c"


def _image_bytes(image: str) -> bytes:
    """`docker save` of ``image``: its config and every layer, uncompressed."""
    return subprocess.run(["docker", "save", image], capture_output=True, check=True, timeout=120).stdout


def test_committed_snapshot_holds_no_secret_and_restores() -> None:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)
    from boxwright.providers.docker import docker_sandbox

    provider = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1"})

    async def main() -> tuple[str, str, str, str]:
        handle = await provider.create()
        restored = forked = None
        try:
            # The keep-alive became the exec server, its token handed over its stdin: bounded wait for it.
            for _ in range(400):
                if handle._fast is not None:
                    break
                await asyncio.sleep(0.05)
            assert handle._fast is not None and handle._fast_server is None, "the keep-alive serves no exec"
            token = handle._fast._token
            handle.env.set({"API_TOKEN": SECRET})
            # The secret is used (its length lands in the workspace), never written.
            await handle.process.exec('printf %s "${#API_TOKEN}" > token-length.txt')
            await handle.process.exec("printf after-setup > state.txt", ProcessOptions(env={"OTHER": SECRET}))
            ref = await handle.snapshot("after-setup")
            inspected = await asyncio.to_thread(
                subprocess.run, ["docker", "inspect", handle.id], capture_output=True, text=True, check=True
            )
            container = inspected.stdout
            restored = await provider._restore(RestoreInput(snapshot_id=ref.id, env={"API_TOKEN": SECRET}))
            assert await restored.fs.read("/workspace/state.txt") == "after-setup"
            assert (await restored.process.exec('printf %s "$API_TOKEN"')).stdout == SECRET, "restore re-applies env"
            forked = await handle.fork()
            assert (await forked.fs.read("/workspace/token-length.txt")) == str(len(SECRET))
            return ref.id, container, forked.id, token
        finally:
            for h in (forked, restored, handle):
                if h is not None:
                    await h.destroy()

    image, container, _, token = asyncio.run(main())
    try:
        assert SECRET not in container, "the container's config holds the secret"
        assert token not in container, "the container's config holds the exec server's token"
        inspected = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True).stdout)
        env = inspected[0]["Config"].get("Env") or []
        assert not any(SECRET in e for e in env), env
        saved = _image_bytes(image)
        assert SECRET.encode() not in saved, "a layer or the config of the committed image holds the secret"
        assert token.encode() not in saved, "a layer or the config of the committed image holds the exec token"
        with tarfile.open(fileobj=io.BytesIO(saved)) as tar:
            names = tar.getnames()
        assert any(n.endswith("layer.tar") for n in names), names  # the layers were really looked at
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
