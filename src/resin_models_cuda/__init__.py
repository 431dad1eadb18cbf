"""Optimized NVIDIA GPU runners: a fast layer library (`layers/`), model files on it
(`models/`), Triton kernels (`kernels/`), CUDA graphs.

`CudaRunner(model, RunnerOptions(...))` runs any architecture its registry
(`resin_models_cuda.architectures`) gives a fast model: Llama family (Llama 2/3, Mistral,
Qwen2/3, SmolLM2), Qwen3-MoE, Gemma 3, gpt-oss, OLMo 2. `load_runner(folder)` builds one from a
Hugging Face checkpoint, `random_runner(config)` from random weights (say of a
`resin_model.presets` shape).
Importing this package imports torch and triton; `resin` itself never imports it.
"""

from resin_models_cuda.architectures import build_model
from resin_models_cuda.models import BuildOptions, FastModel
from resin_models_cuda.runner import CudaRunner, RunnerOptions, load_runner, random_runner

__all__ = [
    "BuildOptions",
    "CudaRunner",
    "FastModel",
    "RunnerOptions",
    "build_model",
    "load_runner",
    "random_runner",
]
