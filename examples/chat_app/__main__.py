"""``python -m examples.chat_app [--fastapi] [--port N]``: serve the chat app on 127.0.0.1 and print its URL."""

from __future__ import annotations

import argparse

import uvicorn

parser = argparse.ArgumentParser(prog="python -m examples.chat_app")
parser.add_argument("--fastapi", action="store_true", help="serve the FastAPI variant (app_fastapi.py)")
parser.add_argument("--port", type=int, default=8000)
args = parser.parse_args()
if args.fastapi:
    from .app_fastapi import create_app
else:
    from .app import create_app  # type: ignore[assignment]
print(f"chat app: http://127.0.0.1:{args.port}/  (log in as someone else: /login?user=NAME)", flush=True)
uvicorn.run(create_app(), host="127.0.0.1", port=args.port, log_level="warning")
