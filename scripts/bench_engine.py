"""Engine CPU time per step with a zero-cost runner (`make bench`).

For each running-sequence count (default 1, 64, 256, 1024) at a 2k-token context it measures:
- decode: median engine time of one decode step with every sequence running;
- prefill: engine time of one prefill step that computes a 2k-token prompt chunk per sequence;
each with prefix caching off and on (on: unique prompts, so a 0% hit rate: the overhead).
With `--drafts K` every decode step is a speculative verify step instead: the n-gram proposer
(padded to K drafts, `resin.tools.bench_spec.PaddedProposer`) proposes, the zero-cost runner
accepts every draft, and the engine commits K + 1 tokens per sequence and step.
"Engine time" is the wall time of `Engine.step()` minus nothing: the runner returns a
preallocated answer, so the step is all engine work (scheduling, planning, validation, commit,
events). The thread CPU time is reported beside it. Prints a table and writes JSONL.

    PYTHONPATH=src python scripts/bench_engine.py --output bench/engine.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from resin import (
    BatchPlan,
    Engine,
    ForwardOutput,
    NgramProposer,
    RunnerConfig,
    SamplingParams,
    Speculation,
)
from resin.tools.bench_spec import PaddedProposer


class ZeroCostRunner:
    """Answers token 1 for every sampling row from preallocated arrays."""

    def __init__(self, num_pages: int, page_size: int = 16, drafts: int = 0) -> None:
        self.runner_config = RunnerConfig(
            vocab_size=32000, page_size=page_size, num_pages=num_pages, max_draft_tokens=drafts
        )
        self._ones = np.ones(1 << 16, dtype=np.uint32)
        self._indptr = np.arange((1 << 16) + 1, dtype=np.uint32)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if plan.draft_ids.size:  # accept every draft, then token 1
            counts = np.diff(plan.draft_indptr) + 1
            indptr = np.zeros(counts.size + 1, dtype=np.uint32)
            np.cumsum(counts, out=indptr[1:])
            ids = self._ones[: int(indptr[-1])].copy()
            last = indptr[1:] - 1
            mask = np.ones(ids.size, dtype=bool)
            mask[last] = False
            ids[mask] = plan.draft_ids
            return ForwardOutput(ids, indptr)
        rows = plan.sample_rows
        if rows.all():
            b = rows.size
            return ForwardOutput(self._ones[:b], self._indptr[: b + 1])
        indptr = np.zeros(rows.size + 1, dtype=np.uint32)
        np.cumsum(rows, out=indptr[1:])
        return ForwardOutput(self._ones[: int(indptr[-1])], indptr)


def _engine(n: int, context: int, prefix: bool, decode_steps: int, drafts: int = 0) -> Engine:
    tokens = decode_steps * (drafts + 1)
    pages = n * ((context + tokens) // 16 + 2) + 64
    spec = Speculation(PaddedProposer(NgramProposer()), drafts) if drafts else None
    return Engine(
        ZeroCostRunner(pages, drafts=drafts),
        speculation=spec,
        context_length=context + tokens + 8,
        max_sequences=n,
        max_batch_tokens=n * context,
        prefill_chunk_tokens=context,
        prefix_cache=prefix,
    )


def _submit(engine: Engine, n: int, context: int, rng: np.random.Generator) -> None:
    params = SamplingParams(max_output_tokens=10_000, ignore_stop_tokens=True, temperature=0.0)
    for _ in range(n):
        engine.submit(rng.integers(0, 32000, size=context).tolist(), params)


def _timed_step(engine: Engine) -> tuple[float, float]:
    w, c = time.perf_counter(), time.thread_time()
    engine.step()
    return time.perf_counter() - w, time.thread_time() - c


def bench(
    n: int, context: int, prefix: bool, decode_steps: int, seed: int, drafts: int = 0
) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    engine = _engine(n, context, prefix, decode_steps, drafts)
    _submit(engine, n, context - 1, rng)
    gc.collect()
    gc.disable()
    try:
        prefill_wall, prefill_cpu = _timed_step(engine)  # one step prefills every prompt
        assert engine._scheduler.prefilling == [] and len(engine._scheduler.running) == n
        walls, cpus = [], []
        for _ in range(decode_steps):
            w, c = _timed_step(engine)
            walls.append(w)
            cpus.append(c)
    finally:
        gc.enable()
    return {
        "sequences": n,
        "drafts": drafts,
        "context": context,
        "prefix_cache": prefix,
        "decode_ms_median": statistics.median(walls) * 1e3,
        "decode_cpu_ms_median": statistics.median(cpus) * 1e3,
        "decode_ms_p90": sorted(walls)[int(0.9 * len(walls))] * 1e3,
        "prefill_ms": prefill_wall * 1e3,
        "prefill_cpu_ms": prefill_cpu * 1e3,
        "prefill_tokens": n * (context - 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats per cell")
    parser.add_argument("--drafts", type=int, default=0, help="speculative: K drafts per step")
    parser.add_argument("--output", type=Path, default=Path("bench/engine.jsonl"))
    args = parser.parse_args(argv)
    rows = []
    for n in args.sequences:
        # Off and on alternate within each repeat, so drift on a shared machine hits both.
        runs: dict[bool, list[dict[str, object]]] = {False: [], True: []}
        for seed in range(args.repeats):
            for prefix in (False, True):
                runs[prefix].append(
                    bench(n, args.context, prefix, args.decode_steps, seed, args.drafts)
                )
        for prefix in (False, True):
            best = min(runs[prefix], key=lambda r: float(r["decode_ms_median"]))  # type: ignore[arg-type]
            best["prefill_ms"] = min(float(r["prefill_ms"]) for r in runs[prefix])  # type: ignore[arg-type]
            rows.append(best)
    header = ("seqs", "prefix", "decode ms", "dec cpu ms", "us/seq", "prefill ms")
    print("{:>6} {:>6} {:>10} {:>10} {:>8} {:>11}".format(*header))
    for r in rows:
        per_seq = float(r["decode_ms_median"]) * 1e3 / int(r["sequences"])  # type: ignore[arg-type]
        print(
            f"{r['sequences']:>6} {'on' if r['prefix_cache'] else 'off':>6} "
            f"{r['decode_ms_median']:>10.3f} {r['decode_cpu_ms_median']:>10.3f} {per_seq:>8.2f} "
            f"{r['prefill_ms']:>11.2f}"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a") as f:
        for r in rows:
            f.write(json.dumps({"bench": "engine", "time": time.time(), **r}) + "\n")
    print(f"wrote {len(rows)} rows to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
