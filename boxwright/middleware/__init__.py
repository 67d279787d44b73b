"""Run agents from any ASGI app: the service, its middleware and routes, and the tail responses."""

from .delivery import (
    DeliveryRefusal,
    check_tail_request,
    final_status,
    long_poll_response,
    request_offset,
    sse_response,
    websocket_tail,
)
from .service import (
    RecordDurability,
    RunChoice,
    RunFactory,
    RunSpec,
    SandboxMiddleware,
    SandboxService,
    StartRunRequest,
    sandbox_routes,
)

__all__ = [
    "DeliveryRefusal",
    "RecordDurability",
    "RunChoice",
    "RunFactory",
    "RunSpec",
    "SandboxMiddleware",
    "SandboxService",
    "StartRunRequest",
    "check_tail_request",
    "final_status",
    "long_poll_response",
    "request_offset",
    "sandbox_routes",
    "sse_response",
    "websocket_tail",
]
