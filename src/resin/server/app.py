"""`HttpServer`: the FastAPI app, the engine actor and uvicorn, wired together.

```python
server = HttpServer(engine, recipe, tokenizer=tok, model="smollm2")
server.serve()          # blocks; SIGTERM or server.shutdown() stops it cleanly
HttpServer([engine0, engine1], recipe, ...)   # data-parallel replicas (`replicas.py`)
```
Shutdown order: stop intake (new requests get 503), abort open requests, let the actor finish
its current step and drain, end open streams with their final events, then stop listening.
If the actor dies, requests get 503 and the listener stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from resin.frontend.actor import EngineActor
from resin.frontend.engine_loop import DEFAULT_MAX_ACTIVE
from resin.frontend.errors import FrontendError
from resin.frontend.ports import EngineLike
from resin.frontend.replicas import ReplicaSet
from resin.generation_config import GenerationDefaults
from resin.generation_config import resolve as resolve_defaults
from resin.metrics.collector import MetricsSnapshot
from resin.metrics.prometheus import PrometheusExporter
from resin.recipe import Recipe
from resin.server import anthropic_messages, misc, openai_chat, openai_completions, responses
from resin.server.asgi import GuardMiddleware, default_allowed_hosts
from resin.server.connection_limits import ConnectionLimits, protocol_class
from resin.server.errors import ApiError, ClientDisconnected, error_handler
from resin.server.logs import RequestLog, StatsLog, log_to_stderr, logging_configured
from resin.server.metrics import ServerMetrics
from resin.server.response_store import Responses
from resin.server.service import Limits, Service
from resin.tokenizer import TokenizerLike

log = logging.getLogger("resin.server")

STOP_GRACE_S = 5.0
"""After a stop, how long open streams wait for the engine's final events; then they end
with the shutdown event anyway (a stalled or stopped engine never sends them), well inside
uvicorn's 10 s graceful-shutdown window."""


class HttpServer:
    """An OpenAI/Anthropic-compatible HTTP server around one engine, or several replicas."""

    def __init__(
        self,
        engine: EngineLike | Sequence[EngineLike],
        recipe: Recipe,
        *,
        tokenizer: TokenizerLike | None = None,
        model: str = "resin",
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        stream_interval: int = 4,
        request_queue_capacity: int = 1024,
        max_active: int = DEFAULT_MAX_ACTIVE,
        admissions_per_step: int = 4,
        client_buffer: int = 64,
        max_body_bytes: int = 4 * 1024 * 1024,
        context_length: int | None = None,
        limits: Limits | None = None,
        connection_limits: ConnectionLimits | None = None,
        allowed_hosts: Sequence[str] | Literal["loopback-default"] | None = "loopback-default",
        special_tokens_in_text: bool = False,
        generation_defaults: GenerationDefaults | None = None,
        log_requests: bool = True,
        log_stats_s: float | None = 10.0,
        response_store: Responses | None = None,
    ) -> None:
        """`log_requests`: a log line per request; `log_stats_s`: the engines' summary every
        so many seconds while busy (`resin.server.logs`, the `resin.server` logger; None: no
        summary). `generation_defaults`: sampling for the fields a request omits; None (the
        default) reads them as `resin serve` does (`--generation-config auto`): the checkpoint
        folder's `generation_config.json` (its `max_new_tokens` caps a request that names no
        `max_tokens`), found through the tokenizer's folder (`Tokenizer.from_dir`).
        `response_store`: where stored Responses-API answers are kept (None: a `ResponseStore`
        of this server's own)."""
        tokenizer = tokenizer or getattr(recipe, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("HttpServer needs a tokenizer (pass tokenizer=...)")
        self.host = host
        self.port = port
        engines = list(engine) if isinstance(engine, Sequence) else [engine]
        self._uvicorn: Any = None
        actor_options: dict[str, Any] = {
            "queue_capacity": request_queue_capacity,
            "max_active": max_active,
            "admissions_per_step": admissions_per_step,
            "stream_capacity": client_buffer,
            "on_death": self._on_death,
        }
        self.actor: EngineActor | ReplicaSet = (
            ReplicaSet(engines, **actor_options)
            if len(engines) > 1
            else EngineActor(engines[0], **actor_options)
        )
        self.metrics = ServerMetrics(
            running=lambda: float(sum(e.num_running for e in engines)),
            waiting=lambda: float(sum(e.num_waiting for e in engines) + self.actor.queued),
            engine_render=_engine_exporter(self.actor, model),
        )
        context = context_length or engines[0].context_length
        held = min((_arena_tokens(e, context) for e in engines), default=context)
        if held < context:
            log.warning(
                "the KV cache holds one sequence of %d tokens, not the context length %d: "
                "serving %d (a larger cache: the runner's cache_bytes, `resin serve "
                "--kv-cache-memory`)",
                held,
                context,
                held,
            )
            context = held
        self.service = Service(
            self.actor,
            recipe,
            tokenizer,
            model,
            context,
            stream_interval,
            self.metrics,
            limits or Limits(),
            special_tokens_in_text,
            defaults=_defaults(generation_defaults, tokenizer),
            responses=response_store,
        )
        self.connection_limits = connection_limits or ConnectionLimits()
        if allowed_hosts == "loopback-default":
            allowed_hosts = default_allowed_hosts(host)
        guard = GuardMiddleware(
            self._build_app(),
            api_key,
            max_body_bytes,
            allowed_hosts,
            self.connection_limits.timeout_body,
        )
        self.app: Any = RequestLog(guard) if log_requests else guard
        self.ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grace_armed = False
        self._announce = False
        self._abandoned = False
        self._stats = (
            None
            if log_stats_s is None
            else StatsLog(self._snapshots, lambda: self.actor.queued, log_stats_s)
        )

    def _snapshots(self) -> list[MetricsSnapshot]:
        snaps = (getattr(a.engine, "metrics", None) for a in self.actor.replicas)
        return [s for s in snaps if isinstance(s, MetricsSnapshot)]

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self._loop = asyncio.get_running_loop()
            self.actor.start(self._loop)
            if self._stats is not None:
                self._stats.start()
            self.ready.set()
            if self._announce:
                url = f"http://{self.host}:{self.port}"
                name = self.service.model
                log.info("serving %s at %s (chat page: %s/ , API: %s/v1)", name, url, url, url)
            yield
            if self._stats is not None:
                self._stats.stop()
            # After an abandon the engine may never answer: do not wait long for its thread.
            await asyncio.to_thread(self.actor.stop, 1.0 if self._abandoned else 10.0)
            await asyncio.sleep(0)  # let the actor's last deliveries reach their streams

        app = FastAPI(title="Resin", version="0.1.0", lifespan=lifespan)
        app.state.service = self.service
        errors = (
            ApiError,
            ClientDisconnected,
            FrontendError,
            RequestValidationError,
            HTTPException,
        )
        for kind in (*errors, Exception):
            app.add_exception_handler(kind, error_handler)
        for module in (openai_chat, openai_completions, responses, anthropic_messages, misc):
            app.include_router(module.router)
        app.mount("/static", StaticFiles(directory=misc.STATIC), name="static")
        return app

    def make_uvicorn(self, **uvicorn_overrides: Any) -> Any:
        """A uvicorn server whose SIGTERM/SIGINT handling runs `shutdown()` first."""
        import uvicorn

        owner = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                owner.stop_intake()
                super().handle_exit(sig, frame)

        config: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "log_level": "warning",
            "timeout_graceful_shutdown": 10,
            "backlog": 4096,
            "limit_concurrency": None,
            "http": protocol_class(self.connection_limits),
            "timeout_keep_alive": self.connection_limits.timeout_keep_alive,
        }
        self._uvicorn = _Server(uvicorn.Config(self.app, **(config | uvicorn_overrides)))
        return self._uvicorn

    def serve(self, **uvicorn_overrides: Any) -> None:
        """Run until SIGTERM/SIGINT or `shutdown()` (blocks the calling thread). Says where it
        serves and logs its request and stats lines on stderr, as `resin serve` does, unless
        the program configured logging itself."""
        if not logging_configured():
            log_to_stderr()
        self._announce = True
        self.make_uvicorn(**uvicorn_overrides).run()

    def shutdown(self) -> None:
        """Stop intake, end open requests (their streams finish cleanly), stop listening.

        Safe from any thread. The actor finishes its current step, aborts what is left and
        delivers the final events; uvicorn then closes the drained connections. Streams the
        engine has not ended `STOP_GRACE_S` later end with the shutdown event anyway."""
        self.stop_intake()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def stop_intake(self) -> None:
        """Refuse new requests and end open ones: the engine ends them, or, after
        `STOP_GRACE_S`, their streams end without it (safe from any thread)."""
        self.actor.request_stop()
        loop = self._loop
        if loop is None or self._grace_armed:
            return
        self._grace_armed = True
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(loop.call_later, STOP_GRACE_S, self._abandon)

    def _abandon(self) -> None:
        """The engine did not end its requests within the grace: end their streams here."""
        for actor in self.actor.replicas:
            if actor.load:
                log.warning(
                    "the engine did not end %d requests within %g s of the stop; "
                    "ending their streams",
                    actor.load,
                    STOP_GRACE_S,
                )
                actor.abandon()
                self._abandoned = True

    def _on_death(self) -> None:
        log.error("engine actor died (%s); stopping the listener", self.actor.error)
        if self._uvicorn is not None:
            loop = asyncio.get_running_loop()
            # Answer in-flight requests with 503 for a moment, then stop listening.
            loop.call_later(1.0, setattr, self._uvicorn, "should_exit", True)


def _arena_tokens(engine: object, context: int) -> int:
    """The longest sequence the engine's KV arena holds alone (at most `context`), so the
    context the server reports and enforces is one the cache can take; `context` when the
    engine does not say (an engine in another process, a test double)."""
    longest = getattr(getattr(engine, "arena", None), "longest_sequence", None)
    return context if longest is None else min(context, int(longest))


def _defaults(given: GenerationDefaults | None, tokenizer: object) -> GenerationDefaults:
    """`given`, else the checkpoint's (`generation_config.json` of the tokenizer's folder)."""
    if given is not None:
        return given
    folder = getattr(tokenizer, "source_dir", None)
    return resolve_defaults("auto", folder) if folder is not None else GenerationDefaults()


def _engine_exporter(front: EngineActor | ReplicaSet, model: str) -> Callable[[], bytes] | None:
    """The engines' own Prometheus exporter when they keep metrics (the real engine does).
    One engine: `num_requests_waiting` adds the server's intake queue to the engine's. Several
    replicas: one series each (`replica` label); a replica's waiting requests are those in its
    engine's queue or routed to it and not yet admitted."""
    actors = front.replicas
    if any(getattr(a.engine, "metrics", None) is None for a in actors):
        return None

    def snapshot(actor: EngineActor) -> Callable[[], MetricsSnapshot | None]:
        def read() -> MetricsSnapshot | None:
            snap: MetricsSnapshot | None = getattr(actor.engine, "metrics", None)
            if snap is None:
                return None
            if len(actors) == 1:
                return replace(snap, num_requests_waiting=snap.num_requests_waiting + front.queued)
            routed = max(snap.num_requests_waiting, actor.load - snap.num_requests_running)
            return replace(snap, num_requests_waiting=routed)

        return read

    sources = [snapshot(a) for a in actors]
    exporter = PrometheusExporter(sources if len(actors) > 1 else sources[0], model_name=model)
    render: Callable[[], bytes] = exporter.render
    return render
