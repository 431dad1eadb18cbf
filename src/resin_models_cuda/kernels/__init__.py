"""Triton kernels for the CUDA runners: one kernel per file, each with a thin launcher.

Every launcher asserts shapes, strides and dtypes and computes its grid; the kernels assume
what the launcher asserted. All of them run under `TRITON_INTERPRET=1` on CPU (tests use that
when no GPU is present), with float32 / float16 tensors. Every kernel takes a `PDL` constexpr
and starts with `pdl_enter(PDL)`, and every launch passes `**pdl_args()` (`pdl.py`:
programmatic dependent launch; `tests/cuda/test_pdl.py` checks the rule over this folder).
"""

from resin_models_cuda.kernels.activation import silu_and_mul
from resin_models_cuda.kernels.decode_attention import decode_attention, decode_splits
from resin_models_cuda.kernels.kv_append import kv_append
from resin_models_cuda.kernels.paged import PagedKV
from resin_models_cuda.kernels.prefill_attention import prefill_attention, prefill_blocks
from resin_models_cuda.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from resin_models_cuda.kernels.rope import apply_rope, rope_cache
from resin_models_cuda.kernels.sampler import sample_tokens

__all__ = [
    "PagedKV",
    "apply_rope",
    "decode_attention",
    "decode_splits",
    "fused_add_rmsnorm",
    "kv_append",
    "prefill_attention",
    "prefill_blocks",
    "rmsnorm",
    "rope_cache",
    "sample_tokens",
    "silu_and_mul",
]
