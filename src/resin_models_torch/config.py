"""Typed model configs, translated once from a checkpoint's `config.json`.

Model code reads `ModelConfig` fields only; every Hugging Face naming quirk (rope_parameters vs
rope_theta/rope_scaling, num_experts vs num_local_experts, LFM2's block_ff_dim arithmetic,
Gemma's per-layer-type rope bases) is resolved here, in one place.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "conv"]
RopeKind = Literal["default", "linear", "llama3"]

_LAYER_KINDS: dict[str, LayerKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "conv": "conv",
}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters of one layer kind."""

    theta: float
    kind: RopeKind = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """Mixture of experts: `sparse_layers[i]` says whether layer i uses experts."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything a reference model needs, with explicit defaults.

    Invariants: `len(layer_types) == num_layers`; `num_heads % num_kv_heads == 0`;
    `sliding_window` is set when any layer is "sliding"; `conv_kernel >= 2` when any is "conv".
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope: RopeConfig
    layer_types: tuple[LayerKind, ...]
    tie_embeddings: bool = False
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    local_rope: RopeConfig | None = None
    attn_scale: float | None = None
    embed_scale: float = 1.0
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    moe: MoeConfig | None = None
    conv_kernel: int = 0
    conv_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers:
            raise ValueError("layer_types must list every layer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise ValueError("sliding layers need a sliding_window")
        if "conv" in self.layer_types and self.conv_kernel < 2:
            raise ValueError("conv layers need conv_L_cache >= 2")

    @property
    def scale(self) -> float:
        """Attention score scale (Gemma uses query_pre_attn_scalar instead of head_dim)."""
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5


def load_config(folder: str | Path) -> ModelConfig:
    """Read `<folder>/config.json` and translate it."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    return parse_config(json.loads(path.read_text()))


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Translate a Hugging Face config dict into a `ModelConfig` (raises on unsupported ones)."""
    model_type = str(raw.get("model_type", ""))
    if model_type not in _PARSERS:
        raise ValueError(f"unsupported model_type {model_type!r}; known: {sorted(_PARSERS)}")
    return _PARSERS[model_type](raw)


def _common(raw: dict[str, Any], norm_eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    eos = raw.get("eos_token_id")
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos])
    )
    return {
        "model_type": str(raw["model_type"]),
        "vocab_size": int(raw["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(raw.get("intermediate_size") or 0),
        "num_layers": int(raw["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or hidden // heads),
        "norm_eps": float(raw.get(norm_eps_key, 1e-6)),
        "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "hidden_act": str(raw.get("hidden_act") or raw.get("hidden_activation") or "silu"),
        "eos_token_ids": eos_ids,
        "bos_token_id": raw.get("bos_token_id"),
    }


def _rope(params: dict[str, Any] | None, theta: float) -> RopeConfig:
    params = dict(params or {})
    kind = str(params.get("rope_type", params.get("type", "default")))
    theta = float(params.get("rope_theta", theta))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
        )
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3)")


def _global_rope(raw: dict[str, Any]) -> RopeConfig:
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    return _rope(params, float(raw.get("rope_theta", 10000.0)))


def _layer_types(raw: dict[str, Any], default: LayerKind) -> tuple[LayerKind, ...]:
    names = raw.get("layer_types")
    if not names:
        return (default,) * int(raw["num_hidden_layers"])
    unknown = set(names) - set(_LAYER_KINDS)
    if unknown:
        raise ValueError(f"unsupported layer types {sorted(unknown)}")
    return tuple(_LAYER_KINDS[n] for n in names)


def _llama(raw: dict[str, Any]) -> ModelConfig:
    model_type = str(raw["model_type"])
    window = raw.get("sliding_window")
    mistral_window = model_type == "mistral" and window is not None
    types = _layer_types(raw, "sliding" if mistral_window else "full")
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **_common(raw),
        rope=_global_rope(raw),
        layer_types=types,
        # Qwen2 hard-codes a q/k/v bias (and no o bias); Llama/Qwen3 follow attention_bias.
        qkv_bias=bias or model_type == "qwen2",
        o_bias=bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=int(window) if window and "sliding" in types else None,
    )


def _qwen3_moe(raw: dict[str, Any]) -> ModelConfig:
    base = _llama(raw)
    num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    step = int(raw.get("decoder_sparse_step", 1))
    dense = set(raw.get("mlp_only_layers") or [])
    sparse = tuple(
        i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(base.num_layers)
    )
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["moe_intermediate_size"]),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )
    return _replace(base, moe=moe)


def _gemma3(raw: dict[str, Any]) -> ModelConfig:
    common = _common(raw)
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        rope = _rope(params.get("full_attention"), 1_000_000.0)
        local = _rope(params.get("sliding_attention"), 10_000.0)
    else:  # older configs: rope_theta + rope_scaling for global layers, a local base frequency
        rope = _rope(raw.get("rope_scaling"), float(raw.get("rope_theta", 1_000_000.0)))
        local = RopeConfig(theta=float(raw.get("rope_local_base_freq", 10_000.0)))
    if raw.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma 3 attention is not supported")
    types = raw.get("layer_types") or [
        "sliding_attention"
        if (i + 1) % int(raw.get("sliding_window_pattern", 6))
        else "full_attention"
        for i in range(common["num_layers"])
    ]
    softcap = raw.get("final_logit_softcapping")
    attn_softcap = raw.get("attn_logit_softcapping")
    common["tie_embeddings"] = bool(raw.get("tie_word_embeddings", True))
    return ModelConfig(
        **common,
        rope=rope,
        local_rope=local,
        layer_types=_layer_types({**raw, "layer_types": types}, "full"),
        qkv_bias=bool(raw.get("attention_bias", False)),
        o_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        sliding_window=int(raw.get("sliding_window") or 4096),
        attn_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        embed_scale=math.sqrt(common["hidden_size"]),
        final_logit_softcapping=float(softcap) if softcap else None,
        attn_logit_softcapping=float(attn_softcap) if attn_softcap else None,
    )


def _lfm2(raw: dict[str, Any]) -> ModelConfig:
    common = _common(raw, norm_eps_key="norm_eps")
    ff = int(raw.get("block_ff_dim") or raw["intermediate_size"])
    if raw.get("block_auto_adjust_ff_dim", True):
        # Same arithmetic as the reference implementation: 2/3 of the width, scaled, rounded up.
        ff = int(2 * ff / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            ff = int(float(multiplier) * ff)
            multiple = int(raw.get("block_multiple_of", 256))
            ff = multiple * ((ff + multiple - 1) // multiple)
    common["intermediate_size"] = ff
    common["tie_embeddings"] = bool(raw.get("tie_word_embeddings", raw.get("tie_embedding", True)))
    types = raw.get("layer_types")
    if not types:
        full = set(raw.get("full_attn_idxs") or range(common["num_layers"]))
        types = ["full_attention" if i in full else "conv" for i in range(common["num_layers"])]
    return ModelConfig(
        **common,
        rope=_global_rope(raw),
        layer_types=_layer_types({**raw, "layer_types": types}, "full"),
        qk_norm=True,
        conv_kernel=int(raw.get("conv_L_cache", 3)),
        conv_bias=bool(raw.get("conv_bias", False)),
    )


def _replace(config: ModelConfig, **changes: Any) -> ModelConfig:
    from dataclasses import replace

    return replace(config, **changes)


_PARSERS = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3_moe": _qwen3_moe,
    "gemma3_text": _gemma3,
    "lfm2": _lfm2,
}
