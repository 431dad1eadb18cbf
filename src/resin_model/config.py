"""The one typed model config of both runner families (`ModelConfig`, `RopeConfig`,
`MoeConfig`). `resin_models_torch` (reference) and `resin_models_cuda` (fast) read these fields
only; `hf_config.py` translates a checkpoint's `config.json` into them, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from resin_model.quant_config import QuantConfig

LayerKind = Literal["full", "sliding", "conv", "linear"]
RopeKind = Literal["default", "linear", "llama3", "yarn"]


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
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # DeepSeek: experts split into `num_groups` groups; a token first keeps its `topk_groups`
    # best groups (group score: best expert for softmax scoring, sum of the best two for
    # sigmoid), then its top_k experts among them; weights are then multiplied by
    # `routed_scale`. `score_bias`: V3's e_score_correction_bias (biases the choice only).
    num_groups: int = 1
    topk_groups: int = 1
    routed_scale: float = 1.0
    score_bias: bool = False
    shared_intermediate_size: int = 0

    @property
    def clamped_swiglu(self) -> bool:
        """gpt-oss's expert activation: (clamp(up) + 1) * g * sigmoid(alpha * g), g clamped."""
        return self.swiglu_limit is not None


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """The vision tower of a multimodal checkpoint (`kind` names the family's tower).

    `image_token_id` is the placeholder the prompt repeats once per image token;
    `tokens_per_image` is fixed for Gemma 3 (0: dynamic resolution). Qwen2.5-VL also uses
    `merge_size`, `temporal_patch_size`, `window_size` (pixels), `full_layers` (blocks with
    full instead of windowed attention), `out_hidden_size` and the text side's `mrope_section`."""

    kind: Literal["siglip", "qwen2_5_vl"]
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    image_token_id: int
    hidden_act: str = "gelu_pytorch_tanh"
    norm_eps: float = 1e-6
    image_size: int = 0
    tokens_per_image: int = 0
    merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 0
    full_layers: tuple[int, ...] = ()
    out_hidden_size: int = 0
    rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LinearAttentionConfig:
    """Gated DeltaNet linear attention (Qwen3.5's "linear_attention" layers): q/k with
    `num_k_heads` heads of `k_head_dim`, v with `num_v_heads` of `v_head_dim` (q/k heads are
    shared by `num_v_heads // num_k_heads` value heads), a depthwise causal conv of
    `conv_kernel` over q|k|v. A layer's state is the conv's last `conv_kernel - 1` inputs plus
    a float32 recurrent matrix [num_v_heads, k_head_dim, v_head_dim]."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim


@dataclass(frozen=True, slots=True)
class Glm5NextConfig:
    """GLM-5.3-Flash's specifics (`hf_glm5_next.py`): its "full" layers are indexed MLA
    (`ModelConfig.mla`, NoPE) whose DSA indexer (`index_heads` x `index_head_dim`, no rotary)
    scores pools of `index_kpool` tokens and keeps the best `index_topk / index_kpool` plus
    the incomplete tail pool; its "linear" layers are KDA (`ModelConfig.linear_attention`) with
    a per-channel forget gate bounded below by `gate_lower_bound` (None: softplus form).
    `swiglu_limit` clamps every SwiGLU (gate above, up both sides); the residual is `hc_mult`
    streams mixed by mHC (`hc_iterations` Sinkhorn rounds, `hc_eps`)."""

    index_heads: int
    index_head_dim: int
    index_topk: int
    index_kpool: int
    gate_lower_bound: float | None
    swiglu_limit: float
    hc_mult: int
    hc_iterations: int
    hc_eps: float


@dataclass(frozen=True, slots=True)
class MlaConfig:
    """DeepSeek's multi-head latent attention: queries through an optional low-rank
    `q_lora_rank`; keys and values from one per-token latent of `kv_lora_rank` (normed) plus a
    shared `rope_dim` rotary key, which is all the cache keeps."""

    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def latent_dim(self) -> int:
        """Cached values per token per layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.rope_dim


AttentionKind = Literal["sliding", "csa", "hca"]


@dataclass(frozen=True, slots=True)
class DeepseekV4Config:
    """DeepSeek-V4's attention, routing and residual specifics (`hf_deepseek_v4.py` reads
    them). Every layer attends over a raw window of `ModelConfig.sliding_window` tokens
    (shared K=V, one head of `head_dim`, rotary on the trailing `rope_dim`); `attention[i]`
    adds compressed entries: "csa" one per `csa_ratio` tokens from overlapping windows,
    chosen per query by the indexer (`index_*`), "hca" one per `hca_ratio` tokens, all read.
    Sliding-only layers rotate with `ModelConfig.rope`, the others with `compress_rope`.
    `hash_layers[i]`: layer i picks its experts from a token-id table. `swiglu_limit` clamps
    the SwiGLU gate (above) and up (both sides) of every expert. The residual is `hc_mult`
    streams mixed by mHC (`hc_iterations` Sinkhorn rounds, `hc_eps`)."""

    attention: tuple[AttentionKind, ...]
    hash_layers: tuple[bool, ...]
    csa_ratio: int
    hca_ratio: int
    q_lora_rank: int
    rope_dim: int
    compress_rope: RopeConfig
    o_groups: int
    o_lora_rank: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_iterations: int
    hc_eps: float
    swiglu_limit: float

    def ratio(self, layer: int) -> int:
        """Tokens per compressed entry of `layer` (0: sliding only)."""
        kind = self.attention[layer]
        return 0 if kind == "sliding" else self.csa_ratio if kind == "csa" else self.hca_ratio


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
    vision: VisionConfig | None = None
    mla: MlaConfig | None = None
    num_mtp_layers: int = 0
    partial_rotary_factor: float = 1.0
    deepseek_v4: DeepseekV4Config | None = None
    quant: QuantConfig | None = None  # how the checkpoint stores its weights (quant_config.py)
    linear_attention: LinearAttentionConfig | None = None  # layers of kind "linear"
    glm5_next: Glm5NextConfig | None = None

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
        if "linear" in self.layer_types:
            linear = self.linear_attention
            if linear is None or linear.conv_kernel < 2:
                raise ValueError("linear_attention layers need their dims and a conv kernel >= 2")
            if linear.num_v_heads % linear.num_k_heads:
                raise ValueError("linear_num_value_heads must be a multiple of the key heads")

    @property
    def scale(self) -> float:
        """Attention score scale (Gemma uses query_pre_attn_scalar instead of head_dim)."""
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that rotary rotates (GLM-4.5: half); the rest pass."""
        return int(self.head_dim * self.partial_rotary_factor)

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
