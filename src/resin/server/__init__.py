"""The HTTP server: OpenAI- and Anthropic-compatible APIs, Prometheus metrics, a chat page.

`HttpServer(engine, recipe, tokenizer=..., model=...)` runs the engine on one actor thread
and serves it with FastAPI + uvicorn. FastAPI is imported only when this package is.
"""

from resin.server.app import HttpServer

__all__ = ["HttpServer"]
