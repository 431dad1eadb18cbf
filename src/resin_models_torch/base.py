"""What every reference model shares: cache-group assignment from layer kinds, the embedding /
final norm / LM head frame, tied embeddings and final-logit softcapping."""

from __future__ import annotations

import torch
from torch import nn

from resin_model.checkpoint_names import default_names
from resin_model.config import ModelConfig
from resin_models_torch.batch import (
    CacheSpec,
    ConvSpec,
    KvSpec,
    LatentSpec,
    LayerSlot,
    LinearStateSpec,
    StepContext,
)


def assign_groups(config: ModelConfig) -> tuple[tuple[CacheSpec, ...], tuple[LayerSlot, ...]]:
    """One cache group per layer kind present, in the order full, sliding, conv, linear.

    Every layer of a kind shares its group's pages (a page holds that group's layers).
    """
    specs: list[CacheSpec] = []
    group_of: dict[str, int] = {}
    for kind in ("full", "sliding", "conv", "linear"):
        count = config.layer_types.count(kind)  # type: ignore[arg-type,unused-ignore]
        if not count:
            continue
        group_of[kind] = len(specs)
        linear = config.linear_attention
        if kind == "conv":
            specs.append(ConvSpec(count, config.hidden_size, config.conv_kernel - 1))
        elif kind == "linear" and linear is not None:
            specs.append(
                LinearStateSpec(
                    count,
                    linear.conv_channels,
                    linear.conv_kernel - 1,
                    linear.num_v_heads,
                    linear.k_head_dim,
                    linear.v_head_dim,
                )
            )
        elif config.mla is not None:  # one latent per token per layer (MtpRunner adds MTP's)
            specs.append(LatentSpec(count, config.mla.latent_dim))
        else:
            window = config.sliding_window if kind == "sliding" else None
            specs.append(KvSpec(count, config.num_kv_heads, config.head_dim, window))
    seen: dict[str, int] = {}
    slots = []
    for kind in config.layer_types:
        slots.append(LayerSlot(group_of[kind], seen.get(kind, 0)))
        seen[kind] = seen.get(kind, 0) + 1
    return tuple(specs), tuple(slots)


class AttentionProjections(nn.Module):
    """An attention layer's q/k/v/o projections in Hugging Face names (biases per config); the
    model's attention class adds its norms and `forward`."""

    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__()
        self.config = config
        self.slot = slot
        hidden, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * d, hidden, bias=config.o_bias)


class Backbone(nn.Module):
    """`model.*` in Hugging Face names: embeddings, a layer list and a final norm."""

    def __init__(self, config: ModelConfig, layers: nn.ModuleList, norm: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = layers
        self.norm = norm


class CausalLM(nn.Module):
    """Base of the reference models. Subclasses build `self.model` and implement `forward`.

    `forward(input_ids [T], ctx) -> hidden [T, hidden]` (after the final norm);
    `logits(hidden [N, hidden]) -> [N, vocab]` in float32.
    """

    model: Backbone

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.cache_specs, self.slots = assign_groups(config)
        self.lm_head: nn.Linear | None = None
        self.layer_groups: tuple[tuple[int, ...], ...] | None = None
        """Per layer, the cache groups it reads, when a model declares them (reports only)."""
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def checkpoint_name(self, name: str) -> str | None:
        """The parameter a checkpoint tensor loads into (None: skip it)."""
        return default_names(name)

    def optional_missing(self, missing: set[str]) -> set[str]:
        """Of the parameters a checkpoint lacks, those that are an error (the model may drop
        optional parts instead)."""
        return missing

    def split_tensor(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The tensors a checkpoint tensor holds (a fused layout unpacks into several)."""
        return [(name, tensor)]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.model.embed_tokens(input_ids)
        if self.config.embed_scale != 1.0:
            # Gemma scales in the weight dtype (sqrt(hidden) rounded to it), as HF does.
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        return x

    def embed_with_media(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Token embeddings with the step's encoder features over image placeholders."""
        x = self.embed(input_ids)
        if ctx.media is not None and ctx.media.token_index.numel():
            x = x.index_copy(0, ctx.media.token_index, ctx.media.features.to(x.dtype))
        return x

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        weight: torch.Tensor = head.weight
        logits = (hidden @ weight.T).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
