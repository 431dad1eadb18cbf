"""DeepSeek V2 / V2-Lite / V3 on the fast layer library: multi-head latent attention over the
latent cache (`layers/mla.py`: absorbed decode, expanded prefill), dense first
`first_k_dense_replace` layers, then the library MoE with DeepSeek's grouped routing (softmax or
sigmoid scores, V3's correction bias, `routed_scaling_factor`: the router kernel) and the shared
experts folded into the expert stack as always-chosen experts (FP8 stacks stay FP8), the
router weight and correction bias read in float32. With `BuildOptions.mtp` the checkpoint's
first MTP layer is loaded too (`FastMtp`, cached as one more layer of the latent group) and
`mtp_forward` runs it; without it MTP layers are not read."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from resin_model.config import ModelConfig
from resin_models_cuda.layers import GatedMLP, MoE, RMSNorm, Rotary, WeightSource
from resin_models_cuda.layers import activation_of as activation
from resin_models_cuda.layers.mla import MlaAttention, prefill_rows
from resin_models_cuda.layers.quantized import float32_tensor
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import LlamaLayer, qwen_experts
from resin_models_cuda.step import LayerSlot, StepTensors


def deepseek_moe(
    config: ModelConfig, weights: WeightSource, prefix: str, options: BuildOptions
) -> MoE:
    """DeepSeek-V2/V3's MoE at `prefix` (`...mlp.`): routed experts, the router and V3's
    correction bias in float32 (as transformers keeps them: read without rounding to the
    model's dtype where the source can), the shared experts folded in as always-chosen
    experts. GLM-4.5 builds its MoE here as well."""
    moe = config.moe
    assert moe is not None
    hidden = config.hidden_size
    experts = qwen_experts(config, weights, prefix)
    router = float32_tensor(weights, f"{prefix}gate.weight", (moe.num_experts, hidden))
    experts = replace(experts, router=router)
    if moe.score_bias:
        name = f"{prefix}gate.e_score_correction_bias"
        bias = float32_tensor(weights, name, (moe.num_experts,), "zeros")
        experts = replace(experts, score_bias=bias)
    if moe.shared_intermediate_size:  # n_shared_experts x the expert width, by definition
        inner = moe.shared_intermediate_size
        name = f"{prefix}shared_experts."
        shared = GatedMLP(weights, name, hidden, inner, config.hidden_act)
        experts = experts.with_shared(shared.gate_up.weight, shared.down.weight)
    pairs = options.moe_gemv_max_pairs
    return MoE(moe, experts, activation(config.hidden_act), pairs, fp32_router=True)


class FastMtp:
    """One MTP module (DeepSeek-V3, section 2.2), as the reference `MtpLayer`:
    `eh_proj([enorm(embedding of token i+1) ; hnorm(final hidden state at i)])`, a decoder
    layer (MLA over its own cache layer, the MoE), then `shared_head.norm`; the model's LM
    head turns the result into logits that predict token i+2. The checkpoint's copies of the
    embedding and LM head are not read (the model's own are the same tensors)."""

    def __init__(
        self, config: ModelConfig, weights: WeightSource, options: BuildOptions, rope: Rotary
    ) -> None:
        n, hidden, eps = config.num_layers, config.hidden_size, config.norm_eps
        prefix = f"model.layers.{n}."
        self.enorm = RMSNorm(weights, f"{prefix}enorm.weight", hidden, eps)
        self.hnorm = RMSNorm(weights, f"{prefix}hnorm.weight", hidden, eps)
        self.eh_proj = weights.get(f"{prefix}eh_proj.weight", (hidden, 2 * hidden))
        slot = LayerSlot(0, n)  # one more layer of the latent group
        attention = MlaAttention(config, weights, f"{prefix}self_attn.", slot, rope)
        moe = deepseek_moe(config, weights, f"{prefix}mlp.", options)  # MTP layers are sparse
        self.layer = LlamaLayer(config, weights, prefix, attention, moe)
        self.norm = RMSNorm(weights, f"{prefix}shared_head.norm.weight", hidden, eps)


class Deepseek(FastModel):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        if config.mla is None or config.moe is None:
            raise ValueError("deepseek models need MLA and MoE configs")
        super().__init__(config, weights, options)
        self.mla = config.mla
        positions = min(options.max_positions, config.max_positions) + 1
        self.rope = Rotary(config.rope, config.mla.rope_dim, positions, self.device)
        self.layers = [
            LlamaLayer(
                config,
                weights,
                f"model.layers.{layer}.",
                MlaAttention(
                    config,
                    weights,
                    f"model.layers.{layer}.self_attn.",
                    self.slots[layer],
                    self.rope,
                ),
                self.make_mlp(weights, layer),
            )
            for layer in range(config.num_layers)
        ]
        self.mtp: FastMtp | None = None
        if options.mtp:
            if not config.num_mtp_layers:
                raise ValueError(f"{config.model_type}: the checkpoint has no MTP layers")
            self.mtp = FastMtp(config, weights, options, self.rope)
            self.layers_per_group = (self.layers_per_group[0] + 1,)

    def cache_token_shape(self) -> tuple[int, int, int]:
        return 1, 1, self.mla.latent_dim  # one latent per token per layer

    def make_mlp(self, weights: WeightSource, layer: int) -> GatedMLP | MoE:
        config, prefix = self.config, f"model.layers.{layer}.mlp."
        if not config.is_sparse(layer):
            hidden, inner = config.hidden_size, config.intermediate_size
            return GatedMLP(weights, prefix, hidden, inner, config.hidden_act)
        return deepseek_moe(config, weights, prefix, self.options)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        rows = prefill_rows(step)
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for index, layer in enumerate(self.layers):
            if index > 0:
                x, residual = layer.input_norm(x, residual)
            x = layer.attn(x, step, kv, rows)
            x, residual = layer.post_norm(x, residual)
            x = layer.mlp(x)
        x, residual = self.final_norm(x, residual)
        return x

    def mtp_forward(
        self, ids: torch.Tensor, previous: torch.Tensor, step: StepTensors, kv: torch.Tensor
    ) -> torch.Tensor:
        """The MTP layer on (token `ids[t]`, final hidden state `previous[t]`) pairs at the
        step's positions, writing its cache layer at the step's append slots: [T, hidden]
        whose `logits` are drafts one past the main model's tokens."""
        mtp = self.mtp
        if mtp is None:
            raise RuntimeError("the model was built without its MTP layer (BuildOptions.mtp)")
        joined = torch.cat((mtp.enorm(self.embed_tokens(ids)), mtp.hnorm(previous)), dim=-1)
        residual = F.linear(joined, mtp.eh_proj)
        layer = mtp.layer
        x = layer.attn(layer.input_norm(residual), step, kv, prefill_rows(step))
        x, residual = layer.post_norm(x, residual)
        x, _ = mtp.norm(layer.mlp(x), residual)
        return x
