"""Model weights in the runner's fused layout, from Hugging Face names or random.

The runner multiplies by fused matrices: `qkv` = [q; k; v] projections stacked on the output
dimension, `gate_up` = [gate; up]. `from_hf_state_dict` builds them from a checkpoint's tensors
(the one name mapping), `to_hf_state_dict` gives views back under Hugging Face names (so the
transformers baseline runs on the very same memory), and `random_weights` draws them directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from resin_models_cuda.config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer. Dense: `gate_up` [2I, H], `down` [H, I]. MoE: `router` [E, H],
    `gate_up` [E, 2I, H], `down` [E, H, I]."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    router: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class ModelWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor

    def nbytes(self) -> int:
        seen: set[int] = set()
        total = 0
        tensors = [self.embed, self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in vars_of(layer) if t is not None]
        for t in tensors:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total


def cast_weights(weights: ModelWeights, dtype: torch.dtype) -> ModelWeights:
    """A copy in another dtype (the float32 oracle of a bf16 model); ties stay tied."""

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dtype)

    layers = tuple(
        LayerWeights(*(c(getattr(layer, n)) for n in LayerWeights.__slots__))  # type: ignore[arg-type]
        for layer in weights.layers
    )
    embed = weights.embed.to(dtype)
    tied = weights.lm_head.data_ptr() == weights.embed.data_ptr()
    lm_head = embed if tied else weights.lm_head.to(dtype)
    return ModelWeights(embed, layers, weights.final_norm.to(dtype), lm_head)


def vars_of(layer: LayerWeights) -> list[torch.Tensor | None]:
    return [getattr(layer, name) for name in LayerWeights.__slots__]


def from_hf_state_dict(
    get: Callable[[str], torch.Tensor], config: ModelConfig, device: torch.device | str,
    dtype: torch.dtype,
) -> ModelWeights:  # fmt: skip
    """Build fused weights; `get(name)` returns a checkpoint tensor by Hugging Face name."""

    def t(name: str) -> torch.Tensor:
        return get(name).to(device=device, dtype=dtype)

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        qkv = torch.cat([t(a + "q_proj.weight"), t(a + "k_proj.weight"), t(a + "v_proj.weight")])
        bias = None
        if config.attention_bias:
            bias = torch.cat([t(a + "q_proj.bias"), t(a + "k_proj.bias"), t(a + "v_proj.bias")])
        router = None
        if config.is_moe:
            router = t(p + "mlp.gate.weight")
            e = p + "mlp.experts."
            gate_up = torch.stack([
                torch.cat([t(f"{e}{j}.gate_proj.weight"), t(f"{e}{j}.up_proj.weight")])
                for j in range(config.num_experts)
            ])  # fmt: skip
            down = torch.stack([t(f"{e}{j}.down_proj.weight") for j in range(config.num_experts)])
        else:
            gate_up = torch.cat([t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")])
            down = t(p + "mlp.down_proj.weight")
        layers.append(
            LayerWeights(
                input_norm=t(p + "input_layernorm.weight"),
                qkv=qkv,
                qkv_bias=bias,
                o_proj=t(a + "o_proj.weight"),
                q_norm=t(a + "q_norm.weight") if config.qk_norm else None,
                k_norm=t(a + "k_norm.weight") if config.qk_norm else None,
                post_norm=t(p + "post_attention_layernorm.weight"),
                gate_up=gate_up,
                down=down,
                router=router,
            )
        )
    embed = t("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else t("lm_head.weight")
    return ModelWeights(embed, tuple(layers), t("model.norm.weight"), lm_head)


def to_hf_state_dict(weights: ModelWeights, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names -> views of `weights` (no copies). Dense models only."""
    if config.is_moe:
        raise NotImplementedError("the transformers baseline covers dense models only")
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    sd = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.final_norm}
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        sd[p + "input_layernorm.weight"] = layer.input_norm
        sd[p + "post_attention_layernorm.weight"] = layer.post_norm
        for name, lo, hi in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
            sd[f"{a}{name}_proj.weight"] = layer.qkv[lo:hi]
            if layer.qkv_bias is not None:
                sd[f"{a}{name}_proj.bias"] = layer.qkv_bias[lo:hi]
        sd[a + "o_proj.weight"] = layer.o_proj
        if layer.q_norm is not None and layer.k_norm is not None:
            sd[a + "q_norm.weight"] = layer.q_norm
            sd[a + "k_norm.weight"] = layer.k_norm
        sd[p + "mlp.gate_proj.weight"] = layer.gate_up[:inter]
        sd[p + "mlp.up_proj.weight"] = layer.gate_up[inter:]
        sd[p + "mlp.down_proj.weight"] = layer.down
    return sd


def random_weights(
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int = 0,
    std: float = 0.02,
    embed_std: float = 1.0,
    residual_scale: bool = False,
) -> ModelWeights:
    """Random weights of the model's real shapes (normal(0, std); norms at 1), on `device`.

    `embed_std` multiplies `std` for the embeddings. `residual_scale` divides the std of the
    matrices that write into the residual stream (o_proj, down) by sqrt(2 * layers), as GPT-2
    initializes them: each layer then perturbs the stream instead of replacing it, which keeps
    a deep random model well conditioned (bf16 rounding is not amplified layer after layer).
    """
    out_std = std / math.sqrt(2 * config.num_layers) if residual_scale else std
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(
            dtype
        )

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    h, qkv_out = config.hidden_size, config.q_size + 2 * config.kv_size
    layers = []
    for _ in range(config.num_layers):
        if config.is_moe:
            e, i = config.num_experts, config.moe_intermediate_size
            gate_up, down, router = rnd(e, 2 * i, h), rnd(e, h, i, scale=out_std), rnd(e, h)
        else:
            i = config.intermediate_size
            gate_up, down, router = rnd(2 * i, h), rnd(h, i, scale=out_std), None
        layers.append(
            LayerWeights(
                input_norm=ones(h),
                qkv=rnd(qkv_out, h),
                qkv_bias=rnd(qkv_out) if config.attention_bias else None,
                o_proj=rnd(h, config.q_size, scale=out_std),
                q_norm=ones(config.head_dim) if config.qk_norm else None,
                k_norm=ones(config.head_dim) if config.qk_norm else None,
                post_norm=ones(h),
                gate_up=gate_up,
                down=down,
                router=router,
            )
        )
    embed = rnd(config.vocab_size, h, scale=embed_std * std)
    lm_head = embed if config.tie_word_embeddings else rnd(config.vocab_size, h)
    return ModelWeights(embed, tuple(layers), ones(h), lm_head)


def load_checkpoint(
    path: str, config: ModelConfig, device: torch.device | str, dtype: torch.dtype
) -> ModelWeights:
    """Load safetensors shards from a Hugging Face checkpoint directory."""
    import glob
    import os

    from safetensors import safe_open

    index: dict[str, str] = {}
    for shard in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                index[name] = shard

    def get(name: str) -> torch.Tensor:
        if name not in index:
            raise KeyError(f"checkpoint {path} has no tensor {name!r}")
        with safe_open(index[name], framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name)
            return tensor

    return from_hf_state_dict(get, config, device, dtype)
