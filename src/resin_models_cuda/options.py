"""`RunnerOptions`: the knobs of a `CudaRunner`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from resin_models_cuda.models import BuildOptions


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """Knobs of a `CudaRunner`.

    - `max_batch`: largest decode batch captured in a graph (bigger ones run eagerly);
    - `max_context`: longest sequence (sizes the rope table and the page-id buffer);
    - `cache_bytes`: KV arena size to ask the engine for (None: free device memory times
      `memory_fraction`, measured when the runner is built; the `cuda` family instead sets
      it to `memory_fraction` of the free memory before the weights load, less the weights);
    - `num_pages`: exact arena size (tests); `prefill_block_m`: query rows per prefill program;
    - `moe_gemv_max_pairs`: MoE token-expert pairs up to which the expert GEMV runs instead of
      the grouped GEMM;
    - `max_draft_tokens`: speculative drafts per row the runner verifies (0: none);
      `verify_graph_batch`: verify steps up to this many rows replay captured graphs (one per
      row bucket and query size 1 + k in 2, 3, 5, 9, .. up to 1 + max_draft_tokens; with
      `mtp`, whose every decode step verifies, up to `max_batch`);
    - `graph_prefill_tokens` / `graph_prefill_rows`: a prefill step of at most that many rows
      of at most that many tokens each (a prefix hit's suffix; no prompt logprobs, images or
      MTP) runs the fixed-shape body verify steps run, in the graph of its padded shape (row
      bucket, query slots 2, 3, 5, 9, .. up to `graph_prefill_tokens`; one token a row: the
      decode graphs), where the model allows it (`FastModel.graph_prefill`); 0: varlen always;
    - `overlap`: declare `RunnerConfig.overlap` (the engine may keep two plans in flight);
    - `keep_logits`: keep a copy of each step's sampled rows' logits in `last_logits` (checks);
    - `mtp`: draft with the checkpoint's first MTP layer (DeepSeek): every step also runs it
      and returns one draft per row in `ForwardOutput.draft_ids` (`MtpProposer` hands them to
      the engine's speculative decoding).
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
    max_draft_tokens: int = 8
    verify_graph_batch: int = 16
    graph_prefill_tokens: int = 16
    graph_prefill_rows: int = 4
    overlap: bool = True
    seed: int = 0
    keep_logits: bool = False
    mtp: bool = False
    pdl: bool = field(default_factory=lambda: os.environ.get("RESIN_PDL", "0") == "1")

    def __post_init__(self) -> None:
        if self.max_draft_tokens < 0:
            raise ValueError("max_draft_tokens must be >= 0")
        if self.graph_prefill_tokens < 0 or self.graph_prefill_rows < 0:
            raise ValueError("graph_prefill_tokens and graph_prefill_rows must be >= 0")

    def build_options(self) -> BuildOptions:
        return BuildOptions(
            self.max_context, self.moe_gemv_max_pairs, self.mtp, self.max_draft_tokens
        )
