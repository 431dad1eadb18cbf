"""The engine process alone, zero-cost runner, over its real zmq transport: no HTTP.

`resin serve`'s engine process (`resin.ipc.EngineService`, the zero-cost runner of `resin serve
--fake-runner` at its batch of 512) is started as a child; this process is its one frontend,
an `EngineClient` that keeps `--streams` requests of `--prompt-tokens` random tokens in flight,
each generating exactly `--output-tokens` (`ignore_eos`), until `--requests` have finished.
It reports the output tokens/s the engine process carries, its steps, the tokens a step
averages and the engine process's CPU per step and per token, split into `Engine.step()`
itself and the rest of its turn (admission, routing each event to its frontend, packing and
sending the step's message): the ceiling the engine process puts on `resin serve
--fake-runner` whatever the frontends and clients cost. Prints a line and appends JSONL:

    resin bench engine-process --streams 1024 --output bench/engine_process.jsonl
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

VOCAB = 32000
TOKEN = 64


def _engine(address: str, pipe: Connection, max_sequences: int, max_active: int) -> None:
    """The child: the engine process of `resin serve --fake-runner` (one frontend)."""
    import signal

    from resin import Engine
    from resin.ipc import EngineService, ServicePolicy
    from resin_app.loading import ZeroCostRunner
    from resin_app.startup import settle_heap

    engine = Engine(ZeroCostRunner(VOCAB, TOKEN), context_length=4096, max_sequences=max_sequences)
    service = EngineService(engine, [address], ServicePolicy(max_active=max_active))
    step, clock = engine.step, {"steps": 0, "step_s": 0.0}

    def timed() -> Any:
        start = time.thread_time()
        events = step()
        clock["step_s"] += time.thread_time() - start
        clock["steps"] += 1
        return events

    engine.step = timed  # type: ignore[method-assign]  # its CPU time, beside the turn's
    signal.signal(signal.SIGTERM, lambda *_: service.request_stop())
    settle_heap()
    pipe.send("ready")
    start = time.process_time()
    try:
        service.run()
    finally:
        service.close()
    pipe.send({**clock, "cpu_s": time.process_time() - start})


def _drive(address: str, args: argparse.Namespace) -> tuple[int, float]:
    """Keep `args.streams` requests in flight until `args.requests` finished: (tokens, s)."""
    from resin import FinishedEvent, SamplingParams, TokensEvent
    from resin.ipc import EngineClient

    client = EngineClient(address, 0)
    params = SamplingParams(max_output_tokens=args.output_tokens, ignore_stop_tokens=True)
    rng = random.Random(args.seed)
    sent = done = tokens = 0
    start = time.perf_counter()
    while done < args.requests:
        while sent - done < args.streams and sent < args.requests:
            client.submit([rng.randrange(100, VOCAB) for _ in range(args.prompt_tokens)], params)
            sent += 1
        for event in client.step():
            if isinstance(event, TokensEvent):
                tokens += len(event.token_ids)
            elif isinstance(event, FinishedEvent):
                done += 1
    seconds = time.perf_counter() - start
    client.close()
    return tokens, seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="resin-bench-")
    address = f"ipc://{folder}/engine"
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(
        target=_engine, args=(address, theirs, args.max_sequences, args.max_active)
    )
    child.start()
    try:
        if ours.recv() != "ready":
            raise RuntimeError("the engine process did not start")
        tokens, seconds = _drive(address, args)
        child.terminate()  # SIGTERM: the service stops and reports its clock
        clock = ours.recv() if ours.poll(60) else {"steps": 0, "step_s": 0.0, "cpu_s": 0.0}
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    steps = max(1, int(clock["steps"]))
    return {
        "bench": "engine-process",
        "streams": args.streams,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "requests": args.requests,
        "max_sequences": args.max_sequences,
        "tokens": tokens,
        "output_tok_s": tokens / seconds,
        "seconds": seconds,
        "steps": int(clock["steps"]),
        "tokens_per_step": tokens / steps,
        "engine_cpu_ms_per_step": 1e3 * clock["cpu_s"] / steps,
        "step_cpu_ms_per_step": 1e3 * clock["step_s"] / steps,
        "engine_cpu_us_per_token": 1e6 * clock["cpu_s"] / max(1, tokens),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from resin.frontend.engine_loop import DEFAULT_MAX_ACTIVE
    from resin_app.loading import ZERO_COST_MAX_SEQUENCES

    p = argparse.ArgumentParser(prog="resin bench engine-process", description=__doc__)
    p.add_argument("--streams", type=int, default=1024, help="requests in flight")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=None, help="in all (default 4 x streams)")
    p.add_argument("--max-sequences", type=int, default=ZERO_COST_MAX_SEQUENCES)
    p.add_argument("--max-active", type=int, default=DEFAULT_MAX_ACTIVE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None, help="append the result as JSONL")
    args = p.parse_args(argv)
    if args.requests is None:
        args.requests = 4 * args.streams
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    row = run(args)
    print(
        f"engine process, {row['streams']} streams: {row['output_tok_s']:,.0f} output tok/s, "
        f"{row['tokens_per_step']:.0f} tokens a step, engine CPU "
        f"{row['engine_cpu_ms_per_step']:.2f} ms a step (Engine.step "
        f"{row['step_cpu_ms_per_step']:.2f}), {row['engine_cpu_us_per_token']:.2f} us a token"
    )
    if args.output is not None:  # (not `report.write_jsonl`: its module imports torch)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a") as f:
            f.write(json.dumps(row) + "\n")
    else:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
