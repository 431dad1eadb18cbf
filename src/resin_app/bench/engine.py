"""Engine CPU time per step with a zero-cost runner (`make bench`), and overlap on/off.

For each running-sequence count (default 1, 64, 256, 1024) at a 2k-token context it measures:
- decode: median engine time of one decode step with every sequence running;
- prefill: engine time of one prefill step that computes a 2k-token prompt chunk per sequence;
each with prefix caching off and on (on: unique prompts, so a 0% hit rate: the overhead).
With `--drafts K` every decode step is a speculative verify step instead: the n-gram proposer
(padded to K drafts, `resin_app.bench.speculative.PaddedProposer`) proposes, the zero-cost runner
accepts every draft, and the engine commits K + 1 tokens per sequence and step.
"Engine time" is the wall time of `Engine.step()` minus nothing: the runner returns a
preallocated answer, so the step is all engine work (scheduling, planning, validation, commit,
events). The thread CPU time is reported beside it. Prints a table and writes JSONL.

    resin bench engine --output bench/engine.jsonl

`--overlap` compares end-to-end decode through the Engine with overlap off and on against the
runner's own figure (the same decode plans replayed on the runner alone, back to back), per
batch size at a `--context`-token context: tok/s, ms/step, the engine's host CPU ms per step
and on/own - 1. `--runner sim` (default) is an overlapping runner whose "device" is a thread
that spends `--device-ms` per step (one value per batch size; defaults: the H200 Llama-3.1-8B
runner figures); `--runner torch` is the reference runner on a random `--model-config` preset;
`--runner cuda` is `CudaRunner` on random weights of the preset (the H200 acceptance):

    resin bench engine --overlap --runner cuda \
        --model-config llama-8b --sequences 1 64 256 --context 1024 --output bench/overlap.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from resin_app.bench.speculative import PaddedProposer

H200_LLAMA_8B_MS = {1: 4.84, 64: 7.25, 256: 16.2}
"""The CudaRunner's own decode step times (docs/benchmarks.md) for `--runner sim`."""


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


class SimulatedDevice:
    """An overlapping `AsyncRunner` with a modelled device stream: a plan starts when it is
    submitted or when the one before it ends, and runs `device_ms`; `collect` sleeps until
    the oldest plan ends (no thread: nothing competes with the engine for the GIL).
    Token 1 for every sampling row."""

    def __init__(self, num_pages: int, device_ms: float, page_size: int = 16) -> None:
        self.runner_config = RunnerConfig(
            vocab_size=32000, page_size=page_size, num_pages=num_pages, overlap=True
        )
        self.device_s = device_ms / 1e3
        self._answer = ZeroCostRunner(num_pages, page_size)
        self._queue: deque[tuple[float, ForwardOutput]] = deque()
        self._free_at = 0.0

    def submit(self, plan: BatchPlan) -> None:
        self._free_at = max(time.perf_counter(), self._free_at) + self.device_s
        self._queue.append((self._free_at, self._answer.forward(plan)))

    def collect(self) -> ForwardOutput:
        ends, out = self._queue.popleft()
        wait = ends - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return out

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        self.submit(plan)
        return self.collect()


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


# -- overlap on/off ---------------------------------------------------------------------------
RunnerFactory = Callable[[int, int], Any]
"""(batch, num_pages) -> a fresh runner (each Engine binds its own)."""


def _runner_factory(args: argparse.Namespace) -> tuple[RunnerFactory, str]:
    if args.runner == "sim":
        ms = dict(zip(args.sequences, args.device_ms, strict=False)) if args.device_ms else {}

        def sim(b: int, pages: int) -> SimulatedDevice:
            return SimulatedDevice(pages, ms.get(b, H200_LLAMA_8B_MS.get(b, 5.0)))

        return sim, "simulated device"
    import torch

    if args.runner == "torch":
        from resin_model.presets import preset
        from resin_models_torch.registry import random_runner

        def ref(b: int, pages: int) -> Any:
            return random_runner(preset(args.model_config), num_pages=pages, device=args.device)

        return ref, f"reference runner, {args.model_config} on {args.device}"
    from resin_model.presets import preset
    from resin_models_cuda.runner import RunnerOptions
    from resin_models_cuda.runner import random_runner as random_cuda_runner

    def cuda(b: int, pages: int) -> Any:
        torch.cuda.empty_cache()
        options = RunnerOptions(
            max_batch=b, max_context=args.context + args.decode_steps + 16, num_pages=pages
        )
        return random_cuda_runner(preset(args.model_config), options, args.device, torch.bfloat16)

    return cuda, f"CudaRunner, {args.model_config} bf16 random weights"


def e2e(make: RunnerFactory, b: int, context: int, steps: int, overlap: bool) -> dict[str, Any]:
    """Decode `steps` steps of `b` sequences at `context` tokens through the Engine."""
    pages = b * ((context + steps + 8) // 16 + 2) + 64
    runner = make(b, pages)
    vocab = runner.runner_config.vocab_size or 32000
    recorder = None if overlap else Recorder(runner)
    engine = Engine(
        recorder or runner,
        context_length=context + steps + 16,
        max_sequences=b,
        max_batch_tokens=max(b, 8192),
        prefill_chunk_tokens=8192,
        overlap=overlap,
    )
    params = SamplingParams(max_output_tokens=steps + 8, ignore_stop_tokens=True, temperature=0.0)
    rng = np.random.default_rng(0)
    for _ in range(b):
        engine.submit(rng.integers(0, vocab, size=context - 1).tolist(), params)
    while len(engine._scheduler.running) < b:  # prefill (not timed)
        engine.step()
    for _ in range(4):  # warm-up (graphs, allocator), and the pipeline full
        engine.step()
    if recorder is not None:
        recorder.plans = []
    gc.collect()
    gc.disable()
    try:
        w, c = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            engine.step()
        wall, cpu = time.perf_counter() - w, time.thread_time() - c
    finally:
        gc.enable()
    own = None
    if recorder is not None:
        assert recorder.plans is not None
        own = _replay(runner.forward, recorder.plans)
    engine.close()
    return {"wall_ms": wall / steps * 1e3, "cpu_ms": cpu / steps * 1e3, "own_ms": own}


class Recorder:
    """A synchronous view of a runner that keeps the plans it runs (`plans`, None: off)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.runner_config = runner.runner_config
        self.plans: list[BatchPlan] | None = None
        if hasattr(runner, "bind"):
            self.bind = runner.bind
        if hasattr(runner, "close"):
            self.close = runner.close

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self.plans is not None:
            self.plans.append(plan)
        out: ForwardOutput = self.runner.forward(plan)
        return out


def _replay(forward: Callable[[BatchPlan], ForwardOutput], plans: list[BatchPlan]) -> float:
    """The runner's own ms/step: the same plans back to back, no engine in between."""
    w = time.perf_counter()
    for plan in plans:
        out = forward(plan)
    np.asarray(out.token_ids)  # results on the host, as the engine would read them
    return (time.perf_counter() - w) / len(plans) * 1e3


def overlap_main(args: argparse.Namespace) -> int:
    make, what = _runner_factory(args)
    print(f"{what}, context {args.context}, {args.decode_steps} decode steps per point")
    header = ("seqs", "own ms", "off ms", "on ms", "host off", "host on", "off tok/s", "on tok/s")
    print("{:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7}".format(*header, "on/own"))
    rows = []
    for b in args.sequences:
        off = e2e(make, b, args.context, args.decode_steps, overlap=False)
        on = e2e(make, b, args.context, args.decode_steps, overlap=True)
        own = off["own_ms"]
        row = {
            "bench": "engine_overlap",
            "runner": args.runner,
            "model": args.model_config if args.runner != "sim" else None,
            "sequences": b,
            "context": args.context,
            "own_ms": own,
            "off_ms": off["wall_ms"],
            "on_ms": on["wall_ms"],
            "host_cpu_ms_off": off["cpu_ms"],
            "host_cpu_ms_on": on["cpu_ms"],
            "off_tok_s": b / off["wall_ms"] * 1e3,
            "on_tok_s": b / on["wall_ms"] * 1e3,
            "own_tok_s": b / own * 1e3,
            "on_vs_own": on["wall_ms"] / own - 1,
        }
        rows.append(row)
        print(
            f"{b:>5} {own:>8.3f} {off['wall_ms']:>8.3f} {on['wall_ms']:>8.3f} "
            f"{off['cpu_ms']:>8.3f} {on['cpu_ms']:>8.3f} "
            f"{row['off_tok_s']:>10.0f} {row['on_tok_s']:>10.0f} "
            f"{row['on_vs_own']:>+7.1%}"
        )
    _write(args.output, rows)
    return 0


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps({"time": time.time(), **r}) + "\n")
    print(f"wrote {len(rows)} rows to {path}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resin bench engine", description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=None)
    parser.add_argument("--context", type=int, default=None)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best-of repeats per cell")
    parser.add_argument("--drafts", type=int, default=0, help="speculative: K drafts per step")
    parser.add_argument("--output", type=Path, default=Path("bench/engine.jsonl"))
    over = parser.add_argument_group("overlap on/off (--overlap)")
    over.add_argument("--overlap", action="store_true", help="compare overlap on/off end to end")
    over.add_argument("--runner", choices=["sim", "torch", "cuda"], default="sim")
    over.add_argument("--device-ms", type=float, nargs="+", default=None,
                      help="sim: device ms per step, one per --sequences value")  # fmt: skip
    over.add_argument("--model-config", default="llama-8b", help="torch/cuda: a preset")
    over.add_argument("--device", default="cuda", help="torch/cuda: the device")
    args = parser.parse_args(argv)
    if args.overlap:
        args.sequences = args.sequences or [1, 64, 256]
        args.context = args.context or 1024
        return overlap_main(args)
    args.sequences = args.sequences or [1, 64, 256, 1024]
    args.context = args.context or 2048
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
        per_seq = float(r["decode_ms_median"]) * 1e3 / int(r["sequences"])  # type: ignore[arg-type,call-overload]
        print(
            f"{r['sequences']:>6} {'on' if r['prefix_cache'] else 'off':>6} "
            f"{r['decode_ms_median']:>10.3f} {r['decode_cpu_ms_median']:>10.3f} {per_seq:>8.2f} "
            f"{r['prefill_ms']:>11.2f}"
        )
    _write(args.output, [{"bench": "engine", **r} for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
