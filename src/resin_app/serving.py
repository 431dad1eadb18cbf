"""`resin serve`'s `HttpServer` from its command-line options, shared by the one-process
server and every frontend process (`serve_split.py`), and its stderr log."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, Literal


def build_server(
    args: argparse.Namespace,
    engines: Sequence[object],
    recipe: object,
    tokenizer: object,
    name: str,
    context_length: int,
    defaults: object,
    *,
    forward_only: bool = False,
    response_store: object = None,
) -> Any:
    """`resin serve`'s `HttpServer` over `engines` (in-process engines, or `EngineClient`s:
    `forward_only`, the engine processes admit, so this frontend's actor only forwards;
    `response_store`: the one the frontends share, `resin_app.shared_store`)."""
    from resin.server import HttpServer
    from resin.server.connection_limits import ConnectionLimits
    from resin.server.service import Limits

    unlimited = 1 << 30
    return HttpServer(
        list(engines),  # type: ignore[arg-type]
        recipe,  # type: ignore[arg-type]
        tokenizer=tokenizer,  # type: ignore[arg-type]
        model=args.served_model_name or name,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        stream_interval=args.stream_interval,
        request_queue_capacity=args.queue_capacity,
        max_active=unlimited if forward_only else args.max_active,
        admissions_per_step=unlimited if forward_only else 4,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        context_length=context_length,
        limits=Limits(max_generations=args.max_generations, stall_timeout_s=args.stall_timeout),
        connection_limits=ConnectionLimits(
            timeout_keep_alive=args.timeout_keep_alive,
            timeout_headers=args.timeout_headers,
            max_header_bytes=args.max_header_kb * 1024,
            max_connections=args.max_connections,
            timeout_body=args.timeout_body,
        ),
        allowed_hosts=hosts(args.allowed_hosts),
        special_tokens_in_text=args.special_tokens_in_text,
        generation_defaults=defaults,  # type: ignore[arg-type]
        log_requests=not args.disable_log_requests,
        log_stats_s=None if args.disable_log_stats else args.log_stats_interval,
        response_store=response_store,  # type: ignore[arg-type]
    )


def log_to_stderr() -> None:
    """`resin.*` INFO lines (requests, engine stats, warnings) on stderr, timestamped."""
    from resin.server.logs import log_to_stderr as to_stderr

    to_stderr()


def hosts(value: str | None) -> list[str] | Literal["loopback-default"] | None:
    if value is None:
        return "loopback-default"
    return [h.strip() for h in value.split(",") if h.strip()]
