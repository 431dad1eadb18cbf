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

A load driven from several client processes at once (each appending its line to one file) is
replayed as one with `--line all`: the lines' workloads merged, their concurrency caps and
HTTP throughputs summed. Several `--workload` files replay one after the other on the one
engine (loaded once), a report line each.
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

from resin.frontend.engine_loop import DEFAULT_MAX_ACTIVE
from resin_app.bench.serve import percentiles


@dataclass(frozen=True)
class Recorded:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class Load:
    """What one replay runs: the requests, the clients' concurrency cap and their HTTP
    throughput, summed over the lines taken."""

    requests: list[Recorded]
    max_concurrency: int
    http_output_tok_s: float
    clients: int


def read_load(path: str, line: int | None = -1) -> Load:
    """Line `line` of a `bench serve --output` file, or (None) every line as one load from
    that many client processes run together."""
    runs = _runs(path)
    picked = list(enumerate(runs)) if line is None else [(line, runs[line])]
    requests: list[Recorded] = []
    concurrency = 0
    for index, run in picked:
        rows = _rows(path, run, index)
        requests += rows
        concurrency += int(run.get("config", {}).get("max_concurrency") or len(rows))  # None: open
    http = sum(float(run.get("output_tok_s") or 0.0) for _, run in picked)
    return Load(sorted(requests, key=lambda r: r.arrival_s), concurrency, http, len(picked))


def _runs(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        lines = [text for text in f.read().splitlines() if text.strip()]
    if not lines:
        raise ValueError(f"{path}: no JSON lines")
    return [json.loads(text) for text in lines]


def _rows(path: str, run: dict[str, Any], line: int) -> list[Recorded]:
    rows = run.get("workload")
    if not rows:
        raise ValueError(f"{path}: line {line} has no workload (`resin bench serve --output`)")
    return [Recorded(float(r[0]), int(r[1]), int(r[2]), int(r[3]) if len(r) > 3 else 0)
            for r in rows]  # fmt: skip


@dataclass
class _Live:
    sent: float
    first: float | None = None


def replay(
    engine: Any,
    requests: Sequence[Recorded],
    *,
    max_concurrency: int,
    max_active: int = DEFAULT_MAX_ACTIVE,
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


def _line(text: str) -> int | None:
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a line number or all, got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resin bench replay", description=__doc__.splitlines()[0])
    p.add_argument(
        "--workload",
        required=True,
        nargs="+",
        metavar="FILE",
        help="`resin bench serve --output` files, replayed one after the other",
    )
    p.add_argument(
        "--line",
        type=_line,
        default=-1,
        metavar="N|all",
        help="which JSON line of each file (%(default)s: the last; all: every line as one load "
        "from that many client processes)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="the model `resin serve --checkpoint` served")
    src.add_argument("--fake-runner", action="store_true", help="the zero-cost runner")
    p.add_argument("--model", default=None, help="a default-model name (as `resin serve`)")
    p.add_argument("--device", default="cpu", help="(%(default)s)")
    p.add_argument("--runner", default="auto", help="runner family (%(default)s)")
    p.add_argument("--context-length", type=int, default=None, help="(the model's)")
    p.add_argument(
        "--max-active",
        type=int,
        default=DEFAULT_MAX_ACTIVE,
        help="inside the engine at once (%(default)s, as resin serve)",
    )
    p.add_argument(
        "--admissions-per-step", type=int, default=4, help="entering per step (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="prompt token seed (%(default)s)")
    p.add_argument("--output", default=None, help="append each report as one JSON line here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from resin_app.loading import LoadOptions, load

    args = parser().parse_args(argv)
    try:
        loads = [read_load(path, args.line) for path in args.workload]
    except (OSError, ValueError, IndexError) as exc:
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
        for path, one in zip(args.workload, loads, strict=True):
            result = replay(
                loaded.engines[0],
                one.requests,
                max_concurrency=one.max_concurrency,
                max_active=args.max_active,
                admissions_per_step=args.admissions_per_step,
                vocab_size=int(loaded.tokenizer.vocab_size),
                seed=args.seed,
            )
            _report(result, one, path, args.line, args.output)
    finally:
        loaded.close()
    return 0


def _report(
    result: dict[str, Any], one: Load, path: str, line: int | None, output: str | None
) -> None:
    http = one.http_output_tok_s
    result["http_output_tok_s"] = http
    result["http_over_engine"] = http / result["output_tok_s"] if result["output_tok_s"] else 0.0
    result["workload"] = {"file": path, "line": "all" if line is None else line,
                          "requests": len(one.requests), "clients": one.clients,
                          "max_concurrency": one.max_concurrency}  # fmt: skip
    print(
        f"{path}: c={one.max_concurrency}, engine alone: {result['completed']} requests in "
        f"{result['duration_s']:.2f}s, {result['output_tok_s']:.0f} output tok/s; HTTP "
        f"{http:.0f} output tok/s (HTTP / Engine {result['http_over_engine']:.3f})"
    )
    if output:
        with open(output, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
