"""Qwen2.5-VL (`model_type` "qwen2_5_vl"): a Qwen2 text model whose rotary positions are
three-dimensional (M-RoPE), and a ViT over 14x14 patches with 2-D rotary positions, windowed
attention in most blocks (full attention in `full_layers`) and a merger that folds each 2x2
block of patches into one text-width token.

M-RoPE: text at sequence position p rotates with (p, p, p) + shift; the tokens of an image of
merged grid (1, h, w) starting at s get (s + shift, s + shift + row, s + shift + col), and the
text after it continues at s + shift + max(h, w), so every image moves later text by
max(h, w) - h*w. Head-dim frequency sections `mrope_section` take the t, h and w positions
respectively. Stills only: a video item (t > 1) is refused.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from resin.plan import BatchPlan, MediaItem
from resin_model.config import ModelConfig, VisionConfig
from resin_model.nn import RMSNorm
from resin_models_torch.batch import StepContext
from resin_models_torch.layers import Float32Buffers, GatedMLP, apply_rotary
from resin_models_torch.llama import LlamaForCausalLM


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)
        q, k = apply_rotary(q.float(), cos, sin), apply_rotary(k.float(), cos, sin)
        q, k, v = (t.to(x.dtype).transpose(0, 1) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out: torch.Tensor = self.proj((probs @ v).transpose(0, 1).reshape(n, -1))
        return out


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size, 1e-6)
        self.norm2 = RMSNorm(config.hidden_size, 1e-6)
        self.attn = VisionAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, "silu", bias=True)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, allowed)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchEmbed(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p, tp = config.patch_size, config.temporal_patch_size
        self.proj = nn.Conv3d(3, config.hidden_size, (tp, p, p), (tp, p, p), bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # A convolution whose kernel covers the whole patch is a matrix product.
        weight = self.proj.weight.view(self.proj.weight.shape[0], -1)
        return patches.to(weight.dtype) @ weight.T


class Merger(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        width = config.hidden_size * config.merge_size**2
        self.ln_q = RMSNorm(config.hidden_size, 1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, width), nn.GELU(), nn.Linear(width, config.out_hidden_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.ln_q(x).view(-1, self.mlp[0].in_features))
        return out


def _layout(config: VisionConfig, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one still of h x w patches: (row, col) of every patch in input order (merge blocks
    contiguous), the window order of merge units, and each unit's window id in that order."""
    m = config.merge_size
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = (h // m, m, w // m, m)
    pos_h = rows.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    pos_w = cols.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    side = config.window_size // m // config.patch_size
    unit_r, unit_c = np.divmod(np.arange((h // m) * (w // m)), w // m)
    window = (unit_r // side) * (-(-(w // m) // side)) + unit_c // side
    order = np.lexsort((unit_c, unit_r, window))  # by window, row-major inside
    return np.stack([pos_h, pos_w]), order, window[order]


class Qwen25VisionTower(Float32Buffers):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.num_layers))
        self.merger = Merger(config)
        sd = config.hidden_size // config.num_heads // 2
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, sd, 2, dtype=torch.float) / sd))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, patches: torch.Tensor, h: int, w: int) -> torch.Tensor:
        unit = self.config.merge_size**2
        positions, order, window = _layout(self.config, h, w)
        perm = torch.from_numpy((order[:, None] * unit + np.arange(unit)).reshape(-1))
        perm = perm.to(patches.device)
        x = self.patch_embed(patches)[perm]
        pos = torch.from_numpy(positions).to(patches.device)[:, perm].float()
        freqs = torch.cat([pos[0, :, None] * self.inv_freq, pos[1, :, None] * self.inv_freq], -1)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        win = torch.from_numpy(np.repeat(window, unit)).to(patches.device)
        local = win[:, None] == win[None, :]
        everything = torch.ones_like(local)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, everything if i in self.config.full_layers else local)
        merged = self.merger(x)
        return merged[torch.from_numpy(np.argsort(order)).to(patches.device)]


class Qwen2_5_VLForConditionalGeneration(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        assert config.vision is not None, "qwen2_5_vl needs a vision_config"
        self.vision = config.vision
        self.visual = Qwen25VisionTower(config.vision)

    def encode_media(self, item: MediaItem) -> torch.Tensor:
        t, h, w = item.grid_thw
        m = self.vision.merge_size
        if t != 1:
            raise ValueError("the Qwen2.5-VL reference runner takes still images, not videos")
        if item.length != h * w // (m * m) or item.data.shape[0] != h * w:
            raise ValueError(f"item of {item.length} tokens does not fit grid {item.grid_thw}")
        data = torch.from_numpy(item.data.copy()).to(self.inv_device)
        return self.visual(data, h, w)

    @property
    def inv_device(self) -> torch.device:
        return self.visual.inv_freq.device

    def rope_positions(self, plan: BatchPlan) -> np.ndarray:
        """[3, T] M-RoPE positions of the plan's query tokens (see module docstring)."""
        out = np.repeat(plan.positions[None].astype(np.int64), 3, axis=0)
        m = self.vision.merge_size
        for row in range(plan.num_sequences):
            lo, hi = int(plan.query_indptr[row]), int(plan.query_indptr[row + 1])
            seq = plan.positions[lo:hi].astype(np.int64)
            shift = np.zeros(hi - lo, dtype=np.int64)
            for item in (i for i in plan.media if i.row == row):
                _, gh, gw = item.grid_thw
                h, w = gh // m, gw // m
                inside = (seq >= item.position) & (seq < item.end)
                j = seq[inside] - item.position
                base = item.position + shift[inside]
                out[:, lo:hi][0, inside] = base
                out[:, lo:hi][1, inside] = base + j // w
                out[:, lo:hi][2, inside] = base + j % w
                shift[seq >= item.end] += max(h, w) - item.length
            after_text = np.ones(hi - lo, dtype=bool)
            for item in (i for i in plan.media if i.row == row):
                after_text &= ~((seq >= item.position) & (seq < item.end))
            out[:, lo:hi][:, after_text] = (seq + shift)[after_text]
        return out

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_with_media(input_ids, ctx)
        if ctx.media is not None and ctx.media.rope_positions is not None:
            cos, sin = self._mrope(ctx.media.rope_positions)
        else:
            cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out

    def _mrope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.rotary.inv_freq.float()  # [3, T, D/2]
        parts = freqs.split(list(self.vision.mrope_section), dim=-1)
        chosen = torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1)
        emb = torch.cat([chosen, chosen], dim=-1)
        return emb.cos(), emb.sin()
