"""The fast layer library: each layer is a plain class holding its (fused) weights, whose
call launches Triton kernels or cuBLAS matmuls with no host sync (graph-safe). Model files in
`resin_models_cuda.models` compose them; see docs/gpu.md for the map."""

from resin_models_cuda.layers.attention import Attention
from resin_models_cuda.layers.mlp import GatedMLP, activation_of
from resin_models_cuda.layers.moe import ExpertWeights, MoE
from resin_models_cuda.layers.norm import RMSNorm
from resin_models_cuda.layers.rotary import Rotary
from resin_models_cuda.layers.weights import (
    RandomWeights,
    SafetensorsWeights,
    StateDictWeights,
    WeightSource,
)

__all__ = [
    "Attention",
    "ExpertWeights",
    "GatedMLP",
    "MoE",
    "RMSNorm",
    "RandomWeights",
    "Rotary",
    "SafetensorsWeights",
    "StateDictWeights",
    "WeightSource",
    "activation_of",
]
