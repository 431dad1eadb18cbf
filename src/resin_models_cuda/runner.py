"""`CudaRunner`: the Llama-family (and Qwen3-MoE) runner on Triton kernels and CUDA graphs.

Implements the Runner protocol: `runner_config` (one History group, or a Window group for
sliding-window models), `bind(layout)` (allocates the KV arena, the persistent decode buffers
and captures the decode graphs), `forward(plan)`, `close()`.

A step: copy-on-write page copies first; decode plans with one token per row replay the graph
of their padded bucket (plan arrays go in with one host-to-device copy); other plans run
eagerly through the varlen prefill kernels. Sampling runs on the device; the step's only sync
is reading the sampled token ids back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput, Phase
from resin.protocols import CacheLayout, History, RunnerConfig, Window
from resin_models_cuda.buffers import DecodeBuffers
from resin_models_cuda.config import ModelConfig
from resin_models_cuda.constraints import constrain_logits
from resin_models_cuda.graphs import CapturedStep, buckets_up_to, capture, pick_bucket
from resin_models_cuda.kernels import decode_splits, prefill_blocks, rope_cache
from resin_models_cuda.kernels.sampler import philox_seeds, sample_tokens
from resin_models_cuda.model import (
    DecodeMeta,
    PrefillMeta,
    Rope,
    StepTensors,
    compute_logits,
    forward_hidden,
)
from resin_models_cuda.moe import GEMV_MAX_PAIRS
from resin_models_cuda.weights import ModelWeights


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """Knobs of a `CudaRunner`.

    - `max_batch`: largest decode batch captured in a graph (bigger ones run eagerly);
    - `max_context`: longest sequence (sizes the rope table and the page-id buffer);
    - `cache_bytes`: KV arena size to ask the engine for (None: free device memory times
      `memory_fraction`, measured when the runner is built);
    - `num_pages`: exact arena size (tests); `prefill_block_m`: query rows per prefill program;
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
    seed: int = 0
    keep_logits: bool = False


class CudaRunner:
    def __init__(
        self, config: ModelConfig, weights: ModelWeights, options: RunnerOptions | None = None
    ) -> None:
        self.config = config
        self.weights = weights
        self.options = options or RunnerOptions()
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self._graphs_enabled = self.options.cuda_graphs and self.device.type == "cuda"
        # MoE decode is graph-safe only on the expert-GEMV path (small batches).
        self._graph_max_batch = self.options.max_batch
        if config.is_moe:
            self._graph_max_batch = min(
                self.options.max_batch, max(1, GEMV_MAX_PAIRS // config.experts_per_token)
            )
        max_pos = min(self.options.max_context, config.max_positions) + 1
        cos, sin = rope_cache(
            config.head_dim, max_pos, config.rope_theta, config.rope_scaling, self.device
        )
        self._rope = Rope(cos, sin)
        self._rng = np.random.default_rng(self.options.seed)
        self._num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 8
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
        ours = self._page_bytes()
        if layout.page_size != self.options.page_size or layout.page_bytes < ours:
            raise ValueError(f"layout {layout} does not fit this runner's pages ({ours} bytes)")
        if layout.num_pages * layout.page_size >= 2**31:
            raise ValueError("arena too large for int32 slots")
        c = self.config
        self.kv = torch.zeros(
            (layout.num_pages, c.num_layers, 2, layout.page_size, c.num_kv_heads, c.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        pages_per_seq = -(-self.options.max_context // layout.page_size)
        self._buffers = DecodeBuffers(
            self.options.max_batch, self.options.max_batch * pages_per_seq, self.device
        )
        if self._graphs_enabled:
            self._buckets = buckets_up_to(self._graph_max_batch)
            self._graphs = capture(self._buckets, self._decode_logits, self._buffers.stage_padding)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self.kv is None or self._buffers is None:
            raise RuntimeError("forward() before bind()")
        if int(plan.total_lens.max(initial=0)) > self._rope.cos.shape[0]:
            raise ValueError(f"context beyond max_context={self.options.max_context}")
        group = plan.cache_groups[0]
        if group.copy_src.shape[0]:
            src = torch.from_numpy(group.copy_src.astype(np.int64)).to(self.device)
            dst = torch.from_numpy(group.copy_dst.astype(np.int64)).to(self.device)
            self.kv[dst] = self.kv[src]
        b = plan.num_sequences
        if plan.phase is Phase.DECODE and plan.num_tokens == b and b <= self._buffers.max_rows:
            bucket = pick_bucket(b, self._buckets) if self._graphs else None
            self._buffers.stage(plan, 0, bucket or b)
            if bucket is not None:
                self._graphs[bucket].graph.replay()
                logits = self._graphs[bucket].logits[:b]
            else:
                logits = self._decode_logits(b)
            rows = np.arange(b)
        else:
            rows = np.flatnonzero(plan.sample_rows)
            hidden = forward_hidden(self.config, self.weights, self._prefill_step(plan), self.kv,
                                    self._rope)  # fmt: skip
            last = torch.from_numpy(plan.last_token_index[rows].astype(np.int64)).to(self.device)
            logits = compute_logits(self.weights, hidden[last])
        if self.options.keep_logits:
            self.last_logits = logits.clone()
        return self._sample(plan, rows, logits)

    def close(self) -> None:
        self._graphs.clear()
        self.kv = None
        self._buffers = None

    # ----- internals -------------------------------------------------------------------------

    def _page_bytes(self) -> int:
        return self.options.page_size * self.config.kv_bytes_per_token(self.dtype.itemsize)

    def _make_runner_config(self) -> RunnerConfig:
        page_bytes = self._page_bytes()
        group: History | Window = History(page_bytes)
        if self.config.sliding_window:
            group = Window(self.config.sliding_window, page_bytes)
        cache_bytes = self.options.cache_bytes
        if cache_bytes is None and self.options.num_pages is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                cache_bytes = int(free * self.options.memory_fraction)
            else:
                cache_bytes = 256 * page_bytes
        return RunnerConfig(
            vocab_size=self.config.vocab_size,
            page_size=self.options.page_size,
            cache_groups=(group,),
            num_pages=self.options.num_pages,
            cache_bytes=cache_bytes,
            waits_for_masks=True,  # constrain_logits reads the mask through bitmask()
        )

    def _decode_logits(self, rows: int) -> torch.Tensor:
        """The decode forward over the persistent buffers' first `rows` rows (graph body)."""
        assert self._buffers is not None and self.kv is not None
        v = self._buffers.views(rows)
        meta = DecodeMeta(v.page_indptr, v.page_ids, v.page_start, v.seq_lens,
                          decode_splits(rows, self.config.num_kv_heads, self._num_sms))  # fmt: skip
        step = StepTensors(v.input_ids, v.positions, v.slots, meta)
        return compute_logits(self.weights, forward_hidden(self.config, self.weights, step,
                                                           self.kv, self._rope))  # fmt: skip

    def _prefill_step(self, plan: BatchPlan) -> StepTensors:
        g = plan.cache_groups[0]
        block_m = self.options.prefill_block_m if self.device.type == "cuda" else 16
        if self.dtype == torch.float32:
            block_m = min(block_m, 64)  # float32 tiles need twice the shared memory
        block_row, block_off = prefill_blocks(plan.query_indptr, block_m)

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(a, dtype=np.int32)).to(self.device)

        meta = PrefillMeta(
            dev(plan.query_indptr), dev(plan.cached_lens), dev(g.page_indptr), dev(g.page_ids),
            dev(g.page_start), dev(block_row), dev(block_off), block_m,
        )  # fmt: skip
        return StepTensors(dev(plan.input_ids), dev(plan.positions), dev(g.append_slots), meta)

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
                logits.contiguous(), dev(temp), dev(top_k.astype(np.int32)),
                dev(top_p.astype(np.float32)), dev(min_p.astype(np.float32)),
                dev(seeds.astype(np.int64)), needs_filter=needs_filter,
            )  # fmt: skip
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(np.isin(np.arange(plan.num_sequences), rows))
        out_logprobs = self._logprobs(plan, rows, logits, tokens)
        token_ids = tokens.to(torch.int64).cpu().numpy().astype(np.uint32)
        if out_logprobs is None:
            return ForwardOutput(token_ids=token_ids, token_indptr=indptr)
        chosen, top_ids, top_lp = out_logprobs
        return ForwardOutput(token_ids=token_ids, token_indptr=indptr, logprobs=chosen,
                             top_ids=top_ids, top_logprobs=top_lp)  # fmt: skip

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
        return (chosen, top_ids.to(torch.int32).cpu().numpy(),
                top_lp.cpu().numpy().astype(np.float32))  # fmt: skip
