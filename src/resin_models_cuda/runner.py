"""`CudaRunner`: any fast model (`resin_models_cuda.models`) on Triton kernels and CUDA graphs.

Implements the Runner protocol: `runner_config` (one cache group per layer kind: History for
full attention, Window for sliding layers), `bind(layout)` (allocates the KV arena, the
persistent decode buffers and captures the decode graphs), `forward(plan)`, `close()`.

A step: copy-on-write page copies first; decode plans with one token per row replay the graph
of their padded bucket (plan arrays go in with one host-to-device copy); other plans run
eagerly through the varlen prefill kernels. Sampling runs on the device (`_sample`, the one
place that turns logits into tokens); the step's only sync is reading the token ids back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput, Phase
from resin.protocols import CacheLayout, History, RunnerConfig, Window
from resin_models_cuda.buffers import DecodeBuffers
from resin_models_cuda.graphs import CapturedStep, buckets_up_to, capture, pick_bucket
from resin_models_cuda.kernels import decode_splits, prefill_blocks
from resin_models_cuda.kernels.sampler import philox_seeds, sample_tokens
from resin_models_cuda.layers import RandomWeights, SafetensorsWeights, WeightSource
from resin_models_cuda.models import BuildOptions, FastModel, build_model
from resin_models_cuda.step import DecodeInfo, GroupTensors, PrefillInfo, StepTensors
from resin_models_torch.config import ModelConfig
from resin_models_torch.constraints import constrain_logits
from resin_models_torch.hf_config import load_config


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """Knobs of a `CudaRunner`.

    - `max_batch`: largest decode batch captured in a graph (bigger ones run eagerly);
    - `max_context`: longest sequence (sizes the rope table and the page-id buffer);
    - `cache_bytes`: KV arena size to ask the engine for (None: free device memory times
      `memory_fraction`, measured when the runner is built);
    - `num_pages`: exact arena size (tests); `prefill_block_m`: query rows per prefill program;
    - `moe_gemv_max_pairs`: MoE token-expert pairs up to which the expert GEMV runs instead of
      the grouped GEMM;
    - `keep_logits`: keep a copy of each step's sampled rows' logits in `last_logits` (checks).
    """

    page_size: int = 16
    max_batch: int = 256
    max_context: int = 8192
    cuda_graphs: bool = True
    cache_bytes: int | None = None
    num_pages: int | None = None
    memory_fraction: float = 0.85
    prefill_block_m: int = 128
    moe_gemv_max_pairs: int = 64
    seed: int = 0
    keep_logits: bool = False

    def build_options(self) -> BuildOptions:
        return BuildOptions(self.max_context, self.moe_gemv_max_pairs)


def random_runner(
    config: ModelConfig,
    options: RunnerOptions | None = None,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> CudaRunner:
    """A runner on random weights of the config's real shapes (benchmarks)."""
    options = options or RunnerOptions()
    source = RandomWeights(device, dtype, seed=seed, num_layers=config.num_layers)
    return CudaRunner(build_model(config, source, options.build_options()), options)


def load_runner(
    folder: str | Path,
    options: RunnerOptions | None = None,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> CudaRunner:
    """A runner for a Hugging Face checkpoint folder (config.json + safetensors)."""
    options = options or RunnerOptions()
    source: WeightSource = SafetensorsWeights(str(folder), device, dtype)
    model = build_model(load_config(folder), source, options.build_options())
    return CudaRunner(model, options)


class CudaRunner:
    def __init__(self, model: FastModel, options: RunnerOptions | None = None) -> None:
        self.model = model
        self.config = model.config
        self.options = options or RunnerOptions()
        self.device, self.dtype = model.device, model.dtype
        self._graphs_enabled = self.options.cuda_graphs and self.device.type == "cuda"
        self._max_positions = min(self.options.max_context, self.config.max_positions) + 1
        self._rng = np.random.default_rng(self.options.seed)
        self._num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 1  # the CPU interpreter pays per program: no split-KV there
        )
        self._runner_config = self._make_runner_config()
        self.kv: torch.Tensor | None = None
        self._buffers: DecodeBuffers | None = None
        self._graphs: dict[int, CapturedStep] = {}
        self._buckets: tuple[int, ...] = ()
        self.last_logits: torch.Tensor | None = None

    # ----- Runner protocol -------------------------------------------------------------------

    @property
    def runner_config(self) -> RunnerConfig:
        return self._runner_config

    def bind(self, layout: CacheLayout) -> None:
        """Allocate the KV arena for `layout.num_pages` pages and capture the decode graphs."""
        if self.kv is not None:
            raise RuntimeError("bind() was already called")
        ours = self._runner_config.page_bytes
        if layout.page_size != self.options.page_size or layout.page_bytes < ours:
            raise ValueError(f"layout {layout} does not fit this runner's pages ({ours} bytes)")
        if layout.num_pages * layout.page_size >= 2**31:
            raise ValueError("arena too large for int32 slots")
        planes, heads, dim = self.model.cache_token_shape()
        # Page p holds page_size tokens of every layer of the group that owns it; groups with
        # fewer layers use the first slots.
        self.kv = torch.zeros(
            (
                layout.num_pages,
                max(self.model.layers_per_group),
                planes,
                layout.page_size,
                heads,
                dim,
            ),
            dtype=self.dtype,
            device=self.device,
        )
        pages_per_seq = -(-self.options.max_context // layout.page_size) + 1
        groups = len(self.model.group_kinds)
        self._buffers = DecodeBuffers(
            self.options.max_batch,
            groups * self.options.max_batch * pages_per_seq,
            self.device,
            groups,
        )
        if self._graphs_enabled:
            self._buckets = buckets_up_to(self.options.max_batch)
            self._graphs = capture(self._buckets, self._decode_logits, self._buffers.stage_padding)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self.kv is None or self._buffers is None:
            raise RuntimeError("forward() before bind()")
        if int(plan.total_lens.max(initial=0)) > self._max_positions:
            raise ValueError(f"context beyond max_context={self.options.max_context}")
        for group in plan.cache_groups:
            if group.copy_src.shape[0]:
                src = torch.from_numpy(group.copy_src.astype(np.int64)).to(self.device)
                dst = torch.from_numpy(group.copy_dst.astype(np.int64)).to(self.device)
                self.kv[dst] = self.kv[src]
        b = plan.num_sequences
        if plan.phase is Phase.DECODE and plan.num_tokens == b and b <= self._buffers.max_rows:
            bucket = pick_bucket(b, self._buckets) if self._graphs else None
            self._buffers.stage(plan, bucket or b)
            if bucket is not None:
                self._graphs[bucket].graph.replay()
                logits = self._graphs[bucket].logits[:b]
            else:
                logits = self._decode_logits(b)
            rows = np.arange(b)
        else:
            rows = np.flatnonzero(plan.sample_rows)
            hidden = self.model.forward(self._prefill_step(plan), self.kv)
            last = torch.from_numpy(plan.last_token_index[rows].astype(np.int64)).to(self.device)
            logits = self.model.logits(hidden[last])
        if self.options.keep_logits:
            self.last_logits = logits.clone()
        return self._sample(plan, rows, logits)

    def close(self) -> None:
        self._graphs.clear()
        self.kv = None
        self._buffers = None

    # ----- internals -------------------------------------------------------------------------

    def _make_runner_config(self) -> RunnerConfig:
        c, ps = self.config, self.options.page_size
        planes, heads, dim = self.model.cache_token_shape()
        per_layer = ps * planes * heads * dim * self.dtype.itemsize
        groups: list[History | Window] = []
        for kind, layers in zip(self.model.group_kinds, self.model.layers_per_group, strict=True):
            if kind == "sliding":
                groups.append(Window(int(c.sliding_window or 0), layers * per_layer))
            else:
                groups.append(History(layers * per_layer))
        page_bytes = max(g.bytes_per_page for g in groups)
        cache_bytes = self.options.cache_bytes
        if cache_bytes is None and self.options.num_pages is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                cache_bytes = int(free * self.options.memory_fraction)
            else:
                cache_bytes = 256 * page_bytes
        return RunnerConfig(
            vocab_size=c.vocab_size,
            page_size=ps,
            cache_groups=tuple(groups),
            num_pages=self.options.num_pages,
            cache_bytes=cache_bytes,
            waits_for_masks=True,  # constrain_logits reads the mask through bitmask()
        )

    def _decode_logits(self, rows: int) -> torch.Tensor:
        """The decode forward over the persistent buffers' first `rows` rows (graph body)."""
        assert self._buffers is not None and self.kv is not None
        v = self._buffers.views(rows)
        splits = decode_splits(rows, self.config.num_kv_heads, self._num_sms)
        step = StepTensors(v.input_ids, v.positions, v.groups, DecodeInfo(v.seq_lens, splits))
        return self.model.logits(self.model.forward(step, self.kv))

    def _prefill_step(self, plan: BatchPlan) -> StepTensors:
        block_m = self.options.prefill_block_m if self.device.type == "cuda" else 16
        if self.dtype == torch.float32:
            block_m = min(block_m, 64)  # float32 tiles need twice the shared memory
        if self.config.head_dim * self.dtype.itemsize > 512:
            block_m = min(block_m, 32)  # wide float32 heads (Gemma's 256)
        block_row, block_off = prefill_blocks(plan.query_indptr, block_m)

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(a, dtype=np.int32)).to(self.device)

        groups = tuple(
            GroupTensors(
                dev(g.append_slots), dev(g.page_indptr), dev(g.page_ids), dev(g.page_start)
            )
            for g in plan.cache_groups
        )
        info = PrefillInfo(
            dev(plan.query_indptr), dev(plan.cached_lens), dev(block_row), dev(block_off), block_m
        )
        return StepTensors(dev(plan.input_ids), dev(plan.positions), groups, info)

    def _sample(self, plan: BatchPlan, rows: np.ndarray, logits: torch.Tensor) -> ForwardOutput:
        s = plan.sampling
        logits = constrain_logits(logits, s, rows)  # mask + bias first: sampling and logprobs
        temp = s.temperature[rows].astype(np.float32)
        temp = np.where(s.top_k[rows] == 1, np.float32(0), temp)
        if not np.any(temp > 0):
            tokens = logits.argmax(dim=-1)
        else:
            top_k, top_p, min_p = s.top_k[rows], s.top_p[rows], s.min_p[rows]
            needs_filter = bool(np.any((temp > 0) & ((top_k > 0) | (top_p < 1) | (min_p > 0))))
            seeds = philox_seeds(s.seed[rows], s.output_index[rows], self._rng)

            def dev(a: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(np.array(a)).to(self.device)

            tokens = sample_tokens(
                logits.contiguous(),
                dev(temp),
                dev(top_k.astype(np.int32)),
                dev(top_p.astype(np.float32)),
                dev(min_p.astype(np.float32)),
                dev(seeds.astype(np.int64)),
                needs_filter=needs_filter,
            )
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(np.isin(np.arange(plan.num_sequences), rows))
        out_logprobs = self._logprobs(plan, rows, logits, tokens)
        token_ids = tokens.to(torch.int64).cpu().numpy().astype(np.uint32)
        if out_logprobs is None:
            return ForwardOutput(token_ids=token_ids, token_indptr=indptr)
        chosen, top_ids, top_lp = out_logprobs
        return ForwardOutput(
            token_ids=token_ids,
            token_indptr=indptr,
            logprobs=chosen,
            top_ids=top_ids,
            top_logprobs=top_lp,
        )

    def _logprobs(
        self, plan: BatchPlan, rows: np.ndarray, logits: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        asked = plan.sampling.logprobs[rows]
        if rows.shape[0] == 0 or asked.max(initial=-1) < 0:
            return None
        logp = torch.log_softmax(logits.float(), dim=-1)
        chosen = logp.gather(1, tokens.view(-1, 1).long()).squeeze(1).cpu().numpy()
        k = int(asked.max())
        top_lp, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], logp[:, :0].long())
        chosen = np.where(asked >= 0, chosen, np.nan).astype(np.float32)
        return (
            chosen,
            top_ids.to(torch.int32).cpu().numpy(),
            top_lp.cpu().numpy().astype(np.float32),
        )
