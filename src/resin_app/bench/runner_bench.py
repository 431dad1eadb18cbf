"""Benchmark workloads: prefill and decode sweeps of a `CudaRunner`. Each measurement is a
`BenchRecord` (one JSONL line).

Method (see docs/benchmarks.md): load, compilation and CUDA-graph capture happen before any
timed step; each point runs `warmup` steps, then `iters` timed steps, each ended by the
runner's own device-to-host read of the sampled tokens (so each is synchronized), and reports
the median. Decode points start from contexts whose KV is random (not computed): the arena is
filled with normal values, since the card runs faster on zeros (a batch-256 Llama-8B decode
step 3% faster on a zero cache, H200). Bandwidth counts the bytes a step must read (weights
once + every row's KV); MFU counts 2 FLOPs per active parameter and token, plus attention.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from resin.plan import BatchPlan, Phase
from resin_app.bench.kernel_census import CensusResult, run_census
from resin_app.bench.plans import PagedPlanner, Sequence
from resin_model.config import ModelConfig
from resin_model.presets import kv_bytes_read, param_counts, weight_bytes_read
from resin_models_cuda.runner import CudaRunner


@dataclass(frozen=True, slots=True)
class Ceilings:
    """What the card can do, measured in the same run (bytes/s read+write, FLOP/s bf16)."""

    bandwidth: float
    flops: float


@dataclass(frozen=True, slots=True)
class BenchRecord:
    kind: str  # "prefill" | "decode"
    backend: str  # "resin" | "hf"
    model: str
    context: int
    batch: int
    median_ms: float
    tok_s: float
    per_user_tok_s: float
    bandwidth_tb_s: float
    bandwidth_frac: float
    mfu: float
    iters: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure_ceilings(device: torch.device) -> Ceilings:
    """Device-to-device copy bandwidth and a large bf16 matmul, medians of a few runs."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    a = torch.randn((8192, 8192), device=device, dtype=torch.bfloat16)

    def timed(fn: Callable[[], object], n: int) -> float:
        times = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    def copy() -> object:
        return dst.copy_(src)

    def matmul() -> object:
        return a @ a

    timed(copy, 2)
    bw = 2 * src.numel() / timed(copy, 5)
    timed(matmul, 2)
    flops = 2 * 8192**3 / timed(matmul, 10)
    return Ceilings(bw, flops)


def _flops(config: ModelConfig, tokens: int, context: int, causal: bool) -> float:
    active, _ = param_counts(config)
    layers = sum(kind != "linear" for kind in config.layer_types)  # linear: O(1) a token
    attn = 4 * layers * config.num_heads * config.head_dim * tokens * context
    return 2 * active * tokens + (attn / 2 if causal else attn)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_time(run: Callable[[], object], warmup: int, iters: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        _sync()
        t = time.perf_counter()
        run()
        _sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _record(
    kind: str, backend: str, model: str, config: ModelConfig, context: int, batch: int,
    seconds: float, iters: int, ceilings: Ceilings, rows: int,
    extra: dict[str, Any] | None = None,
) -> BenchRecord:  # fmt: skip
    tokens = context * batch if kind == "prefill" else batch
    # Weights a step must read (the embedding table is only gathered from; an MoE reads the
    # experts its tokens route to), plus every row's KV (a sliding layer: its window only).
    read = weight_bytes_read(config, tokens) + rows * kv_bytes_read(config, context)
    flops = _flops(config, tokens, context, kind == "prefill")
    bw = read / seconds
    return BenchRecord(
        kind, backend, model, context, batch, seconds * 1e3, tokens / seconds,
        (1 / seconds) if kind == "decode" else tokens / seconds, bw / 1e12,
        bw / ceilings.bandwidth, flops / seconds / ceilings.flops, iters, extra or {},
    )  # fmt: skip


class RunnerBench:
    """Sweeps over one bound runner. `planner` owns the runner's whole arena."""

    def __init__(
        self, runner: CudaRunner, planner: PagedPlanner, model: str, ceilings: Ceilings
    ) -> None:
        self.runner, self.planner, self.model, self.ceilings = runner, planner, model, ceilings
        self.weight_bytes = runner.model.nbytes()
        self._rng = np.random.default_rng(0)
        if runner.kv is not None:  # random KV, not the arena's zeros (zeros run faster)
            runner.kv.normal_()

    def _tokens(self, n: int) -> list[int]:
        return [int(t) for t in self._rng.integers(0, self.runner.config.vocab_size, size=n)]

    def prefill(self, context: int, warmup: int, iters: int) -> BenchRecord:
        seq = self.planner.new_sequence(self._tokens(context))
        plan = self.planner.plan([(seq, context)], Phase.PREFILL)
        seconds = _median_time(lambda: self.runner.forward(plan), warmup, iters)
        self.planner.free(seq)
        return _record("prefill", "resin", self.model, self.runner.config, context, 1, seconds,
                       iters, self.ceilings, 1)  # fmt: skip

    def decode_plans(self, seqs: list[Sequence], steps: int) -> Iterator[BatchPlan]:
        for _ in range(steps):
            rows = [(s, 1) for s in seqs]
            yield self.planner.plan(rows, Phase.DECODE)
            self.planner.commit(rows)

    def _decode_rows(self, batch: int, context: int, steps: int) -> list[Sequence]:
        seqs = []
        for _ in range(batch):
            seq = self.planner.new_sequence(self._tokens(context + steps))
            seq.cached = context - 1
            seqs.append(seq)
        return seqs

    def decode(self, batch: int, context: int, warmup: int, iters: int) -> BenchRecord:
        """`batch` rows whose contexts start at `context` tokens (random KV), one token each."""
        seqs = self._decode_rows(batch, context, warmup + iters)
        it = iter(list(self.decode_plans(seqs, warmup + iters)))
        seconds = _median_time(lambda: self.runner.forward(next(it)), warmup, iters)
        for seq in seqs:
            self.planner.free(seq)
        return _record("decode", "resin", self.model, self.runner.config, context, batch,
                       seconds, iters, self.ceilings, batch)  # fmt: skip

    def kernel_census(self, batch: int, context: int, steps: int) -> CensusResult:
        """The decode step of `decode(batch, context, ...)`, run eagerly (`eager_decode`: the
        graphs' bodies) under a census (`kernel_census.run_census`): one warm-up step, then
        `steps` steps recording bytes and the next `steps` under the profiler."""
        seqs = self._decode_rows(batch, context, 1 + 2 * steps)
        plans = iter(list(self.decode_plans(seqs, 1 + 2 * steps)))

        def run() -> None:
            for _ in range(steps):
                self.runner.forward(next(plans))

        with self.runner.eager_decode():
            self.runner.forward(next(plans))
            found = run_census(run, self.runner.device)
        for seq in seqs:
            self.planner.free(seq)
        return found
