"""On the GPU: the Engine end to end vs the runner's own decode, overlap, verify cost.

    resin bench overlap --model-config llama-8b --batch-sizes 1,64,256 \
        --output docs/bench/gpu/overlap_llama8b.jsonl

Per batch size (rows decoding from `--context` tokens, random bf16 weights):
- `runner_sync`: the runner's own figure as before (one synchronous `forward` per step, the
  benchmark planner's plans, random KV);
- `runner_overlap`: the same plans through `submit`/`collect` with step n+1 submitted before
  step n is collected, its inputs named by `prev_token_rows`;
- `gpu_only`: back-to-back replays of the bucket's decode graph (no host work at all);
- `engine`: the Engine end to end (B requests of `--context` random prompt tokens,
  `--output-tokens` greedy tokens each): decode tokens / wall time from the step where every
  request has its first token to the end (host work of the engine included).
- `verify`: at batch 1, a step whose row carries k drafts vs a plain decode step (medians).
Prints a table and appends JSONL.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from resin import Engine, SamplingParams
from resin.events import TokensEvent
from resin.plan import BatchPlan, Phase
from resin.protocols import CacheLayout
from resin_app.bench.plans import PagedPlanner
from resin_app.bench.report import write_jsonl
from resin_app.bench.runner_bench import RunnerBench, measure_ceilings
from resin_model.presets import preset
from resin_models_cuda import CudaRunner, RunnerOptions, random_runner


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Probe:
    """Runner-level figures on the runner's own arena (the benchmark planner)."""

    def __init__(self, runner, num_pages: int, page_size: int) -> None:  # type: ignore[no-untyped-def]
        self.runner = runner
        self.planner = PagedPlanner(num_pages, page_size, len(runner.model.group_kinds))
        self.bench = RunnerBench(runner, self.planner, "m", measure_ceilings(runner.device))
        self.rng = np.random.default_rng(0)

    def _seqs(self, batch: int, context: int, steps: int) -> list:  # type: ignore[type-arg]
        vocab = self.runner.config.vocab_size
        seqs = []
        for _ in range(batch):
            seq = self.planner.new_sequence(self.rng.integers(0, vocab, context + steps).tolist())
            seq.cached = context - 1
            seqs.append(seq)
        return seqs

    def _plans(self, batch: int, context: int, steps: int) -> tuple[list, list[BatchPlan]]:  # type: ignore[type-arg]
        seqs = self._seqs(batch, context, steps)
        return seqs, list(self.bench.decode_plans(seqs, steps))

    def _free(self, seqs: list) -> None:  # type: ignore[type-arg]
        for s in seqs:
            self.planner.free(s)

    def sync(self, batch: int, context: int, steps: int) -> float:
        seqs, plans = self._plans(batch, context, steps)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for p in plans:
            self.runner.forward(p)
        ms = (time.perf_counter() - t) / steps * 1e3
        self._free(seqs)
        return ms

    def overlap(self, batch: int, context: int, steps: int) -> tuple[float, float]:
        """ms per step, and the host ms per step spent in submit()."""
        seqs, plans = self._plans(batch, context, steps)
        prev = np.arange(batch, dtype=np.int32)
        ids = np.full(batch, -1, dtype=np.int32)
        plans = [plans[0]] + [
            dataclasses.replace(p, input_ids=ids, prev_token_rows=prev) for p in plans[1:]
        ]
        torch.cuda.synchronize()
        submit = 0.0
        t = time.perf_counter()
        for i, p in enumerate(plans):
            s = time.perf_counter()
            self.runner.submit(p)
            submit += time.perf_counter() - s
            if i:
                self.runner.collect()
        self.runner.collect()
        ms = (time.perf_counter() - t) / steps * 1e3
        self._free(seqs)
        return ms, submit / steps * 1e3

    def gpu_only(self, batch: int, context: int, steps: int) -> float:
        seqs, plans = self._plans(batch, context, 1)
        self.runner.forward(plans[0])
        graph = self.runner._graphs[self.runner._pick_graph(batch, 1)].graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        graph.replay()
        start.record()
        for _ in range(steps):
            graph.replay()
        end.record()
        end.synchronize()
        self._free(seqs)
        return float(start.elapsed_time(end) / steps)

    def verify(self, k: int, context: int, iters: int) -> tuple[float, float]:
        """(plain decode ms, verify-with-k-drafts ms) at batch 1, synchronous steps."""
        seqs = self._seqs(1, context, 2 * (k + 1) * (iters + 3))
        vocab = self.runner.config.vocab_size
        plain: list[float] = []
        spec: list[float] = []
        for _ in range(iters + 3):
            for want, out in ((1, plain), (1 + k, spec)):
                rows = [(seqs[0], want)]
                plan = self.planner.plan(rows, Phase.DECODE)
                if want > 1:
                    drafts = self.rng.integers(0, vocab, k).astype(np.int32)
                    ids = plan.input_ids.copy()
                    ids[1:] = drafts
                    plan = dataclasses.replace(
                        plan,
                        input_ids=ids,
                        draft_indptr=np.array([0, k], dtype=np.int32),
                        draft_ids=drafts,
                    )
                torch.cuda.synchronize()
                t = time.perf_counter()
                self.runner.forward(plan)
                out.append((time.perf_counter() - t) * 1e3)
                self.planner.commit(rows)
        self._free(seqs)
        return statistics.median(plain[3:]), statistics.median(spec[3:])


class StepClock:
    """Wraps a runner's submit/collect: CUDA events around each submitted step give its GPU
    time and the GPU idle gap before it; host clocks give the time blocked in collect."""

    def __init__(self, runner) -> None:  # type: ignore[no-untyped-def]
        self.runner = runner
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.plans: list[BatchPlan] = []  # the decode plans, for `replay`
        self.blocked = 0.0
        self.on = False
        submit, collect = runner.submit, runner.collect

        def timed_submit(plan):  # type: ignore[no-untyped-def]
            if not self.on:
                return submit(plan)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            a.record()
            submit(plan)
            b.record()
            self.events.append((a, b))
            self.plans.append(plan)

        def timed_collect():  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            out = collect()
            self.blocked += time.perf_counter() - t
            return out

        runner.submit, runner.collect = timed_submit, timed_collect

    def summary(self, steps: int) -> dict:  # type: ignore[type-arg]
        torch.cuda.synchronize()
        busy = [a.elapsed_time(b) for a, b in self.events]
        gaps = [p[1].elapsed_time(n[0]) for p, n in itertools.pairwise(self.events)]
        return {"gpu_ms": statistics.median(busy) if busy else 0.0,
                "gap_ms": sum(max(g, 0.0) for g in gaps) / max(len(gaps), 1),
                "blocked_ms": self.blocked / max(steps, 1) * 1e3}  # fmt: skip


def engine_decode(runner, batch: int, context: int, output: int, max_ctx: int,  # type: ignore[no-untyped-def]
                  settle_s: float = 0.0) -> tuple[dict, list[BatchPlan], CacheLayout]:  # type: ignore[type-arg]  # fmt: skip
    rng = np.random.default_rng(batch)
    vocab = runner.config.vocab_size
    params = SamplingParams(max_output_tokens=output, temperature=0.0, ignore_stop_tokens=True)
    clock = StepClock(runner)
    engine = Engine(runner, context_length=max_ctx, max_sequences=max(batch, 1),
                    max_batch_tokens=16384, prefill_chunk_tokens=8192,
                    enable_metrics=False)  # fmt: skip
    requests = [
        engine.submit(rng.integers(0, vocab, context).tolist(), params) for _ in range(batch)
    ]
    started: set[int] = set()
    t0 = None
    tokens = steps = 0
    while engine.has_work():
        events = engine.step()
        n = sum(len(e.token_ids) for e in events if isinstance(e, TokensEvent))
        if t0 is not None:
            tokens += n
            steps += 1
        started.update(e.request_id for e in events if isinstance(e, TokensEvent))
        if t0 is None and len(started) == batch:
            torch.cuda.synchronize()
            time.sleep(settle_s)  # let the card cool down from the prefill before timing
            clock.on, clock.blocked = True, 0.0
            t0 = time.perf_counter()
    wall = time.perf_counter() - (t0 or time.perf_counter())
    for r in requests:
        r.take_result()
    engine.close()
    rows = sum(p.num_sequences for p in clock.plans)
    return {"tok_s": tokens / wall, "rows_tok_s": rows / wall, "ms": wall / max(steps, 1) * 1e3,
            "tokens": tokens, "plans": len(clock.plans), "steps": steps,
            **clock.summary(steps)}, clock.plans, engine.layout  # fmt: skip


def replay(runner, plans: list[BatchPlan], overlap: bool) -> dict:  # type: ignore[no-untyped-def, type-arg]
    """The engine's own decode plans through the runner alone: synchronous `forward` steps,
    or submit n+1 / collect n as the engine did. tok/s counts the rows of the plans."""
    runner.forward(plans[0])  # the first decode plan names no previous tokens
    plans = plans[1:]
    torch.cuda.synchronize()
    t = time.perf_counter()
    if overlap:
        for i, plan in enumerate(plans):
            runner.submit(plan)
            if i:
                runner.collect()
        runner.collect()
    else:
        for plan in plans:
            runner.forward(plan)
    wall = time.perf_counter() - t
    rows = sum(p.num_sequences for p in plans)
    return {"tok_s": rows / wall, "ms": wall / len(plans) * 1e3, "plans": len(plans)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resin bench overlap")
    p.add_argument("--model-config", default="llama-8b")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 64, 256])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=256, help="runner figures: decode steps")
    p.add_argument("--draft-k", type=_ints, default=[4])
    p.add_argument("--skip", default="", help="comma list of parts to skip: engine,runner,verify")
    p.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="engine runs: idle seconds between the prefill and the timed decode",
    )
    p.add_argument(
        "--ab-fuse-append",
        type=int,
        default=0,
        help="engine runs: N rounds alternating the KV append fused into rope and not",
    )
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    skip = set(args.skip.split(","))
    config = preset(args.model_config)
    max_ctx = args.context + args.output_tokens + 64
    options = RunnerOptions(max_batch=max(args.batch_sizes), max_context=max_ctx)
    runner = random_runner(config, options)
    records = []
    cfg = runner.runner_config
    assert cfg.cache_bytes is not None  # CudaRunner sizes its arena from free memory
    pages = cfg.cache_bytes // cfg.page_bytes

    def emit(rec: dict) -> None:  # type: ignore[type-arg]
        rec = {"model": args.model_config, "context": args.context, **rec}
        records.append(rec)
        print(json.dumps(rec), flush=True)

    if not {"runner", "verify"} <= skip:
        runner.bind(CacheLayout(pages, cfg.page_size, cfg.page_bytes, cfg.cache_groups))
        probe = Probe(runner, pages, cfg.page_size)
        if "runner" not in skip:
            for b in args.batch_sizes:
                probe.sync(b, args.context, 8)  # warm-up
                sync = probe.sync(b, args.context, args.steps)
                ov, host = probe.overlap(b, args.context, args.steps)
                gpu = probe.gpu_only(b, args.context, args.steps)
                for kind, ms in (("runner_sync", sync), ("runner_overlap", ov), ("gpu_only", gpu)):
                    emit({"kind": kind, "batch": b, "ms": ms, "tok_s": b / ms * 1e3})
                emit({"kind": "submit_host", "batch": b, "ms": host})
        if "verify" not in skip:
            for k in args.draft_k:
                plain, spec = probe.verify(k, args.context, 20)
                emit({"kind": "verify", "batch": 1, "k": k, "plain_ms": plain, "verify_ms": spec,
                      "ratio": spec / plain})  # fmt: skip
        runner.close()
        del probe
    settings: list[bool | None] = [True, False] * args.ab_fuse_append or [None]
    if "engine" not in skip:
        for b, fuse in itertools.product(args.batch_sizes, settings):
            if fuse is not None:  # the next CudaRunner captures its graphs with this setting
                for layer in runner.model.layers:  # type: ignore[attr-defined]
                    layer.attn.fuse_append = fuse
            torch.cuda.empty_cache()
            fresh = CudaRunner(runner.model, options)  # same weights, a new arena
            r, plans, layout = engine_decode(
                fresh, b, args.context, args.output_tokens, max_ctx, args.settle_s
            )
            emit({"kind": "engine", "batch": b, "settle_s": args.settle_s, "fuse_append": fuse,
                  **r})  # fmt: skip
            fresh.close()
            again = CudaRunner(runner.model, options)  # the same plans, the runner alone
            again.bind(layout)
            assert again.kv is not None
            again.kv.normal_()  # not zeros: the engine's cache holds real values (power, clocks)
            for overlap in (False, True):
                rec = replay(again, plans, overlap)
                kind = "runner_replay_overlap" if overlap else "runner_replay_sync"
                emit({"kind": kind, "batch": b, "fuse_append": fuse, **rec})
            again.close()
    if args.output:
        write_jsonl(args.output, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
