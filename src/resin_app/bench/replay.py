"""Replay a `resin bench serve` workload through the Engine alone (`resin bench replay`).

`resin bench serve --output FILE` records, per completed request, its arrival time, prompt
tokens, output tokens and prefix-cached tokens as the server counted them. This tool builds the
same engine `resin serve` would (`--checkpoint` / `--fake-runner`, `--device`, ...) in this
process and runs that mix through `Engine.submit` / `Engine.step` with nothing around it: each
request arrives at its recorded time, at most the run's `--max-concurrency` are outstanding
(the load generator's own cap), and they enter the engine under the server's admission rule
(`--max-active` inside, `--admissions-per-step` per step, the `resin serve` defaults). A
prompt is random token ids of the recorded length whose first `cached` tokens are shared by
every prompt (the recorded prefix-cache hits happen again); it generates exactly the recorded
output length (`ignore_stop_tokens`). The report puts the HTTP run's throughput beside the
Engine's on that one workload (`http_over_engine`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resin_app.bench.serve import percentiles


@dataclass(frozen=True)
class Recorded:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


def read_workload(path: str, line: int = -1) -> tuple[list[Recorded], dict[str, Any]]:
    """The workload of JSON line `line` (default: the last) of a `bench serve --output` file,
    and that whole line."""
    with open(path, encoding="utf-8") as f:
        lines = [text for text in f.read().splitlines() if text.strip()]
    if not lines:
        raise ValueError(f"{path}: no JSON lines")
    run = json.loads(lines[line])
    rows = run.get("workload")
    if not rows:
        raise ValueError(f"{path}: line {line} has no workload (`resin bench serve --output`)")
    return [Recorded(float(r[0]), int(r[1]), int(r[2]), int(r[3]) if len(r) > 3 else 0)
            for r in rows], run  # fmt: skip


@dataclass
class _Live:
    sent: float
    first: float | None = None


def replay(
    engine: Any,
    requests: Sequence[Recorded],
    *,
    max_concurrency: int,
    max_active: int = 128,
    admissions_per_step: int = 4,
    vocab_size: int,
    seed: int = 0,
) -> dict[str, Any]:
    """Run `requests` through `engine` (see the module docstring); the summary."""
    from resin.events import FinishedEvent, TokensEvent
    from resin.params import SamplingParams

    rng = random.Random(seed)
    longest = max((r.prompt_tokens for r in requests), default=0)
    shared = [rng.randrange(1, vocab_size) for _ in range(longest)]
    upcoming = deque(sorted(requests, key=lambda r: r.arrival_s))
    queued: deque[tuple[Recorded, float]] = deque()
    live: dict[int, _Live] = {}
    done: list[tuple[_Live, float, int, int]] = []  # (times, end, prompt, output)
    outstanding = 0
    start = time.perf_counter()
    while upcoming or queued or live:
        now = time.perf_counter() - start
        while upcoming and outstanding < max_concurrency and upcoming[0].arrival_s <= now:
            queued.append((upcoming.popleft(), now))
            outstanding += 1
        entered = 0
        while queued and entered < admissions_per_step and len(live) < max_active:
            req, sent = queued.popleft()
            length = max(1, req.prompt_tokens)
            cached = max(0, min(req.cached_tokens, length - 1))
            fresh = [rng.randrange(1, vocab_size) for _ in range(length - cached)]
            params = SamplingParams(
                max_output_tokens=max(1, req.output_tokens), ignore_stop_tokens=True
            )
            handle = engine.submit(shared[:cached] + fresh, params)
            live[int(handle.id)] = _Live(sent)
            entered += 1
        if not engine.has_work():
            if upcoming:
                wait = upcoming[0].arrival_s - (time.perf_counter() - start)
                time.sleep(min(max(wait, 0.0), 0.01))
            continue
        for event in engine.step():
            at = time.perf_counter() - start
            if isinstance(event, TokensEvent) and event.token_ids:
                entry = live.get(event.request_id)
                if entry is not None and entry.first is None:
                    entry.first = at
            elif isinstance(event, FinishedEvent) and event.request_id in live:
                entry = live.pop(event.request_id)
                done.append((entry, at, event.num_prompt_tokens, event.num_output_tokens))
                outstanding -= 1
    duration = time.perf_counter() - start
    return _summary(done, duration)


def _summary(done: list[tuple[_Live, float, int, int]], duration: float) -> dict[str, Any]:
    out_tokens = sum(d[3] for d in done)
    in_tokens = sum(d[2] for d in done)
    ttft = [(d[0].first or d[1]) - d[0].sent for d in done]
    e2e = [d[1] - d[0].sent for d in done]
    tpot = [(d[1] - (d[0].first or d[1])) / (d[3] - 1) for d in done if d[3] > 1]
    return {
        "completed": len(done),
        "duration_s": duration,
        "request_throughput": len(done) / duration if duration else 0.0,
        "output_tokens": out_tokens,
        "prompt_tokens": in_tokens,
        "output_tok_s": out_tokens / duration if duration else 0.0,
        "total_tok_s": (out_tokens + in_tokens) / duration if duration else 0.0,
        "ttft_ms": {k: v * 1000 for k, v in percentiles(ttft).items()},
        "tpot_ms": {k: v * 1000 for k, v in percentiles(tpot).items()},
        "e2e_ms": {k: v * 1000 for k, v in percentiles(e2e).items()},
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resin bench replay", description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, help="a `resin bench serve --output` file")
    p.add_argument("--line", type=int, default=-1, help="which JSON line (%(default)s: last)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="the model `resin serve --checkpoint` served")
    src.add_argument("--fake-runner", action="store_true", help="the zero-cost runner")
    p.add_argument("--model", default=None, help="a default-model name (as `resin serve`)")
    p.add_argument("--device", default="cpu", help="(%(default)s)")
    p.add_argument("--runner", default="auto", help="runner family (%(default)s)")
    p.add_argument("--context-length", type=int, default=None, help="(the model's)")
    p.add_argument(
        "--max-active", type=int, default=128, help="inside the engine at once (%(default)s)"
    )
    p.add_argument(
        "--admissions-per-step", type=int, default=4, help="entering per step (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="prompt token seed (%(default)s)")
    p.add_argument("--output", default=None, help="append the report as one JSON line here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from resin_app.loading import LoadOptions, load

    args = parser().parse_args(argv)
    try:
        requests, run = read_workload(args.workload, args.line)
    except (OSError, ValueError) as exc:
        print(f"resin bench replay: error: {exc}", file=sys.stderr)
        return 2
    options = LoadOptions(
        checkpoint=args.checkpoint,
        model=args.model,
        device=args.device,
        fake=args.fake_runner,
        runner=args.runner,
        context_length=args.context_length,
    )
    loaded = load(options, progress=False)
    try:
        engine = loaded.engines[0]
        config = run.get("config", {})
        result = replay(
            engine,
            requests,
            max_concurrency=int(config.get("max_concurrency") or len(requests)),  # None: open
            max_active=args.max_active,
            admissions_per_step=args.admissions_per_step,
            vocab_size=int(loaded.tokenizer.vocab_size),
            seed=args.seed,
        )
    finally:
        loaded.close()
    http = float(run.get("output_tok_s") or 0.0)
    result["http_output_tok_s"] = http
    result["http_over_engine"] = http / result["output_tok_s"] if result["output_tok_s"] else 0.0
    result["workload"] = {"file": args.workload, "line": args.line, "requests": len(requests)}
    print(
        f"engine alone: {result['completed']} requests in {result['duration_s']:.2f}s, "
        f"{result['output_tok_s']:.0f} output tok/s; HTTP {http:.0f} output tok/s "
        f"(HTTP / Engine {result['http_over_engine']:.3f})"
    )
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
    return 0
