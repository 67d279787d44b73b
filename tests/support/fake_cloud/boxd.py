"""A fake boxd: the ``boxd.api.v1.BoxdApi`` gRPC service, as the ``boxd`` SDK 0.2.19 calls it.

Follows ``boxd`` 0.2.19 (``boxd/resources/machines.py``, ``snapshots.py``, ``_streaming.py``),
served with the servicer base and messages the SDK itself ships (``boxd._generated``):

- Auth: ``authorization: Bearer <token>`` metadata on every call (UNAUTHENTICATED otherwise).
  The SDK's API-key exchange (``POST /api/v1/auth/token`` on the console origin) is not served:
  tests hand the provider the token it would have got (``BOXD_TOKEN`` mode).
- ``CreateVm`` (name, labels, isolated, config.vcpu, org) and ``CreateVmFromSnapshot`` ->
  CreateVmResponse (status ``running``); ``GetVm`` (id or name) -> GetVmResponse with
  ``access_domain`` / NOT_FOUND for a destroyed machine; ``ListVms`` (label_selector);
  ``DestroyVm``; ``StartVm``/``ResumeVm``/``WakeVm``; ``ForkVm`` (a copy of the disk; processes
  are not copied here); ``CreateSnapshot``/``GetSnapshot`` (``status`` goes ``pending`` ->
  ``ready``)/``DeleteSnapshot``; ``SetProxyPort`` (the machine's one public URL).
- ``Exec`` (bidi ExecChunk): the first chunk's ``command`` runs through ``sh -c`` as ``boxd``
  (home ``/home/boxd``); later ``stdin`` chunks feed it and the end of the request stream closes
  its stdin; output chunks carry ``is_stderr``; the last chunk carries the exit code. A client
  that cancels the call only detaches: the command keeps running (seed: the process survived it).
- ``https://<name>.boxd.fake`` (Host header, on ``http_url``) proxies to the port set by
  ``SetProxyPort``; anyone may call it (boxd's URL is public).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
from boxd._generated import api_pb2 as pb  # type: ignore[import-untyped]
from boxd._generated import api_pb2_grpc as pb_grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .backend import FakeCloud, Machine, ServerThread

DOMAIN = "boxd.fake"


@dataclass
class Vm:
    id: str
    name: str
    machine: Machine
    labels: dict[str, str]
    vcpu: int
    isolated: bool = False
    status: str = "running"
    port: int = 0
    created_at: int = field(default_factory=lambda: int(time.time()))


class FakeBoxd:
    """The fake cloud. ``start()`` serves it; ``base_url``/``token`` go into the provider."""

    def __init__(self, image: str, *, token: str = "bxd_fake_token") -> None:
        self.cloud = FakeCloud(image, "boxd", "/home/boxd")
        self.token = token
        self.vms: dict[str, Vm] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.create_delay = 0.0
        self.tasks: set[asyncio.Future[None]] = set()
        self._gone: list[Machine] = []
        self.http = ServerThread(self._http_app())
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="fake-boxd", daemon=True)
        self._ready = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeBoxd:
        self.http.start()
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the fake boxd gRPC server did not start")
        return self

    def close(self) -> list[str]:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)
        self.http.stop()
        return self.cloud.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def http_url(self) -> str:
        return self.http.url

    def commands(self) -> list[str]:
        seen: list[str] = []
        for machine in [v.machine for v in list(self.vms.values())] + self._gone:
            seen.extend(" ".join(c.argv) for c in machine.commands)
        return seen

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = grpc.aio.server()
        pb_grpc.add_BoxdApiServicer_to_server(_Api(self), server)
        self._port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._ready.set()
        await self._stopped.wait()
        await server.stop(1)

    def run_on_loop(self, coro: Any) -> Any:
        """Run a coroutine on the fake's loop from another thread (tests flip machine states)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    # -- machines --------------------------------------------------------------------------------

    def find(self, ref: str) -> Vm | None:
        vm = self.vms.get(ref)
        if vm is None:
            vm = next((v for v in self.vms.values() if v.name == ref), None)
        return vm

    def info(self, vm: Vm) -> Any:
        return pb.GetVmResponse(
            vm_id=vm.id,
            name=vm.name,
            image_ref="boxd/ubuntu:24.04",
            status=vm.status,
            access_domain=DOMAIN,
            vcpu=vm.vcpu,
            memory_bytes=vm.vcpu * 4 * 1024**3,
            disk_bytes=100 * 1000**3,
            isolated=vm.isolated,
            labels=vm.labels,
            created_at=vm.created_at,
        )

    async def make(
        self, name: str, labels: dict[str, str], vcpu: int, image: str | None = None, isolated: bool = False
    ) -> Vm:
        if any(v.name == name for v in self.vms.values()):
            raise KeyError(name)
        vm_id = "vm_" + secrets.token_hex(8)
        machine = await self.cloud.create(image=image, sandbox_id=vm_id)
        vm = Vm(vm_id, name, machine, dict(labels), vcpu or 2, isolated)
        self.vms[vm_id] = vm
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        return vm

    async def destroy(self, vm: Vm) -> None:
        self.vms.pop(vm.id, None)
        self._gone.append(vm.machine)
        await self.cloud.remove(vm.machine.id)

    # -- the public URL --------------------------------------------------------------------------

    def _http_app(self) -> Any:
        async def proxy(request: Request) -> Response:
            host = request.headers.get("host", "").partition(":")[0]
            name = host.removesuffix("." + DOMAIN)
            vm = next((v for v in list(self.vms.values()) if v.name == name), None)
            if vm is None or not vm.port:
                return JSONResponse({"error": "no such machine or route"}, status_code=404)
            cloud = vm.machine.cloud
            future = asyncio.run_coroutine_threadsafe(
                cloud.call(cloud.api.inspect_container, vm.machine.container),
                self._loop,  # type: ignore[arg-type]
            )
            info = await asyncio.wrap_future(future)
            address = (info.get("NetworkSettings") or {}).get("IPAddress")
            async with httpx.AsyncClient(timeout=10) as client:
                try:
                    upstream = await client.get(f"http://{address}:{vm.port}{request.url.path}")
                except httpx.HTTPError as exc:
                    return JSONResponse({"error": str(exc)}, status_code=502)
            return Response(upstream.content, status_code=upstream.status_code)

        return Starlette(routes=[Route("/{path:path}", proxy, methods=["GET"])])


class _Api(pb_grpc.BoxdApiServicer):  # type: ignore[misc]
    def __init__(self, fake: FakeBoxd) -> None:
        self.fake = fake

    async def _auth(self, context: Any, method: str) -> None:
        self.fake.calls.append(method)
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != f"Bearer {self.fake.token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid token")

    async def _vm(self, ref: str, context: Any) -> Vm:
        vm = self.fake.find(ref)
        if vm is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"machine not found: {ref}")
        assert vm is not None
        return vm

    async def CreateVm(self, request: Any, context: Any) -> Any:
        await self._auth(context, "CreateVm")
        try:
            vm = await self.fake.make(request.name, dict(request.labels), request.config.vcpu, None, request.isolated)
        except KeyError:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"machine {request.name} exists")
        return pb.CreateVmResponse(vm_id=vm.id, name=vm.name, status=vm.status, url=f"https://{vm.name}.{DOMAIN}")

    async def CreateVmFromSnapshot(self, request: Any, context: Any) -> Any:
        await self._auth(context, "CreateVmFromSnapshot")
        snap = self.fake.snapshots.get(request.snapshot)
        if snap is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"snapshot not found: {request.snapshot}")
        assert snap is not None
        try:
            vm = await self.fake.make(
                request.name, dict(request.labels), snap["vcpu"], image=snap["image"], isolated=request.isolated
            )
        except KeyError:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"machine {request.name} exists")
        return pb.CreateVmResponse(vm_id=vm.id, name=vm.name, status=vm.status, url=f"https://{vm.name}.{DOMAIN}")

    async def GetVm(self, request: Any, context: Any) -> Any:
        await self._auth(context, "GetVm")
        return self.fake.info(await self._vm(request.vm_id, context))

    async def ListVms(self, request: Any, context: Any) -> Any:
        await self._auth(context, "ListVms")
        found = []
        for vm in list(self.fake.vms.values()):
            if all(vm.labels.get(k) == v for k, _, v in (t.partition("=") for t in request.label_selector)):
                found.append(self.fake.info(vm))
        return pb.ListVmsResponse(vms=found)

    async def DestroyVm(self, request: Any, context: Any) -> Any:
        await self._auth(context, "DestroyVm")
        await self.fake.destroy(await self._vm(request.vm_id, context))
        return pb.DestroyVmResponse()

    async def _wake(self, request: Any, context: Any, method: str) -> None:
        await self._auth(context, method)
        vm = await self._vm(request.vm_id, context)
        if vm.status == "stopped":
            await vm.machine.cloud.restart(vm.machine)
        vm.status = "running"

    async def StartVm(self, request: Any, context: Any) -> Any:
        await self._wake(request, context, "StartVm")
        return pb.StartVmResponse()

    async def ResumeVm(self, request: Any, context: Any) -> Any:
        await self._wake(request, context, "ResumeVm")
        return pb.ResumeVmResponse()

    async def WakeVm(self, request: Any, context: Any) -> Any:
        await self._wake(request, context, "WakeVm")
        return pb.WakeVmResponse()

    async def ForkVm(self, request: Any, context: Any) -> Any:
        await self._auth(context, "ForkVm")
        source = await self._vm(request.source_vm_id, context)
        image = await self.fake.cloud.commit(source.machine, "boxwright-fake-boxd-fork")
        name = request.name or f"{source.name}-fork-{secrets.token_hex(3)}"
        labels = {**source.labels, **dict(request.labels)}
        vm = await self.fake.make(name, labels, source.vcpu, image=image, isolated=source.isolated or request.isolated)
        return pb.ForkVmResponse(vm_id=vm.id, name=vm.name, status=vm.status, forked_from=source.id)

    async def CreateSnapshot(self, request: Any, context: Any) -> Any:
        await self._auth(context, "CreateSnapshot")
        source = await self._vm(request.vm, context)
        if request.name in self.fake.snapshots:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"snapshot {request.name} exists")
        snap = {"id": "snap_" + secrets.token_hex(6), "name": request.name, "status": "pending", "vcpu": source.vcpu}
        self.fake.snapshots[request.name] = snap
        snap["image"] = await self.fake.cloud.commit(source.machine, "boxwright-fake-boxd-snapshot")

        async def settle() -> None:  # memory and disk are written out before it can be restored
            await asyncio.sleep(0.3)
            snap["status"] = "ready"

        task = asyncio.ensure_future(settle())
        self.fake.tasks.add(task)
        task.add_done_callback(self.fake.tasks.discard)
        return pb.CreateSnapshotResponse(snapshot_id=snap["id"], name=request.name, version=1, status="pending")

    async def GetSnapshot(self, request: Any, context: Any) -> Any:
        await self._auth(context, "GetSnapshot")
        snap = self.fake.snapshots.get(request.name)
        if snap is None:
            return pb.GetSnapshotResponse()
        info = pb.SnapshotInfo(snapshot_id=snap["id"], name=snap["name"], version=1, status=snap["status"])
        return pb.GetSnapshotResponse(snapshot=info)

    async def DeleteSnapshot(self, request: Any, context: Any) -> Any:
        await self._auth(context, "DeleteSnapshot")
        snap = self.fake.snapshots.pop(request.name, None)
        if snap is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"snapshot not found: {request.name}")
        assert snap is not None
        await self.fake.cloud.remove_image(snap["image"])
        return pb.DeleteSnapshotResponse()

    async def SetProxyPort(self, request: Any, context: Any) -> Any:
        await self._auth(context, "SetProxyPort")
        vm = await self._vm(request.vm or request.vm_name, context)
        vm.port = int(request.port)
        return pb.SetProxyPortResponse()

    async def Exec(self, request_iterator: Any, context: Any) -> Any:
        await self._auth(context, "Exec")
        first = await request_iterator.__anext__()
        vm = await self._vm(first.vm_id, context)
        if vm.status != "running":
            vm.status = "running"  # a suspended machine wakes on the next command
        process = await vm.machine.start(["sh", "-c", first.command], stdin=True)

        async def feed() -> None:
            try:
                async for chunk in request_iterator:
                    if chunk.stdin and chunk.data:
                        await process.write(bytes(chunk.data))
            except Exception:
                pass
            finally:
                process.close_stdin()

        feeder = asyncio.ensure_future(feed())
        try:
            while (item := await process.output.get()) is not None:
                yield pb.ExecChunk(data=item[1], is_stderr=item[0] == "stderr")
            yield pb.ExecChunk(exit_code=await process.exit_code)
        finally:
            feeder.cancel()
