"""Reading a Hugging Face `config.json` dict: the `Reader` that records which keys were read
(so `hf_config.parse_config` can refuse unknown ones), the keys known to be harmless, and the
parts every architecture shares (sizes, norms, RoPE variants, layer types)."""

from __future__ import annotations

import math
from typing import Any

from resin_model.config import LayerKind, RopeConfig

LAYER_KINDS: dict[str, LayerKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "conv": "conv",
    "linear_attention": "linear",
}


# Keys that never change inference math: metadata, training-only knobs, generation defaults.
HARMLESS = frozenset(
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


class Reader:
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

    def integer(
        self, key: str, default: int | None = None, low: int = 1, high: int = 1 << 30
    ) -> int:
        """An integer field in `[low, high]` (a float, even a whole one, or a bool is refused:
        `hidden_size: 64.5` must not become 64); `default` when absent (required if None)."""
        value = self.require(key) if default is None else self.get(key, default)
        if isinstance(value, float) and value.is_integer() and abs(value) < 1 << 53:
            value = int(value)  # `4096.0`, as some exporters write: exact
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"config.json {key}={value!r} is not an integer")
        if not low <= value <= high:
            raise ValueError(f"config.json {key}={value} is outside [{low}, {high}]")
        return value

    def expect(self, key: str, allowed: tuple[Any, ...]) -> None:
        """A key that changes the math: only the listed values (or absence) are supported."""
        value = self.get(key)
        if value is not None and value not in allowed:
            raise ValueError(f"unsupported {key}={value!r} (supported: {allowed})")

    def check_all_read(self) -> None:
        unknown = sorted(set(self.raw) - self.read - HARMLESS)
        if unknown:
            raise ValueError(
                f"config.json has fields Resin does not understand for model_type "
                f"{self.raw.get('model_type')!r}: {unknown} (they may change the model's math)"
            )


MAX_WIDTH = 1 << 20
"""The largest hidden / intermediate size / head dim a config may declare (today's largest
models use tens of thousands)."""
MAX_HEADS = 1 << 12
MAX_LAYERS = 1 << 12
MAX_VOCAB = 1 << 24


def common_fields(
    raw: Reader, eps_key: str = "rms_norm_eps", eps: float = 1e-6, partial_rotary: bool = False
) -> dict[str, Any]:
    """Sizes, norms, activation and token ids every architecture shares; `partial_rotary`:
    the caller reads `partial_rotary_factor` itself (else only 1 is accepted)."""
    heads = raw.integer("num_attention_heads", high=MAX_HEADS)
    hidden = raw.integer("hidden_size", high=MAX_WIDTH)
    eos = raw.raw.get("eos_token_id")
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos])
    )
    raw.expect("pretraining_tp", (1,))
    if not partial_rotary:
        raw.expect("partial_rotary_factor", (1.0, 1))
        expect_rope_parameter(raw, "partial_rotary_factor", (1.0, 1))
    raw.expect("hidden_act", ("silu", "gelu_pytorch_tanh", "gelu"))
    raw.expect("hidden_activation", ("gelu_pytorch_tanh", "gelu", "silu"))
    bos = raw.raw.get("bos_token_id")
    return {
        "model_type": str(raw.require("model_type")),
        "vocab_size": raw.integer("vocab_size", high=MAX_VOCAB),
        "hidden_size": hidden,
        "intermediate_size": raw.integer("intermediate_size", 0, low=0, high=MAX_WIDTH),
        "num_layers": raw.integer("num_hidden_layers", high=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": raw.integer("num_key_value_heads", heads, high=MAX_HEADS),
        "head_dim": raw.integer("head_dim", max(1, hidden // heads), high=MAX_WIDTH),
        "norm_eps": float(raw.get(eps_key, eps)),
        "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "hidden_act": str(raw.get("hidden_act") or raw.get("hidden_activation") or "silu"),
        "max_positions": raw.integer("max_position_embeddings", 8192, high=1 << 30),
        "eos_token_ids": eos_ids,
        "bos_token_id": int(bos) if isinstance(bos, int) else None,
    }


# Every key a `rope_parameters` / `rope_scaling` dict may hold; any other one may change the
# math (transformers 5 nests `partial_rotary_factor` here), so it is refused like a top-level one.
ROPE_KEYS = frozenset(
    ("rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
     "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
     "attention_factor", "mscale", "mscale_all_dim", "partial_rotary_factor")
)  # fmt: skip


def rope_parameters(raw: Reader) -> dict[str, Any]:
    """The config's rotary parameters dict (`rope_parameters`, else `rope_scaling`), or {}."""
    params = raw.raw.get("rope_parameters") or raw.raw.get("rope_scaling") or {}
    return dict(params) if isinstance(params, dict) else {}


def expect_rope_parameter(raw: Reader, key: str, allowed: tuple[Any, ...]) -> None:
    """`Reader.expect` for a key nested in the rotary parameters."""
    value = rope_parameters(raw).get(key)
    if value is not None and value not in allowed:
        raise ValueError(f"unsupported rope_parameters.{key}={value!r} (supported: {allowed})")


def rope_config(params: dict[str, Any] | None, theta: float) -> RopeConfig:
    params = dict(params or {})
    unknown = sorted(set(params) - ROPE_KEYS)
    if unknown:
        raise ValueError(
            f"rope parameters Resin does not understand: {unknown} (they may change the math)"
        )
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
        attention = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if attention is None and mscale and mscale_all_dim:  # DeepSeek's ratio of two mscales
            attention = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, mscale_all_dim)
        return RopeConfig(
            theta=theta,
            kind="yarn",
            factor=factor,
            original_max_position=int(params["original_max_position_embeddings"]),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=float(attention) if attention is not None else yarn_mscale(factor),
        )
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction `0.1 * mscale * ln(factor) + 1` (1 when not stretched)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def global_rope(raw: Reader, theta: float = 10000.0) -> RopeConfig:
    # Newer configs say rope_parameters, older ones rope_scaling (both may be present).
    parameters, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    params = parameters or scaling
    return rope_config(params, float(raw.get("rope_theta", theta)))


def layer_types(raw: Reader, default: list[str]) -> tuple[LayerKind, ...]:
    names = raw.get("layer_types") or default
    unknown = set(names) - set(LAYER_KINDS)
    if unknown:
        raise ValueError(f"unsupported layer types {sorted(unknown)}")
    return tuple(LAYER_KINDS[n] for n in names)
