"""The SigLIP vision tower (as Gemma 3 uses it: no pooling head): patch convolution plus
learned position embeddings, pre-norm encoder layers with biased full attention and a GELU-tanh
MLP, a final LayerNorm. Hugging Face parameter names (`embeddings.*`, `encoder.layers.*`,
`post_layernorm`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.config import VisionConfig
from resin_model.nn import activation


class SiglipAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.heads = config.num_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, hidden = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, -1).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = (q @ k.transpose(-1, -2)) * (hidden // self.heads) ** -0.5
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out: torch.Tensor = self.out_proj((probs @ v).transpose(1, 2).reshape(b, n, hidden))
        return out


class SiglipMLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class SiglipLayer(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.self_attn = SiglipAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SiglipMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class SiglipEmbeddings(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.patch_embedding = nn.Conv2d(3, config.hidden_size, kernel_size=p, stride=p)
        patches = (config.image_size // p) ** 2
        self.position_embedding = nn.Embedding(patches, config.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        out: torch.Tensor = x.flatten(2).transpose(1, 2) + self.position_embedding.weight
        return out


class SiglipEncoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(config) for _ in range(config.num_layers))


class SiglipVisionTower(nn.Module):
    """pixels [B, 3, S, S] -> patch features [B, (S / patch)^2, hidden]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        out: torch.Tensor = self.post_layernorm(x)
        return out


def avg_pool_tokens(features: torch.Tensor, tokens_per_image: int) -> torch.Tensor:
    """[B, P*P, C] -> [B, tokens_per_image, C] by average pooling over the patch grid."""
    b, n, c = features.shape
    side = math.isqrt(n)
    kernel = side // math.isqrt(tokens_per_image)
    grid = features.transpose(1, 2).reshape(b, c, side, side)
    return F.avg_pool2d(grid, kernel_size=kernel, stride=kernel).flatten(2).transpose(1, 2)
