"""Quantized checkpoints on the fast runner: a tiny model of each architecture written by the
quantizer in each published format, loaded by the fast runner (FP8 / MXFP4 weights kept
quantized on the device, the quantized kernels) and by the reference runner (dequantized at
load, exactly); the Engine drives both and they produce the same greedy tokens in float32.
Also: what stays quantized, and a DeepSeek-style float32 router on the fast side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from resin import Engine, SamplingParams
from resin_model.presets import TINY
from tests.models.quant_folders import quantized_folder

DEEPSEEK_V3 = {
    **TINY["llama"], "model_type": "deepseek_v3", "num_hidden_layers": 2, "kv_lora_rank": 32,
    "q_lora_rank": None, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_shared_experts": 2,
    "routed_scaling_factor": 1.0,
}  # fmt: skip
CASES = [
    ("llama", "fp8-channel"),
    ("qwen3_moe", "fp8-block"),
    ("gpt_oss", "mxfp4"),
    ("deepseek_v3", "fp8-block"),
]


def _raw(arch: str) -> dict[str, Any]:
    return DEEPSEEK_V3 if arch == "deepseek_v3" else TINY[arch]


def _runners(folder: Path, device: str) -> tuple[Any, Any]:
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.runner import load_runner as fast_runner
    from resin_models_torch.registry import load_runner

    reference = load_runner(folder, device, torch.float32, page_size=4, num_pages=160)
    options = RunnerOptions(page_size=4, max_batch=8, max_context=128, num_pages=160)
    return reference, fast_runner(folder, options, device, torch.float32)


@pytest.mark.parametrize(("arch", "fmt"), CASES, ids=[f"{a}-{f}" for a, f in CASES])
def test_quantized_fast_runner_matches_the_dequantized_reference(
    tmp_path: Path, device: str, arch: str, fmt: str
) -> None:
    _, folder = quantized_folder(_raw(arch), tmp_path, fmt)
    reference, fast = _runners(folder, device)
    _assert_kept_quantized(fast.model, fmt)
    assert _generate(fast) == _generate(reference)


def _generate(runner: Any) -> list[list[int]]:
    """Two batched prompts, one longer than a prefill chunk, greedy (few: the interpreter
    pays per program)."""
    params = SamplingParams(max_output_tokens=3, temperature=0.0, ignore_stop_tokens=True)
    prompts = [[(7 * i + 3) % 256 for i in range(13)], [5, 200, 17, 99, 42]]
    with Engine(runner, context_length=64, prefill_chunk_tokens=8, max_batch_tokens=24,
                max_sequences=4) as engine:  # fmt: skip
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
        return [list(r.take_result()) for r in requests]


def _assert_kept_quantized(model: Any, fmt: str) -> None:
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
    from resin_models_cuda.layers import MoE
    from resin_models_cuda.layers.quantized import Fp8Weight

    layer = model.layers[-1]
    mlp = layer.mlp
    if fmt == "mxfp4":
        assert isinstance(mlp, MoE) and isinstance(mlp.w.gate_up, Mxfp4Experts)
        assert isinstance(mlp.w.down, Mxfp4Experts)
        return
    if isinstance(mlp, MoE):
        assert isinstance(mlp.w.gate_up, Fp8Experts) and isinstance(mlp.w.down, Fp8Experts)
        assert mlp.router.dtype == torch.float32 or mlp.router.dtype == model.dtype
    else:
        assert isinstance(mlp.gate_up.weight, Fp8Weight)
    qkv = getattr(layer.attn, "qkv", None)
    if qkv is not None:
        assert isinstance(qkv.weight, Fp8Weight) and isinstance(layer.attn.o_proj.weight, Fp8Weight)


def test_fast_deepseek_router_reads_the_float32_bias(tmp_path: Path, device: str) -> None:
    """A checkpoint's float32 correction bias that bf16 would round (so that experts 1 and 2
    beat 0): the bf16 fast model keeps it float32 and routes as float32 does."""
    from safetensors.torch import load_file, save_file

    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.runner import load_runner as fast_runner
    from tests.models.quant_folders import source_folder

    folder = source_folder(DEEPSEEK_V3, tmp_path / "v3")
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.gate."
    hidden = DEEPSEEK_V3["hidden_size"]
    logits = torch.tensor([0.0, 2**-8, 2**-9, 0.0])
    tensors[name + "weight"] = (logits[:, None].expand(4, hidden) / hidden).contiguous()
    tensors[name + "e_score_correction_bias"] = torch.tensor([1.0 + 2**-9, 1.0, 1.0, -1.0])
    save_file(tensors, str(folder / "model.safetensors"))
    options = RunnerOptions(page_size=4, max_batch=4, max_context=64, num_pages=16)
    model = fast_runner(folder, options, device, torch.bfloat16).model
    moe = model.layers[1].mlp
    assert moe.w.score_bias.dtype == torch.float32
    assert moe.w.score_bias[0].item() == 1.0 + 2**-9
    _, experts = moe.route(torch.ones(1, hidden, dtype=torch.bfloat16, device=device))
    assert sorted(experts[0, :2].tolist()) == [0, 1]


def test_random_weights_quantized_on_the_device(device: str) -> None:
    """The benchmark's quantized random models (`random_runner(..., quantize=FMT)`): FP8 MoE
    experts per expert as published FP8 checkpoints store them (GLM-4.5-Air's shared expert
    too), and the device bytes near the stored format's (`checkpoint_bytes`; tiny models'
    norms and biases are a larger share than real ones')."""
    from resin_model.hf_config import parse_config
    from resin_model.presets import checkpoint_bytes
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.runner import random_runner

    options = RunnerOptions(page_size=4, max_batch=2, max_context=32, num_pages=8)
    cases = (("llama", "fp8-channel"), ("qwen3_moe", "fp8-block"), ("gpt_oss", "mxfp4"),
             ("glm4_moe", "fp8-block"))  # fmt: skip
    for arch, fmt in cases:
        config = parse_config(TINY[arch])
        model = random_runner(config, options, device, torch.float32,
                              quantize=fmt).model  # type: ignore[arg-type]  # fmt: skip
        assert model.config.quant is not None
        _assert_kept_quantized(model, fmt)
        if arch == "glm4_moe":  # the shared expert folded into the FP8 stack
            assert model.layers[-1].mlp.w.shared == 1
        stored = checkpoint_bytes(model.config, 4)
        assert 0.9 < model.nbytes() / stored < 1.25, (arch, model.nbytes(), stored)


def test_fused_and_sliced_fp8_weights_keep_their_exact_values() -> None:
    """Parts fused by rows (per-tensor scales become one per row) and a block weight cut at
    rows and columns off its 128 blocks (scales repeated into finer blocks) dequantize to
    exactly the original values."""
    from resin_model.quant import dequantize_fp8, quantize_fp8
    from resin_models_cuda.layers.quantized import Fp8Weight, Linear, cat_fp8, slice_fp8

    torch.manual_seed(0)
    parts, dense = [], []
    for n in (64, 32, 32):
        q, s = quantize_fp8(torch.randn(n, 48), (n, 48))
        parts.append(Fp8Weight(q, s, (n, 48)))
        dense.append(dequantize_fp8(q, s, (n, 48)))
    fused = Linear(cat_fp8(parts)).weight
    assert isinstance(fused, Fp8Weight) and fused.block == (1, 48)
    assert torch.equal(dequantize_fp8(fused.w, fused.scale, fused.block), torch.cat(dense))
    q, s = quantize_fp8(torch.randn(300, 256), (128, 128))
    whole = dequantize_fp8(q, s, (128, 128))
    for start, size in ((0, 96), (96, 96), (192, 64)):
        cols = slice_fp8(Fp8Weight(q, s, (128, 128)), 1, start, size)
        rows = slice_fp8(Fp8Weight(q, s, (128, 128)), 0, start, size)
        assert torch.equal(dequantize_fp8(cols.w, cols.scale, cols.block),
                           whole[:, start : start + size])  # fmt: skip
        assert torch.equal(dequantize_fp8(rows.w, rows.scale, rows.block),
                           whole[start : start + size])  # fmt: skip
