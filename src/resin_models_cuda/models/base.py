"""What every fast model shares: cache-group assignment from layer kinds, one rotary table per
distinct rope, the embedding (with Gemma's scale), the final norm and the LM head (tied or
not, optional final soft-capping). A model file subclasses `FastModel`, builds its layers from
`resin_models_cuda.layers` and writes `forward` as straight-line code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from resin.protocols import CacheGroupSpec
from resin_model.config import LayerKind, ModelConfig
from resin_models_cuda.layers import Attention, RMSNorm, Rotary, WeightSource
from resin_models_cuda.step import LayerSlot, MediaTensors, StepTensors

GROUP_KINDS: tuple[LayerKind, ...] = ("full", "sliding")  # the reference runner's group order
STATE_KINDS: tuple[LayerKind, ...] = ("linear",)  # State groups, after the token groups


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """`max_positions`: rotary table length; `moe_gemv_max_pairs`: token-expert pairs up to
    which MoE layers take the expert-GEMV path instead of the grouped GEMM; `mtp`: load the
    checkpoint's first multi-token-prediction layer (DeepSeek) to draft with;
    `max_draft_tokens`: drafts a row may verify (a model whose State can drop them keeps room
    for that many, DeepSeek-V4); `cut_moe`: applied to each MoE layer as soon as it is built
    (DeepSeek-V4, GLM-5.3; `resin_models_cuda.parallel.moe_cutter`), so a rank of an expert
    parallel job never holds more than one layer's whole experts."""

    max_positions: int = 8192
    moe_gemv_max_pairs: int = 64
    mtp: bool = False
    max_draft_tokens: int = 0
    cut_moe: Callable[[Any], Any] | None = None


class FastModel:
    """Subclasses set `self.layers` and implement `forward(step, kv) -> hidden [T, H]` (after
    the final norm). `kv` is the arena `[pages, max layers per group, 2, page, Hkv, D]`; a
    model with linear-attention layers also reads the step's State region (`step.state`)."""

    unit_offset_norms = False  # Gemma's (1 + w) RMSNorm weights
    eager_only = False  # True: every step through `forward` on varlen tensors, no CUDA graphs
    # Short prefill steps (a prefix hit's suffix) may run the fixed-shape body verify steps
    # run, in the graph of their padded shape (`RunnerOptions.graph_prefill_tokens`)
    graph_prefill = True
    # The State kernels read a row's tokens by offset (linear attention), so a step of several
    # query slots a row splits the State rows around the padding (`buffers.py`); False: State
    # row b is row b whatever its tokens (DeepSeek-V4's compressor rings)
    split_states = True

    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        if "conv" in config.layer_types:
            raise ValueError(f"{config.model_type}: conv layers have no fast implementation")
        self.config, self.options = config, options
        self.device, self.dtype = weights.device, weights.dtype
        self.group_kinds = tuple(k for k in GROUP_KINDS if k in config.layer_types)
        state_kinds = tuple(k for k in STATE_KINDS if k in config.layer_types)
        kinds = self.group_kinds + state_kinds
        seen = dict.fromkeys(kinds, 0)
        slots = []
        for kind in config.layer_types:
            slots.append(LayerSlot(kinds.index(kind), seen[kind]))
            seen[kind] += 1
        self.slots = tuple(slots)
        self.layers_per_group = tuple(seen[k] for k in self.group_kinds)
        positions = min(options.max_positions, config.max_positions) + 1
        self._rotary = {
            kind: Rotary(config.rope_of(kind), config.rotary_dim, positions, self.device)
            for kind in self.group_kinds
        }
        hidden, vocab = config.hidden_size, config.vocab_size
        self.embed = weights.get("model.embed_tokens.weight", (vocab, hidden))
        self.final_norm = RMSNorm(
            weights, "model.norm.weight", hidden, config.norm_eps, self.unit_offset_norms
        )
        tied = config.tie_embeddings
        self.lm_head = self.embed if tied else weights.get("lm_head.weight", (vocab, hidden))

    def cache_groups(self, page_size: int) -> tuple[CacheGroupSpec, ...] | None:
        """The model's own cache groups, or None: one per layer kind (`GROUP_KINDS`), then a
        State group of `state_bytes` (the runner's default). A model that declares its own
        views the token arena (`kv`, `cache_token_shape` per token of a one-layer group) and
        the State region (`step.states`) as it likes; its decode steps get every State
        group's rows (`step.states`) and a Compressed group's completed entries per query
        slot (`GroupTensors.entry_at`) from the runner's decode buffers."""
        return None

    def state_bytes(self) -> int:
        """Bytes of one checkpoint of the model's State group (its linear-attention layers,
        declared after the token groups), or 0 without one."""
        return 0

    def cache_token_shape(self) -> tuple[int, int, int]:
        """(planes, heads, dim) cached per token per layer: K and V of every KV head here; an
        MLA model keeps one latent vector (1, 1, latent)."""
        return 2, self.config.num_kv_heads, self.config.head_dim

    def window(self, layer: int) -> int:
        """The layer's sliding window (0: full attention)."""
        sliding = self.config.layer_types[layer] == "sliding"
        return int(self.config.sliding_window or 0) if sliding else 0

    def rotary(self, layer: int) -> Rotary:
        return self._rotary[self.config.layer_types[layer]]

    def attention(self, weights: WeightSource, layer: int) -> Attention:
        """Layer `layer`'s paged attention: its cache slot, window and rotary table."""
        return Attention(
            self.config,
            weights,
            f"model.layers.{layer}.self_attn.",
            self.slots[layer],
            self.window(layer),
            self.rotary(layer),
            unit_offset_norms=self.unit_offset_norms,
        )

    def embed_tokens(
        self, input_ids: torch.Tensor, media: MediaTensors | None = None
    ) -> torch.Tensor:
        """Token embeddings (scaled), image features over their placeholders (`media`)."""
        x = F.embedding(input_ids.long(), self.embed)
        if self.config.embed_scale != 1.0:  # Gemma scales in the weight dtype, as HF does
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        if media is not None:
            x.index_copy_(0, media.token_index, media.features.to(x.dtype))
        return x

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, V] (the matmul in the weights' dtype, as Hugging Face does)."""
        logits = F.linear(hidden, self.lm_head).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def nbytes(self) -> int:
        """Bytes of distinct tensors the model holds (ties counted once)."""
        seen: set[int] = set()
        stack: list[object] = [self]
        total = 0
        while stack:
            obj = stack.pop()
            if isinstance(obj, torch.Tensor):
                if obj.data_ptr() not in seen:
                    seen.add(obj.data_ptr())
                    total += obj.numel() * obj.element_size()
            elif isinstance(obj, (list, tuple)):
                stack.extend(obj)
            elif isinstance(obj, dict):
                stack.extend(obj.values())
            elif hasattr(obj, "__dict__"):
                stack.extend(vars(obj).values())
            elif hasattr(obj, "__slots__"):
                stack.extend(getattr(obj, name) for name in obj.__slots__)
        return total
