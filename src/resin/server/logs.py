"""The server's log lines: one per HTTP request, and a periodic engine summary (as vLLM's).

Both go to the `resin.server` logger at INFO, by default in `resin serve` and in a library
`HttpServer` alike (`--disable-log-requests` / `log_requests=False`, `--disable-log-stats` /
`log_stats_s=None` turn them off); `HttpServer.serve()` shows them on stderr (`log_to_stderr`)
unless the program configured logging itself.

- `RequestLog` (pure ASGI): `POST /v1/chat/completions 200 1.234s 127.0.0.1 prompt_tokens=12
  completion_tokens=34` once the answer has been sent (a stream: when it ended); the token
  counts are those of the generations the request started (summed over n and prompts, what
  was generated before an abort included). A client that left before its answer was complete
  is logged as 499 (nginx's "client closed request"), whatever status had been sent.
- `StatsLog` (a thread): every `interval` seconds while the engines are busy or were since the
  last line, `prompt 812.0 tok/s, generation 95.5 tok/s, running 4, waiting 0, KV cache 12.5%,
  prefix cache hits 40.0%`: token rates over the interval, requests now, KV-cache usage and the
  prefix-cache hit rate over the interval.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from resin.metrics.collector import MetricsSnapshot

log = logging.getLogger("resin.server")


@dataclass(slots=True)
class RequestTokens:
    """The generations one HTTP request started (`track`), for its log line."""

    generations: list[Any] = field(default_factory=list)

    def counts(self) -> tuple[int, int]:
        """(prompt tokens, completion tokens) over every generation."""
        prompt = sum(int(g.prompt_len) for g in self.generations)
        return prompt, sum(int(g.completion_tokens) for g in self.generations)


_CURRENT: ContextVar[RequestTokens | None] = ContextVar("resin_request_tokens", default=None)


def track(generations: Iterable[Any]) -> None:
    """Count `generations` (`Generation`s: `prompt_len`, `completion_tokens`) in the log line
    of the request being handled (nothing when requests are not logged)."""
    current = _CURRENT.get()
    if current is not None:
        current.generations.extend(generations)


CLIENT_CLOSED = 499
"""The status logged for a request whose client left before its answer was complete."""


class RequestLog:
    """Logs one line per HTTP request after its answer (see module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0
        complete = gone = False
        tokens = RequestTokens()
        _CURRENT.set(tokens)  # this task's context: the handler and its stream tasks see it

        async def tracked(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                complete = True
            await send(message)

        async def watched() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or (message["type"] == "http.disconnect" and not complete)
            return message

        try:
            await self.app(scope, watched, tracked)
        finally:
            client = scope.get("client")
            counts = ""
            if tokens.generations:
                prompt, completion = tokens.counts()
                counts = f" prompt_tokens={prompt} completion_tokens={completion}"
            log.info(
                "%s %s %d %.3fs %s%s",
                scope.get("method", "-"),
                scope.get("path", "-"),
                CLIENT_CLOSED if gone else status,
                time.perf_counter() - start,
                client[0] if client else "-",
                counts,
            )


Snapshots = Callable[[], Sequence[MetricsSnapshot]]


class StatsLog:
    """A daemon thread logging the engines' summary every `interval` seconds."""

    def __init__(self, snapshots: Snapshots, queued: Callable[[], int], interval: float) -> None:
        self.snapshots = snapshots
        self.queued = queued
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resin-stats", daemon=True)
        self._last: tuple[float, int, int, int, int] | None = None

    def start(self) -> None:
        self._last = self._totals()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _totals(self) -> tuple[float, int, int, int, int]:
        snaps = self.snapshots()
        return (
            time.monotonic(),
            sum(s.prompt_tokens for s in snaps),
            sum(s.generation_tokens for s in snaps),
            sum(s.prefix_cache_queries for s in snaps),
            sum(s.prefix_cache_hits for s in snaps),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            line = self.line()
            if line is not None:
                log.info("%s", line)

    def line(self) -> str | None:
        """The summary since the previous call; None when nothing ran then or runs now."""
        assert self._last is not None
        snaps = self.snapshots()
        now = self._totals()
        (t0, p0, g0, q0, h0), (t1, p1, g1, q1, h1) = self._last, now
        self._last = now
        running = sum(s.num_requests_running for s in snaps)
        waiting = sum(s.num_requests_waiting for s in snaps) + self.queued()
        if p1 == p0 and g1 == g0 and not running and not waiting:
            return None
        dt = max(t1 - t0, 1e-9)
        kv = max((s.kv_cache_usage_perc for s in snaps), default=0.0)
        hits = 100.0 * (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
        return (
            f"prompt {(p1 - p0) / dt:.1f} tok/s, generation {(g1 - g0) / dt:.1f} tok/s, "
            f"running {running}, waiting {waiting}, KV cache {100 * kv:.1f}%, "
            f"prefix cache hits {hits:.1f}%"
        )


class _Stderr(logging.Handler):
    """Writes to `sys.stderr` as it is when a line is logged (a harness that swaps the stream,
    as pytest's capture does, leaves no handler writing to a closed file)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def log_to_stderr() -> None:
    """`resin.*` INFO lines (requests, engine stats, warnings) on stderr, timestamped."""
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("resin")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def logging_configured() -> bool:
    """Whether the program set up logging for `resin` (a handler here or at the root)."""
    return bool(logging.getLogger("resin").handlers or logging.getLogger().handlers)
