"""The one typed model config of both runner families, translated once from `config.json`.

`resin_models_torch` (reference) and `resin_models_cuda` (fast) read `ModelConfig` fields only;
every Hugging Face naming quirk (rope_parameters vs rope_theta/rope_scaling, num_experts vs
num_local_experts, LFM2's block_ff_dim arithmetic, Gemma's per-layer-type rope bases) is
resolved here, in one place. Defaults are the Hugging Face config classes' defaults. A key this
module does not read and does not know to be harmless (metadata, training-only knobs) raises:
an unknown field may change the math, and silently ignoring it would give wrong outputs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "conv"]
RopeKind = Literal["default", "linear", "llama3", "yarn"]

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
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0

    def inv_freq(self, head_dim: int) -> Any:
        """float32 inverse frequencies [head_dim // 2] (torch), the one formula both runner
        families use; cos/sin are then multiplied by `attention_factor` (YaRN)."""
        import torch

        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        if self.kind == "linear":
            return inv_freq / self.factor
        if self.kind == "llama3":
            low_wavelen = self.original_max_position / self.low_freq_factor
            high_wavelen = self.original_max_position / self.high_freq_factor
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
            smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return torch.where(medium, smoothed, scaled)
        if self.kind == "yarn":
            return self._yarn(inv_freq, head_dim)
        return inv_freq

    def _yarn(self, extrapolation: Any, head_dim: int) -> Any:
        import torch

        def correction_dim(rotations: float) -> float:
            ratio = self.original_max_position / (rotations * 2 * math.pi)
            return head_dim * math.log(ratio) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # share of the extrapolated (unscaled) frequency
        return extrapolation / self.factor * (1 - keep) + extrapolation * keep


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """Mixture of experts: `sparse_layers[i]` says whether layer i uses experts."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702

    @property
    def clamped_swiglu(self) -> bool:
        """gpt-oss's expert activation: (clamp(up) + 1) * g * sigmoid(alpha * g), g clamped."""
        return self.swiglu_limit is not None


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
    qk_norm_per_head: bool = True
    sinks: bool = False
    max_positions: int = 8192
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
        if min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads) < 1:
            raise ValueError("hidden_size, layers and heads must be >= 1")
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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def rope_of(self, kind: LayerKind) -> RopeConfig:
        """The rotary parameters of a layer kind (Gemma's sliding layers have their own)."""
        return self.local_rope if kind == "sliding" and self.local_rope else self.rope

    def is_sparse(self, layer: int) -> bool:
        return self.moe is not None and self.moe.sparse_layers[layer]


def load_config(folder: str | Path) -> ModelConfig:
    """Read `<folder>/config.json` and translate it."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    return parse_config(json.loads(path.read_text()))


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Translate a Hugging Face config dict into a `ModelConfig` (raises on unsupported ones,
    and on keys that are neither read nor known to be harmless)."""
    model_type = str(raw.get("model_type", ""))
    if model_type not in _PARSERS:
        raise ValueError(f"unsupported model_type {model_type!r}; known: {sorted(_PARSERS)}")
    reader = _Reader(raw)
    config = _PARSERS[model_type](reader)
    reader.check_all_read()
    return config


# Keys that never change inference math: metadata, training-only knobs, generation defaults.
_HARMLESS = frozenset(
    (
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "_name_or_path",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "initializer_range",
        "use_cache",
        "attention_dropout",
        "hidden_dropout",
        "resid_pdrop",
        "embd_pdrop",
        "dropout",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "aux_loss_alpha",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "tie_encoder_decoder",
        "problem_type",
        "id2label",
        "label2id",
        "task_specific_params",
        "auto_map",
        "cache_implementation",
        "attn_implementation",
        "_attn_implementation_autoset",
        "use_return_dict",
        "tokenizer_class",
    )
)


class _Reader:
    """A config dict that remembers which keys were read (the rest must be harmless)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.raw.get(key)
        return default if value is None else value

    def has(self, key: str) -> bool:
        self.read.add(key)
        return self.raw.get(key) is not None

    def require(self, key: str) -> Any:
        self.read.add(key)
        if self.raw.get(key) is None:
            raise ValueError(f"config.json lacks {key!r}")
        return self.raw[key]

    def expect(self, key: str, allowed: tuple[Any, ...]) -> None:
        """A key that changes the math: only the listed values (or absence) are supported."""
        value = self.get(key)
        if value is not None and value not in allowed:
            raise ValueError(f"unsupported {key}={value!r} (supported: {allowed})")

    def check_all_read(self) -> None:
        unknown = sorted(set(self.raw) - self.read - _HARMLESS)
        if unknown:
            raise ValueError(
                f"config.json has fields Resin does not understand for model_type "
                f"{self.raw.get('model_type')!r}: {unknown} (they may change the model's math)"
            )


def _common(raw: _Reader, eps_key: str = "rms_norm_eps", eps: float = 1e-6) -> dict[str, Any]:
    heads = int(raw.require("num_attention_heads"))
    hidden = int(raw.require("hidden_size"))
    eos = raw.raw.get("eos_token_id")
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos])
    )
    raw.expect("pretraining_tp", (1,))
    raw.expect("partial_rotary_factor", (1.0, 1))
    raw.expect("hidden_act", ("silu", "gelu_pytorch_tanh", "gelu"))
    raw.expect("hidden_activation", ("gelu_pytorch_tanh", "gelu", "silu"))
    bos = raw.raw.get("bos_token_id")
    return {
        "model_type": str(raw.require("model_type")),
        "vocab_size": int(raw.require("vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(raw.get("intermediate_size", 0)),
        "num_layers": int(raw.require("num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": int(raw.get("num_key_value_heads", heads)),
        "head_dim": int(raw.get("head_dim", hidden // heads)),
        "norm_eps": float(raw.get(eps_key, eps)),
        "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "hidden_act": str(raw.get("hidden_act") or raw.get("hidden_activation") or "silu"),
        "max_positions": int(raw.get("max_position_embeddings", 8192)),
        "eos_token_ids": eos_ids,
        "bos_token_id": int(bos) if isinstance(bos, int) else None,
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
    if kind == "yarn":
        factor = float(params["factor"])
        if params.get("mscale") or params.get("mscale_all_dim"):
            raise ValueError("yarn with mscale / mscale_all_dim is not supported")
        attention = params.get("attention_factor")
        return RopeConfig(
            theta=theta,
            kind="yarn",
            factor=factor,
            original_max_position=int(params["original_max_position_embeddings"]),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=float(attention)
            if attention is not None
            else (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0),
        )
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)")


def _global_rope(raw: _Reader, theta: float = 10000.0) -> RopeConfig:
    # Newer configs say rope_parameters, older ones rope_scaling (both may be present).
    parameters, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    params = parameters or scaling
    return _rope(params, float(raw.get("rope_theta", theta)))


def _layer_types(raw: _Reader, default: list[str]) -> tuple[LayerKind, ...]:
    names = raw.get("layer_types") or default
    unknown = set(names) - set(_LAYER_KINDS)
    if unknown:
        raise ValueError(f"unsupported layer types {sorted(unknown)}")
    return tuple(_LAYER_KINDS[n] for n in names)


def _llama(raw: _Reader) -> ModelConfig:
    model_type = str(raw.get("model_type"))
    common = _common(raw)
    window = raw.get("sliding_window")
    use_window = bool(raw.get("use_sliding_window", model_type == "mistral"))
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and use_window:
        layers = int(raw.get("max_window_layers", common["num_layers"]))
        if layers < common["num_layers"]:
            raise ValueError("Qwen sliding window on only some layers is not supported")
    raw.get("max_window_layers")
    sliding = window is not None and use_window
    n = common["num_layers"]
    types = _layer_types(raw, ["sliding_attention" if sliding else "full_attention"] * n)
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **common,
        rope=_global_rope(raw),
        layer_types=types,
        # Qwen2 hard-codes a q/k/v bias (and no o bias); Llama/Qwen3 follow attention_bias.
        qkv_bias=bias or model_type == "qwen2",
        o_bias=bias and model_type != "qwen2",
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=int(window) if window and "sliding" in types else None,
    )


def _qwen3_moe(raw: _Reader) -> ModelConfig:
    base = _llama(raw)
    experts, local_experts = raw.get("num_experts"), raw.get("num_local_experts")
    num_experts = int(experts or local_experts or 0)
    step = int(raw.get("decoder_sparse_step", 1))
    dense = set(raw.get("mlp_only_layers") or [])
    sparse = tuple(
        i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(base.num_layers)
    )
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=int(raw.require("num_experts_per_tok")),
        intermediate_size=int(raw.require("moe_intermediate_size")),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )
    return replace(base, moe=moe)


def _gpt_oss(raw: _Reader) -> ModelConfig:
    common = _common(raw, eps=1e-5)
    common["max_positions"] = int(raw.get("max_position_embeddings", 131072))
    n = common["num_layers"]
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
    parameters, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    params = parameters or scaling or yarn
    bias = bool(raw.get("attention_bias", True))
    local_experts, experts = raw.get("num_local_experts"), raw.get("num_experts")
    num_experts = int(local_experts or experts or 128)
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=int(raw.get("num_experts_per_tok", 4)),
        intermediate_size=common["intermediate_size"] or 2880,
        norm_topk_prob=True,  # softmax over the top-k router logits
        sparse_layers=(True,) * n,
        router_bias=True,
        expert_bias=True,
        swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
    )
    return ModelConfig(
        **common,
        rope=_rope(params, float(raw.get("rope_theta", 150000.0))),
        layer_types=_layer_types(raw, default),
        qkv_bias=bias,
        o_bias=bias,
        sinks=True,
        sliding_window=int(raw.get("sliding_window", 128)),
        moe=moe,
    )


def _olmo2(raw: _Reader) -> ModelConfig:
    common = _common(raw, eps=1e-5)
    n = common["num_layers"]
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **common,
        rope=_global_rope(raw),
        layer_types=_layer_types(raw, ["full_attention"] * n),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_per_head=False,  # one norm over all heads' q (and all of k)
    )


def _gemma3(raw: _Reader) -> ModelConfig:
    common = _common(raw)
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        rope = _rope(params.get("full_attention"), 1_000_000.0)
        local = _rope(params.get("sliding_attention"), 10_000.0)
        for key in ("rope_scaling", "rope_theta", "rope_local_base_freq"):
            raw.get(key)  # older spellings of the same values; rope_parameters wins
    else:  # older configs: rope_theta + rope_scaling for global layers, a local base frequency
        rope = _rope(raw.get("rope_scaling"), float(raw.get("rope_theta", 1_000_000.0)))
        local = RopeConfig(theta=float(raw.get("rope_local_base_freq", 10_000.0)))
    if raw.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma 3 attention is not supported")
    # `layer_types` wins when present; the pattern is the older way to say the same thing.
    pattern, derived = raw.get("sliding_window_pattern"), raw.get("_sliding_window_pattern")
    pattern = int(pattern or derived or 6)
    default = [
        "sliding_attention" if (i + 1) % pattern else "full_attention"
        for i in range(common["num_layers"])
    ]
    softcap = raw.get("final_logit_softcapping")
    attn_softcap = raw.get("attn_logit_softcapping")
    common["tie_embeddings"] = bool(raw.get("tie_word_embeddings", True))
    common["max_positions"] = int(raw.get("max_position_embeddings", 131072))
    return ModelConfig(
        **common,
        rope=rope,
        local_rope=local,
        layer_types=_layer_types(raw, default),
        qkv_bias=bool(raw.get("attention_bias", False)),
        o_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        sliding_window=int(raw.get("sliding_window", 4096)),
        attn_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        embed_scale=math.sqrt(common["hidden_size"]),
        final_logit_softcapping=float(softcap) if softcap else None,
        attn_logit_softcapping=float(attn_softcap) if attn_softcap else None,
    )


def _lfm2(raw: _Reader) -> ModelConfig:
    common = _common(raw, eps_key="norm_eps", eps=1e-5)
    ff = int(raw.get("block_ff_dim") or raw.require("intermediate_size"))
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
    for key in ("block_dim", "block_mlp_init_scale", "block_out_init_scale", "block_norm_eps",
                "block_use_swiglu", "block_use_xavier_init", "conv_dim", "conv_dim_out",
                "conv_use_xavier_init", "num_heads", "theta", "use_pos_enc"):  # fmt: skip
        raw.get(key)  # duplicates of read fields or training-only knobs
    n = common["num_layers"]
    full = set(raw.get("full_attn_idxs") or range(n))
    default = ["full_attention" if i in full else "conv" for i in range(n)]
    return ModelConfig(
        **common,
        rope=_global_rope(raw, float(raw.get("theta", 1_000_000.0))),
        layer_types=_layer_types(raw, default),
        qk_norm=True,
        conv_kernel=int(raw.get("conv_L_cache", 3)),
        conv_bias=bool(raw.get("conv_bias", False)),
    )


_PARSERS: dict[str, Callable[[_Reader], ModelConfig]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3_moe": _qwen3_moe,
    "gemma3_text": _gemma3,
    "lfm2": _lfm2,
    "gpt_oss": _gpt_oss,
    "olmo2": _olmo2,
}
