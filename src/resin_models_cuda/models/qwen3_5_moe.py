"""Qwen3.5 MoE (`qwen3_5_moe`, text path) on the fast layer library: three Gated DeltaNet
linear-attention layers per gated full-attention layer (the config's `layer_types`), every
layer a softmax top-k MoE with a sigmoid-gated shared expert; zero-centred RMS norms.

- Linear attention: one fused projection `[qkv | z | b | a]`, the causal conv1d over q|k|v
  with its state (`kernels/conv1d.py`), the gated delta rule (`kernels/delta_rule.py`: l2 norms,
  decay and beta computed inside), the gated RMS norm (`kernels/gated_rmsnorm.py`), out_proj.
  Every linear layer's state lives in one page of the State region per checkpoint: per layer
  the float32 recurrent matrices [HV, K, V], then the conv's last K-1 inputs [C, K-1] in the
  model dtype, rounded up to 16 bytes (the reference runner's `LinearStateSpec` layout).
- Full attention: q_proj emits each head's query and its output gate side by side; per-head
  (1 + w) q/k norms, partial rotary and the KV append fused in one kernel, paged attention, the
  output times sigmoid(gate), o_proj (History group).
- MoE: the router kernel's top-k; the shared expert rides along as always-chosen experts whose
  weight is sigmoid(shared_expert_gate(x)) (when its width is a multiple of the experts'),
  else it runs as its own gated MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resin_model.config import LinearAttentionConfig, ModelConfig
from resin_models_cuda.kernels import PagedKV, decode_attention, prefill_attention
from resin_models_cuda.kernels.conv1d import causal_conv1d, conv_state_store
from resin_models_cuda.kernels.delta_rule import gated_delta_rule
from resin_models_cuda.kernels.gated_rmsnorm import gated_rmsnorm
from resin_models_cuda.kernels.router import router_topk
from resin_models_cuda.layers import GatedMLP, MoE, RMSNorm, Rotary, WeightSource, activation_of
from resin_models_cuda.layers.quantized import linear
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import qwen_experts
from resin_models_cuda.step import DecodeInfo, LayerSlot, PrefillInfo, StepTensors


def state_layer_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one linear layer's checkpoint (module docstring)."""
    lin = config.linear_attention
    assert lin is not None
    recurrent = 4 * lin.num_v_heads * lin.k_head_dim * lin.v_head_dim
    conv = lin.conv_channels * (lin.conv_kernel - 1) * dtype.itemsize
    return -(-(recurrent + conv) // 16) * 16


def state_views(
    lin: LinearAttentionConfig, offset: int, region: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv [pages, C, K-1] in `dtype`, recurrent float32 [pages, HV, K, V]): the views of
    the State region of the linear layer whose checkpoint starts at byte `offset`."""
    pages = region.shape[0]
    rec_end = offset + 4 * lin.num_v_heads * lin.k_head_dim * lin.v_head_dim
    width = lin.conv_kernel - 1
    conv_end = rec_end + lin.conv_channels * width * dtype.itemsize
    recurrent = region[:, offset:rec_end].view(torch.float32)
    conv = region[:, rec_end:conv_end].view(dtype)
    shape = (lin.num_v_heads, lin.k_head_dim, lin.v_head_dim)
    return conv.view(pages, lin.conv_channels, width), recurrent.view(pages, *shape)


class GatedDeltaNet:
    """`prefix` is the layer's `...linear_attn.`; `index` its place among the linear layers.
    Prefill steps run the chunked delta-rule kernel, `prefill_chunk` tokens a chunk (16, 32
    or 64; 0: the recurrent kernel, which decode always runs); float32 layers 32 tokens,
    since their exact float32 products spill at 64 (docs/benchmarks.md)."""

    prefill_chunk = 64

    def __init__(self, config: ModelConfig, w: WeightSource, prefix: str, index: int) -> None:
        lin = config.linear_attention
        assert lin is not None
        self.lin, self.eps = lin, config.norm_eps
        hidden, heads = config.hidden_size, lin.num_v_heads
        channels, value_dim = lin.conv_channels, lin.num_v_heads * lin.v_head_dim
        names = [f"{prefix}in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")]
        shapes = [(channels, hidden), (value_dim, hidden), (heads, hidden), (heads, hidden)]
        self.in_proj = linear(w, names, shapes)
        self.conv = w.get(f"{prefix}conv1d.weight", (channels, 1, lin.conv_kernel))[:, 0]
        self.conv = self.conv.contiguous()
        self.a_log = w.get(f"{prefix}A_log", (heads,), "zeros", dtype=torch.float32)
        self.dt_bias = w.get(f"{prefix}dt_bias", (heads,), "ones", dtype=torch.float32)
        self.norm = w.get(f"{prefix}norm.weight", (lin.v_head_dim,), "ones")
        self.out_proj = linear(w, [f"{prefix}out_proj.weight"], [(hidden, value_dim)], "out")
        self.offset = index * state_layer_bytes(config, w.dtype)

    def state_views(self, region: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return state_views(self.lin, self.offset, region, dtype)

    def __call__(self, x: torch.Tensor, step: StepTensors) -> torch.Tensor:
        rows, lin = step.state, self.lin
        assert rows is not None, "a linear-attention layer needs the step's State rows"
        channels, value_dim = lin.conv_channels, lin.num_v_heads * lin.v_head_dim
        proj = self.in_proj(x)
        mixed_in = proj[:, :channels]
        z = proj[:, channels : channels + value_dim]
        b = proj[:, channels + value_dim : channels + value_dim + lin.num_v_heads]
        a = proj[:, channels + value_dim + lin.num_v_heads :]
        conv_state, recurrent = self.state_views(rows.region, x.dtype)
        mixed = causal_conv1d(mixed_in, self.conv, conv_state, rows)
        conv_state_store(mixed_in, conv_state, rows)
        chunk = self.prefill_chunk if isinstance(step.info, PrefillInfo) else 0
        if x.dtype == torch.float32:
            chunk = min(chunk, 32)
        o = gated_delta_rule(
            mixed, a, b, self.a_log, self.dt_bias, recurrent, rows, lin.num_k_heads, chunk=chunk
        )
        return self.out_proj(gated_rmsnorm(o, z, self.norm, self.eps))


class GatedAttention:
    """Full attention whose q_proj also emits a per-channel output gate; `prefix` is the
    layer's `...self_attn.`."""

    def __init__(
        self, config: ModelConfig, w: WeightSource, prefix: str, slot: LayerSlot, rotary: Rotary
    ) -> None:
        if config.qkv_bias or config.o_bias:
            raise ValueError("qwen3_5_moe: attention biases have no fast implementation")
        c, h, d = config, config.hidden_size, config.head_dim
        self.config, self.slot, self.rotary = c, slot, rotary
        names = [f"{prefix}{p}_proj.weight" for p in "qkv"]
        self.qkv = linear(w, names, [(2 * c.q_size, h), (c.kv_size, h), (c.kv_size, h)])
        self.o_proj = linear(w, [f"{prefix}o_proj.weight"], [(h, c.q_size)], "out")
        self.q_norm = RMSNorm(w, f"{prefix}q_norm.weight", d, c.norm_eps, unit_offset=True)
        self.k_norm = RMSNorm(w, f"{prefix}k_norm.weight", d, c.norm_eps, unit_offset=True)

    def __call__(self, x: torch.Tensor, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        c, t, d = self.config, x.shape[0], self.config.head_dim
        qs, ks = c.q_size, c.kv_size
        qkv = self.qkv(x)
        q_gate = qkv[:, : 2 * qs].view(t, c.num_heads, 2 * d)
        q, gate = q_gate[:, :, :d], q_gate[:, :, d:]
        k = qkv[:, 2 * qs : 2 * qs + ks].view(t, -1, d)
        v = qkv[:, 2 * qs + ks :].view(t, -1, d)
        group = step.groups[self.slot.group]
        k_cache, v_cache = kv[:, self.slot.index, 0], kv[:, self.slot.index, 1]
        append = (v, k_cache, v_cache, group.slots)
        self.rotary(q, k, step.positions, (self.q_norm, self.k_norm), append)
        pages = PagedKV(k_cache, v_cache, group.page_indptr, group.page_ids, group.page_start)
        info = step.info
        if isinstance(info, DecodeInfo):
            o = decode_attention(
                q, pages, info.seq_lens, scale=c.scale, splits=info.splits, query=info.query,
                q_lens=info.q_lens,
            )  # fmt: skip
        else:
            o = prefill_attention(
                q, pages, info.query_indptr, info.cached_lens, info.block_row, info.block_off,
                scale=c.scale, block_m=info.block_m,
            )  # fmt: skip
        return self.o_proj(o.reshape(t, qs) * torch.sigmoid(gate.reshape(t, qs)))


class SharedGateMoE(MoE):
    """Routed experts plus shared ones weighted by sigmoid(shared_expert_gate(x)) per token:
    the router's always-chosen columns carry that weight instead of 1. The gate is one more
    row of the router's matmul, its sigmoid taken in the routing kernel."""

    def __init__(self, moe: MoE, shared_gate: torch.Tensor) -> None:
        super().__init__(moe.moe, moe.w, moe.act, moe.gemv_max_pairs)
        self.router = torch.cat((self.router, shared_gate.to(self.router.dtype)))

    def route(
        self, x: torch.Tensor, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.to(self.router.dtype), self.router)
        return router_topk(logits, self.moe, None, self.w.shared, gated_shared=True)


class SeparateSharedMoE:
    """The shared expert as its own gated MLP (its width not a multiple of the experts')."""

    def __init__(self, moe: MoE, shared: GatedMLP, shared_gate: torch.Tensor) -> None:
        self.moe, self.shared, self.shared_gate = moe, shared, shared_gate

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(F.linear(x, self.shared_gate))
        return self.moe(x) + gate * self.shared(x)


def shared_expert_moe(
    config: ModelConfig, w: WeightSource, prefix: str, gemv_max_pairs: int
) -> SharedGateMoE | SeparateSharedMoE:
    """The layer's MoE (`prefix`: `...mlp.`) with its gated shared expert."""
    moe = config.moe
    assert moe is not None
    hidden, shared = config.hidden_size, moe.shared_intermediate_size
    experts = qwen_experts(config, w, prefix)
    act = activation_of(config.hidden_act)
    gate = w.get(f"{prefix}shared_expert_gate.weight", (1, hidden))
    if shared % moe.intermediate_size:
        mlp = GatedMLP(w, f"{prefix}shared_expert.", hidden, shared, config.hidden_act)
        return SeparateSharedMoE(MoE(moe, experts, act, gemv_max_pairs), mlp, gate)
    base = f"{prefix}shared_expert."
    gate_up = torch.cat([w.get(f"{base}{p}_proj.weight", (shared, hidden)) for p in ("gate", "up")])
    down = w.get(f"{base}down_proj.weight", (hidden, shared), "out")
    return SharedGateMoE(MoE(moe, experts.with_shared(gate_up, down), act, gemv_max_pairs), gate)


class Qwen3_5Layer:
    def __init__(
        self,
        config: ModelConfig,
        weights: WeightSource,
        prefix: str,
        mixer: GatedDeltaNet | GatedAttention,
        mlp: SharedGateMoE | SeparateSharedMoE,
    ) -> None:
        hidden, eps = config.hidden_size, config.norm_eps
        self.input_norm = RMSNorm(weights, f"{prefix}input_layernorm.weight", hidden, eps, True)
        self.mixer = mixer
        self.post_norm = RMSNorm(
            weights, f"{prefix}post_attention_layernorm.weight", hidden, eps, True
        )
        self.mlp = mlp


class Qwen3_5Moe(FastModel):
    unit_offset_norms = True

    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        if config.moe is None or config.linear_attention is None:
            raise ValueError("qwen3_5_moe needs MoE and linear-attention configs")
        super().__init__(config, weights, options)
        self.layers = []
        for layer, kind in enumerate(config.layer_types):
            prefix = f"model.layers.{layer}."
            mixer: GatedDeltaNet | GatedAttention
            if kind == "linear":
                index = self.slots[layer].index
                mixer = GatedDeltaNet(config, weights, f"{prefix}linear_attn.", index)
            else:
                rotary = self.rotary(layer)
                mixer = GatedAttention(
                    config, weights, f"{prefix}self_attn.", self.slots[layer], rotary
                )
            mlp = shared_expert_moe(config, weights, f"{prefix}mlp.", options.moe_gemv_max_pairs)
            self.layers.append(Qwen3_5Layer(config, weights, prefix, mixer, mlp))

    def state_bytes(self) -> int:
        linear = self.config.layer_types.count("linear")
        return linear * state_layer_bytes(self.config, self.dtype)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for index, layer in enumerate(self.layers):
            if index > 0:
                x, residual = layer.input_norm(x, residual)
            if isinstance(layer.mixer, GatedDeltaNet):
                x = layer.mixer(x, step)
            else:
                x = layer.mixer(x, step, kv)
            x, residual = layer.post_norm(x, residual)
            x = layer.mlp(x)
        x, residual = self.final_norm(x, residual)
        return x
