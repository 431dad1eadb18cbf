"""Optimized NVIDIA GPU runners: Triton kernels, CUDA graphs.

`CudaRunner(config, weights, RunnerOptions(...))` runs Llama-family models (Llama 3, Qwen2/3,
Mistral, SmolLM2) and Qwen3-MoE; `build_runner` makes one from a preset name with random
weights or from a Hugging Face checkpoint directory. Importing this package imports torch and
triton; `resin` itself never imports it.
"""

from resin_models_cuda.config import PRESETS, ModelConfig, preset
from resin_models_cuda.runner import CudaRunner, RunnerOptions
from resin_models_cuda.weights import ModelWeights, load_checkpoint, random_weights

__all__ = [
    "PRESETS",
    "CudaRunner",
    "ModelConfig",
    "ModelWeights",
    "RunnerOptions",
    "load_checkpoint",
    "preset",
    "random_weights",
]
