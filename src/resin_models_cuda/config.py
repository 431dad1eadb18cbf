"""Typed model configs for the CUDA runners, translated once from a Hugging Face config.json.

Model code reads `ModelConfig` fields only; it never looks at a raw config dict. `PRESETS` holds
the shapes the benchmark builds with random weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from resin_models_cuda.kernels.rope import RopeScaling

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer of the Llama family, optionally with a Qwen3-MoE MLP.

    Invariants: `num_heads % num_kv_heads == 0`; `head_dim` is a power of two (the attention
    kernels need it); `num_experts == 0` means a dense MLP of `intermediate_size`.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_positions: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim & (self.head_dim - 1):
            raise ValueError(f"head_dim {self.head_dim} must be a power of two")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def param_counts(self) -> tuple[int, int]:
        """(non-embedding parameters read per token at batch 1, all non-embedding parameters).

        For a dense model both are equal; an MoE reads `experts_per_token` of its experts.
        """
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        if self.is_moe:
            expert = 3 * self.hidden_size * self.moe_intermediate_size
            router = self.hidden_size * self.num_experts
            active = attn + router + self.experts_per_token * expert
            total = attn + router + self.num_experts * expert
        else:
            active = total = attn + 3 * self.hidden_size * self.intermediate_size
        head = self.vocab_size * self.hidden_size
        return self.num_layers * active + head, self.num_layers * total + head

    def weight_bytes_read(self, batch: int, dtype_bytes: int = 2) -> int:
        """Weight bytes one decode step of `batch` tokens must read: all of a dense model; for
        an MoE the shared part plus the experts that uniform routing touches on average,
        E * (1 - (1 - k/E) ** batch) per layer."""
        active, total = self.param_counts()
        if not self.is_moe:
            return total * dtype_bytes
        expert = 3 * self.hidden_size * self.moe_intermediate_size
        shared = active - self.num_layers * self.experts_per_token * expert
        touched = self.num_experts * (1 - (1 - self.experts_per_token / self.num_experts) ** batch)
        return int((shared + self.num_layers * touched * expert) * dtype_bytes)

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Translate a Hugging Face `config.json` dict (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE)."""
        model_type = str(raw.get("model_type", "llama"))
        if model_type not in (*LLAMA_FAMILY, "qwen3_moe"):
            raise ValueError(f"unsupported model_type {model_type!r}")
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        scaling = None
        if rope.get("rope_type", rope.get("type")) == "llama3":
            scaling = RopeScaling(
                float(rope["factor"]),
                float(rope["low_freq_factor"]),
                float(rope["high_freq_factor"]),
                int(rope["original_max_position_embeddings"]),
            )
        window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw.get("intermediate_size", 0)),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_positions=int(raw.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            sliding_window=int(window or 0) if model_type in ("mistral", "qwen2") else 0,
            num_experts=int(raw.get("num_experts", 0)) if model_type == "qwen3_moe" else 0,
            experts_per_token=int(raw.get("num_experts_per_tok", 0)),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        )

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face config dict for the same model (for the transformers baseline)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope = {
                "rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_positions,
            }  # fmt: skip
        out: dict[str, Any] = {
            "model_type": self.model_type, "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_parameters": rope,
            "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
        }  # fmt: skip
        if self.sliding_window:
            out.update(sliding_window=self.sliding_window, use_sliding_window=True,
                       max_window_layers=self.num_layers)  # fmt: skip
        if self.is_moe:
            out.update(
                num_experts=self.num_experts, num_experts_per_tok=self.experts_per_token,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
            )  # fmt: skip
        return out


_LLAMA_8B = ModelConfig(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
    rope_theta=500000.0, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), max_positions=131072,
)  # fmt: skip

PRESETS: dict[str, ModelConfig] = {
    "llama-8b": _LLAMA_8B,
    "qwen3-8b": replace(
        _LLAMA_8B,
        model_type="qwen3",
        vocab_size=151936,
        intermediate_size=12288,
        num_layers=36,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        rope_scaling=None,
        qk_norm=True,
        max_positions=40960,
    ),
    "qwen3-30b-a3b": ModelConfig(
        model_type="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_positions=40960,
        qk_norm=True,
        num_experts=128,
        experts_per_token=8,
        moe_intermediate_size=768,
    ),
    "llama-1b": replace(
        _LLAMA_8B,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "tiny": ModelConfig(
        model_type="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_positions=512,
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {sorted(PRESETS)}") from None
