"""The same chat app on FastAPI: the parts of app.py, in a FastAPI app (a few lines)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from boxwright.middleware import SandboxMiddleware

from .app import AuthorizeRuns, build


def create_app(db: str | os.PathLike[str] | None = None, **options: Any) -> FastAPI:
    service, owners, routes, lifespan = build(db, **options)
    app = FastAPI(routes=routes, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(AuthorizeRuns, service=service, owners=owners)
    app.add_middleware(SandboxMiddleware, service=service)
    return app
